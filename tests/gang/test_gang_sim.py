"""Gang mode (dl2ray.gang): packing, locality, interference, fragmentation by hand; the rules
(all or nothing, no preemption) enforced; invariants of every gang scheduler; determinism."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gang_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl2ray.config import InterferenceConfig
from dl2ray.gang.sim import (
    GangSimulator,
    fragmentation_index,
    gang_packing,
    locality_factor,
    pairwise_interference,
)
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import AllocationError
from dl2ray.view import Allocation, JobPlacement, Observation, Tasks
from dl2ray.world import build_simulator

GANG_SCHEDULERS = ["sif", "dsif", "saf", "lrf", "spf", "fifo-gang"]


def test_gang_packing_fullest_fitting_server_then_spills_from_the_emptiest():
    assert gang_packing(np.array([8, 3, 5]), 3) == (1, 1, 1)  # fewest free that fits
    assert gang_packing(np.array([8, 3, 5]), 5) == (2,) * 5
    # nothing holds 10: all 8 of node 0, then the 2 left on the fullest that fits (node 1)
    assert gang_packing(np.array([8, 3, 5]), 10) == (0,) * 8 + (1, 1)
    assert gang_packing(np.array([1, 1]), 3) is None


def test_locality_factor_matches_sched2_fig1():
    # 4 GPUs on two servers vs one: VGG16 5.9x with beta 4.9; one server: no slowdown
    assert locality_factor(4.9, 2) == pytest.approx(5.9)
    assert locality_factor(1.7, 1) == 1.0
    assert locality_factor(1.0, 4) == pytest.approx(1 + 2 * 3 / 4)


def test_fragmentation_index_by_hand():
    # server 0: 4 of 8 GPUs busy with equal remaining time -> 1 - 16/(8*4) = 0.5; server 1 idle
    assert fragmentation_index([[10.0] * 4, []], np.array([8.0, 8.0])) == pytest.approx(0.25)
    assert fragmentation_index([[5.0] * 8], np.array([8.0])) == pytest.approx(0.0)


def test_pairwise_interference_by_hand():
    cfg = InterferenceConfig(
        kappa=(1.0, 0.0, 2.0, 0.0), eta=2.0, contention={"a": (0.5, 0, 0.5, 0), "b": (1.0, 0, 0, 0)}
    )
    pl = {1: JobPlacement((0, 1), (0,)), 2: JobPlacement((0,), ()), 3: JobPlacement((2,), ())}
    got = pairwise_interference(pl, {1: "a", 2: "b", 3: "b"}, cfg)
    # job 1 on node 0 meets one task of b: 1 + 1*0.5*1.0 = 1.5 -> 1.5^-2; on node 1 alone: 1
    assert got[1] == pytest.approx(1.5**-2)
    # job 2 meets two tasks of a: 1 + 1*1.0*(2*0.5) = 2 -> 0.25; job 3 alone
    assert got[2] == pytest.approx(0.25)
    assert got[3] == pytest.approx(1.0)


def _sim(cfg, jobs):
    return build_simulator(cfg, gang_trace(cfg.catalogue, jobs))


def test_all_or_nothing_and_no_preemption(sched2_cfg):
    sim = _sim(sched2_cfg, [(5, 0, 600.0, 2), (5, 0, 600.0, 1)])
    assert isinstance(sim, GangSimulator)
    view = sim.reset(0)
    assert view.job(0).fixed_tasks == Tasks(2, 0)
    with pytest.raises(AllocationError, match="exactly"):
        sim.step(Allocation({0: Tasks(1, 0)}))
    view = sim.step(Allocation({0: Tasks(2, 0)})).view
    assert view.job(0).worker_nodes and view.job(0).workers == 2
    with pytest.raises(AllocationError, match="never preempts"):
        sim.step(Allocation({}))
    moved = Allocation({0: Tasks(2, 0)}, {0: JobPlacement((2, 2), ())})
    with pytest.raises(AllocationError, match="never preempts"):
        sim.step(moved)


def test_ideal_time_and_locality_slowdown(sched2_cfg):
    # a 600-s transformer (beta 1.7) on one server ends after 10 slots; spread over two, 2.7x longer
    sim = _sim(sched2_cfg, [(5, 0, 600.0, 4)])
    sim.reset(0)
    while not sim.done:
        sim.step(Allocation({0: Tasks(4, 0)}, {0: JobPlacement((0, 0, 0, 0), ())}))
    assert sim.result.jct[0] == pytest.approx(10.0)
    assert sim.result.extra_metrics()["effectiveness"] == pytest.approx(1.0)
    sim.reset(0)
    while not sim.done:
        sim.step(Allocation({0: Tasks(4, 0)}, {0: JobPlacement((0, 0, 1, 1), ())}))
    assert sim.result.jct[0] == pytest.approx(27.0)
    assert sim.result.extra_metrics()["effectiveness"] == pytest.approx(1 / 2.7)


def test_fragmentation_per_slot_and_latest_observation_by_hand(sched2_cfg):
    # 600-s (2 GPUs) and 300-s (1 GPU) transformers on server 0 of 3 (4 GPUs each), 60-s slots: after slot k
    # server 0 holds x = (a, a, b, 0) with a = 600 - 60(k+1), b = 300 - 60(k+1); b ends in slot 4, a in slot 9
    # (a finishing job lists no x); the two idle servers count 0
    sim = _sim(sched2_cfg, [(5, 0, 600.0, 2), (5, 0, 300.0, 1)])
    sim.reset(0)
    alloc = Allocation({0: Tasks(2, 0), 1: Tasks(1, 0)},
                       {0: JobPlacement((0, 0), ()), 1: JobPlacement((0,), ())})
    batches = 60.0 / sim.catalogue.types[5].compute_s  # one slot of a job that runs alone
    for slot in range(9):
        view = sim.step(alloc).view
        # only the latest observation, no loss
        assert view.job(0).history == (Observation(slot, 0, 2, pytest.approx(batches), 60.0, 0.0),)
        if slot == 4:  # job 1 completed
            alloc = Allocation({0: Tasks(2, 0)}, {0: JobPlacement((0, 0), ())})
    sim.step(alloc)
    assert sim.done

    def index(xs):
        return (1 - sum(xs) ** 2 / (4 * sum(x * x for x in xs))) / 3

    want = [index([600 - 60 * k, 600 - 60 * k, 300 - 60 * k]) for k in range(1, 5)]
    want += [index([600 - 60 * k, 600 - 60 * k]) for k in range(5, 10)]
    assert sim.result.fragmentation == pytest.approx(want)
    assert sim.result.jct == pytest.approx({0: 10.0, 1: 5.0})


job_st = st.tuples(
    st.integers(0, 5), st.integers(0, 5), st.floats(60.0, 900.0), st.sampled_from([1, 1, 2, 3, 4, 6, 8])
)


def _check(view, alloc, before, ps=False):
    jobs = {j.job_id: j for j in view.jobs}
    assert set(alloc.tasks) <= set(jobs), "allocated a job not arrived or already completed"
    usage = np.zeros_like(view.capacity)
    for job_id, t in alloc.tasks.items():
        job = jobs[job_id]
        assert job.arrival_slot <= view.slot
        assert t == job.fixed_tasks, "gang: the whole job or nothing"
        pl = alloc.placement[job_id]
        assert (len(pl.worker_nodes), len(pl.ps_nodes)) == tuple(t)
        for node in pl.worker_nodes:
            usage[node] += job.worker_demand
        for node in pl.ps_nodes:
            usage[node] += job.ps_demand
    assert np.all(usage <= view.capacity + 1e-9), "node capacity exceeded"
    for job_id, nodes in before.items():  # non-preemption: running jobs keep their nodes
        if job_id in jobs:
            pl = alloc.placement[job_id]
            assert (sorted(pl.worker_nodes), sorted(pl.ps_nodes)) == nodes


def run_checked(sim, sched, seed):
    view = sim.reset(seed)
    if hasattr(sched, "reset"):
        sched.reset(seed)
    completed, before = [], {}
    while not sim.done:
        alloc = sched.decide(view)
        _check(view, alloc, before)
        before = {j: (sorted(pl.worker_nodes), sorted(pl.ps_nodes)) for j, pl in alloc.placement.items()}
        step = sim.step(alloc)
        completed += step.completed
        view = step.view
    assert sorted(completed) == sorted(j.job_id for j in sim.trace), "not all completed once"
    return sim.result.jct


run_checked_ps = run_checked  # PS jobs (Harmony) are checked by the same rules


@pytest.mark.parametrize("name", GANG_SCHEDULERS)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(jobs=st.lists(job_st, min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_gang_scheduler_invariants(name, sched2_cfg, jobs, seed):
    sched = make_scheduler(name, sched2_cfg)
    jct = run_checked(_sim(sched2_cfg, jobs), sched, seed)
    assert run_checked(_sim(sched2_cfg, jobs), sched, seed) == jct


def test_gang_baselines_refuse_a_dl2_config(testbed):
    from dl2ray.errors import UserError

    with pytest.raises(UserError, match="gang"):
        make_scheduler("sif", testbed)


def test_philly_trace_is_deterministic_and_resampled(sched2_cfg):
    from dl2ray.gang.trace import gang_trace as draw

    workload = sched2_cfg.workload.model_copy(update={"num_jobs": 2000})
    cfg = sched2_cfg.model_copy(update={"workload": workload})
    a, b = draw(cfg, 3_000_000), draw(cfg, 3_000_000)
    assert a == b
    share = np.mean([j.workers == 1 for j in a])
    assert share == pytest.approx(0.68, abs=0.03)
    assert all(j.ps == 0 and 1 <= j.workers <= cfg.gang.max_gpus for j in a)
