"""The simulator against hand-computed values, and its validation of allocations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import small_config

from dl2ray.measurements import load_surfaces
from dl2ray.sim import AllocationError, Simulator, run_episode, write_events
from dl2ray.speed import SpeedModel
from dl2ray.view import Allocation, JobPlacement, Tasks
from dl2ray.workload import JobSpec

RESNET_11 = 15.783  # measured speed of resnet-50 at 1 PS, 1 worker (batches/s)


def _sim(cfg, trace, **kw):
    return Simulator(cfg, SpeedModel(cfg.catalogue, load_surfaces(cfg.surfaces_dir)), trace, **kw)


def _spread(job_id: int) -> Allocation:
    return Allocation({job_id: Tasks(1, 1)}, {job_id: JobPlacement((0,), (1,))})


def test_single_job_progress_reward_and_fractional_completion(testbed):
    trace = (JobSpec(0, "resnet-50", 0, true_epochs=400.0, est_epochs=500.0),)
    sim = _sim(testbed, trace)
    sim.reset(0)
    per_slot = RESNET_11 * 1200 / 115  # epochs per slot, spread layout: factor 1
    r0 = sim.step(_spread(0))
    assert r0.epochs[0] == pytest.approx(per_slot, rel=1e-4)
    assert r0.reward == pytest.approx(per_slot / 500.0, rel=1e-4)
    sim.step(_spread(0))
    r2 = sim.step(_spread(0))
    assert r2.done and r2.completed == (0,)
    expected_end = 2 + (400.0 - 2 * per_slot) / per_slot
    assert sim.result.jct[0] == pytest.approx(expected_end, rel=1e-4)
    assert sim.result.first_run == {0: 0}


def test_no_progress_without_ps_and_utilisation_counts_tasks(testbed):
    trace = (JobSpec(0, "resnet-50", 0, 100.0, 100.0),)
    sim = _sim(testbed, trace)
    sim.reset(0)
    step = sim.step(Allocation({0: Tasks(2, 0)}))
    assert step.epochs == {} and step.reward == 0.0
    assert sim.result.gpu_util[0] == pytest.approx(2 / 26)
    assert step.view.jobs[0].workers == 2 and step.view.jobs[0].slots_run == 0


def test_jobs_appear_at_their_arrival_slot(testbed):
    trace = (JobSpec(0, "wlm", 0, 50.0, 50.0), JobSpec(1, "dssm", 2, 50.0, 50.0))
    sim = _sim(testbed, trace)
    view = sim.reset(0)
    assert [j.job_id for j in view.jobs] == [0]
    with pytest.raises(AllocationError, match="job 1 is not arrived"):
        sim.step(Allocation({1: Tasks(1, 1)}))
    sim.step(Allocation.empty())
    view = sim.step(Allocation.empty()).view
    assert [j.job_id for j in view.jobs] == [0, 1]


def test_caps_and_capacity_are_enforced_naming_job_and_node(testbed):
    trace = (JobSpec(7, "resnet-50", 0, 100.0, 100.0),)
    sim = _sim(testbed, trace)
    sim.reset(0)
    with pytest.raises(AllocationError, match=r"job 7 \(resnet-50\).*caps are 12 / 16"):
        sim.step(Allocation({7: Tasks(13, 1)}))
    crowded = Allocation({7: Tasks(3, 1)}, {7: JobPlacement((4, 4, 4), (0,))})
    with pytest.raises(AllocationError, match="node 4 over gpu capacity"):
        sim.step(crowded)
    wrong = Allocation({7: Tasks(2, 1)}, {7: JobPlacement((4,), (0,))})
    with pytest.raises(AllocationError, match="placement lists 1 workers"):
        sim.step(wrong)
    too_many = Allocation({7: Tasks(12, 12)})
    cfg = small_config(cluster={"nodes": [{"count": 2}]})
    sim2 = _sim(cfg, trace)
    sim2.reset(0)
    with pytest.raises(AllocationError, match="job 7: no node can host"):
        sim2.step(too_many)


def test_completed_job_cannot_be_allocated(testbed):
    trace = (JobSpec(0, "wlm", 0, 1.0, 1.0), JobSpec(1, "wlm", 5, 1e6, 1e6))
    sim = _sim(testbed, trace)
    sim.reset(0)
    sim.step(_spread(0))
    with pytest.raises(AllocationError, match="job 0 is completed"):
        sim.step(_spread(0))


def test_checkpoint_restart_cost_slows_a_changing_job():
    trace = (JobSpec(0, "resnet-50", 0, 1e6, 1e6),)
    changes = [Tasks(1, 1), Tasks(2, 2), Tasks(1, 1), Tasks(2, 2)]
    done = {}
    for mode in ("none", "checkpoint_restart"):
        cfg = small_config(sim={"change_cost": mode, "checkpoint_restart_s": 300.0})
        sim = _sim(cfg, trace)
        sim.reset(0)
        for t in changes:
            sim.step(Allocation({0: t}))
        done[mode] = sim.view().jobs[0].done_epochs
        obs = sim.view().jobs[0].history
        if mode == "checkpoint_restart":
            assert [o.seconds for o in obs] == [1200.0, 900.0, 900.0, 900.0]
    assert done["checkpoint_restart"] < done["none"]


def test_same_seed_same_run_and_noise_depends_on_seed():
    cfg = small_config(speed={"variation": 0.2}, workload={"num_jobs": 8})
    from dl2ray.schedulers.drf import DRF

    sim = _sim(cfg, None)
    a = run_episode(sim, DRF(), 3).jct
    b = run_episode(sim, DRF(), 3).jct
    c = run_episode(sim, DRF(), 4).jct
    assert a == b
    assert a != c


def test_loss_curve_reaches_convergence_gap_at_completion(testbed):
    cfg = small_config(sim={"loss_noise": 0.0})
    trace = (JobSpec(0, "wlm", 0, 3000.0, 3000.0),)
    sim = _sim(cfg, trace)
    sim.reset(0)
    while not sim.done:
        sim.step(_spread(0))
    last = sim.finished[0].history[-1]
    losses = [o.loss for o in sim.finished[0].history]
    assert all(a > b for a, b in itertools.pairwise(losses))
    gap0 = 1.0  # l(0) - floor
    assert last.loss - 0.1 == pytest.approx(cfg.sim.convergence_gap * gap0, rel=1e-6)


def test_event_log_round_trips_through_parquet(tmp_path, testbed):
    import pyarrow.parquet as pq

    trace = (JobSpec(0, "wlm", 0, 2000.0, 2000.0),)
    sim = _sim(testbed, trace, record_events=True)
    sim.reset(0)
    while not sim.done:
        sim.step(_spread(0))
    write_events(str(tmp_path / "ev.parquet"), sim.result)
    table = pq.read_table(tmp_path / "ev.parquet").to_pydict()
    assert table["slot"] == list(range(sim.result.slots))
    assert table["completed"][-1] is True
    assert sum(table["epochs"]) == pytest.approx(2000.0)


def test_views_are_read_only_and_hide_true_lengths(testbed):
    trace = (JobSpec(0, "wlm", 0, 200.0, 300.0),)
    view = _sim(testbed, trace).reset(0)
    job = view.jobs[0]
    assert job.est_epochs == 300.0 and not hasattr(job, "true_epochs")
    with pytest.raises(ValueError):
        view.capacity[0, 0] = 99.0
    assert np.array_equal(view.free, view.capacity)
