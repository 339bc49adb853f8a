"""The information model of the simulator against hand-computed values: per-job speed factors,
co-location interference, the cost of a scale change; and the paired ratios of a comparison."""

from __future__ import annotations

import numpy as np
import pytest
from support import small_config

from dl2ray.evaluation.comparison import Comparison, RunOutcome
from dl2ray.measurements import load_surfaces
from dl2ray.sim import Change, Simulator, _train
from dl2ray.speed import (
    SpeedModel,
    analytic_iteration_time,
    deviation_divisor,
    job_factors,
    layout_of,
    spread_layout,
)
from dl2ray.view import Allocation, JobPlacement, Tasks
from dl2ray.workload import JobSpec
from dl2ray.world import build_simulator

BIG = 1e9  # epochs: no job finishes in these tests


def _sim(cfg, trace):
    return Simulator(cfg, SpeedModel(cfg.catalogue, load_surfaces(cfg.surfaces_dir)), trace)


def _epochs(cfg, trace, allocations, seed=0):
    sim = _sim(cfg, trace)
    sim.reset(seed)
    return [sim.step(a).epochs for a in allocations], sim


def test_job_factors_are_the_jobs_own_and_reproducible():
    a = job_factors(5, 3, 0.2)
    assert a == job_factors(5, 3, 0.2)  # same run seed and job: same job
    assert a != job_factors(5, 4, 0.2) and a != job_factors(6, 3, 0.2)
    assert all(0.8 <= f <= 1.2 for f in a)
    assert job_factors(5, 3, 0.0) == (1.0, 1.0)
    assert deviation_divisor(0.25, (2.0, 4.0)) == pytest.approx(0.25 * 2.0 + 0.75 * 4.0)


def test_a_deviating_job_trains_at_its_type_speed_over_its_factors(testbed):
    cfg = small_config(speed={"job_deviation": 0.3})
    trace = (JobSpec(4, "resnet-50", 0, BIG, BIG),)
    alloc = Allocation({4: Tasks(1, 2)}, {4: JobPlacement((0,), (1, 2))})
    (epochs,), _ = _epochs(cfg, trace, [alloc], seed=11)
    (plain,), _ = _epochs(testbed, trace, [alloc], seed=11)
    jt = cfg.catalogue.get("resnet-50")
    phi = jt.compute_s / analytic_iteration_time(jt, layout_of((0,), (1, 2)))
    assert epochs[4] == pytest.approx(plain[4] / deviation_divisor(phi, job_factors(11, 4, 0.3)), rel=1e-12)


def test_the_best_ps_count_differs_between_jobs_of_a_type():
    """Separate compute and communication factors change the shape of a job's speed curve, not only its
    scale: the speed-up from a second PS differs between two jobs of one type."""
    cfg = small_config(speed={"job_deviation": 0.4})
    speed = SpeedModel(cfg.catalogue, load_surfaces(cfg.surfaces_dir))
    t = cfg.catalogue.index("vgg-16")
    gains = []
    for job_id in range(6):
        f = job_factors(0, job_id, 0.4)
        one, two = spread_layout(2, 1), spread_layout(2, 2)
        v1 = speed.batches_per_second(t, one) / deviation_divisor(speed.compute_fraction(t, one), f)
        v2 = speed.batches_per_second(t, two) / deviation_divisor(speed.compute_fraction(t, two), f)
        gains.append(v2 / v1)
    assert max(gains) - min(gains) > 0.02


def test_interference_slows_a_job_by_its_busiest_nodes_foreign_share():
    cfg = small_config(speed={"interference": 0.3})
    trace = (JobSpec(0, "wlm", 0, BIG, BIG), JobSpec(1, "wlm", 0, BIG, BIG))
    # job 0: worker on node 0, PS on node 1; job 1: worker + PS on node 1 (4 of node 1's 8 cores)
    together = Allocation({0: Tasks(1, 1), 1: Tasks(1, 1)},
                          {0: JobPlacement((0,), (1,)), 1: JobPlacement((1,), (1,))})
    alone = Allocation({0: Tasks(1, 1)}, {0: JobPlacement((0,), (1,))})
    (shared,), _ = _epochs(cfg, trace, [together])
    (solo,), _ = _epochs(cfg, trace, [alone])
    # node 1 holds job 1's worker (2 cores, 1 GPU) and PS (2 cores): foreign dominant share = GPU 1/2
    assert shared[0] == pytest.approx(solo[0] * (1 - 0.3 * 0.5), rel=1e-12)


def test_hot_scale_up_keeps_the_old_deployment_training_while_new_tasks_start():
    cfg = small_config(sim={"change_cost": "hot", "hot_scaling_s": 2.0, "task_start_s": 100.0})
    trace = (JobSpec(0, "resnet-50", 0, BIG, BIG),)
    a11 = Allocation({0: Tasks(1, 1)}, {0: JobPlacement((0,), (1,))})
    a22 = Allocation({0: Tasks(2, 2)}, {0: JobPlacement((0, 2), (1, 3))})
    a21 = Allocation({0: Tasks(2, 1)}, {0: JobPlacement((0, 2), (1,))})
    steps, sim = _epochs(cfg, trace, [a11, a11, a22, a21])
    free, _ = _epochs(small_config(), trace, [a11, a11, a22, a21])
    r11, r22, r21 = free[1][0] / 1200, free[2][0] / 1200, free[3][0] / 1200  # epochs/s of each deployment
    assert steps[0][0] == pytest.approx(r11 * (1200 - 100))  # the first start: every task starts
    assert steps[1][0] == pytest.approx(r11 * 1200)  # unchanged: free
    assert steps[2][0] == pytest.approx(r11 * 100 + r22 * (1200 - 100 - 2))  # grows: ramp, pause, new
    assert steps[3][0] == pytest.approx(r21 * (1200 - 2))  # shrinks: only the pause
    seconds = [o.seconds for o in sim.view().jobs[0].history]
    assert seconds == pytest.approx([1100, 1200, 1198, 1198])


def test_train_finishes_inside_the_ramp_or_after_it_by_hand():
    ramp = Change(lost=10.0, ramp=100.0)
    assert _train(1200.0, ramp, 0.5, 1.0, 20.0) == (20.0, 40.0, 40.0)  # done at old speed after 40 s
    epochs, seconds, finish = _train(1200.0, ramp, 0.5, 1.0, 100.0)  # 50 in the ramp, 50 after the pause
    assert (epochs, seconds, finish) == pytest.approx((100.0, 150.0, 160.0))
    assert _train(1200.0, Change(lost=10.0), 0.0, 1.0, 1e6) == (1190.0, 1190.0, None)


def test_realistic_configs_run_and_change_costs_are_paid(realistic):
    sim = build_simulator(realistic)
    from dl2ray.schedulers.drf import DRF

    view = sim.reset(2_000_000)
    sched = DRF()
    for _ in range(5):
        view = sim.step(sched.decide(view)).view
    firsts = [o.seconds for j in view.jobs for o in j.history[:1]]
    assert firsts and max(firsts) <= 1200 - realistic.sim.task_start_s + 1e-9


def _outcome(name: str, seed: int, jct: float) -> RunOutcome:
    return RunOutcome(name, seed, {"censored_avg_jct": jct}, {})


def test_paired_ratio_is_the_per_trace_ratio_with_a_t_interval():
    comp = Comparison("c", [0, 1, 2], 1200.0, paired=("b",))
    comp.runs["a"] = [_outcome("a", s, v) for s, v in zip((0, 1, 2), (8.0, 9.0, 30.0), strict=True)]
    comp.runs["b"] = [_outcome("b", s, v) for s, v in zip((0, 1, 2), (10.0, 10.0, 40.0), strict=True)]
    got = comp.paired_ratio("a", "b")
    ratios = np.array([0.8, 0.9, 0.75])
    assert got["per_trace"] == pytest.approx(ratios)
    assert got["mean"] == pytest.approx(ratios.mean())
    from scipy import stats

    assert got["ci95"] == pytest.approx(stats.t.ppf(0.975, 2) * ratios.std(ddof=1) / np.sqrt(3))


def test_slot_noise_is_the_jobs_own_common_random_numbers():
    from dl2ray.speed import variation_factors

    many = variation_factors(9, np.arange(50), 4, 0.1)
    assert np.all((many >= 0.9) & (many < 1.1)) and len(set(many.round(12))) == 50
    np.testing.assert_array_equal(variation_factors(9, np.array([31, 2]), 4, 0.1), many[[31, 2]])
    assert variation_factors(9, np.array([2]), 5, 0.1)[0] != many[2]  # another slot
    assert variation_factors(10, np.array([2]), 4, 0.1)[0] != many[2]  # another run
    assert variation_factors(9, np.array([2]), 4, 0.0)[0] == 1.0
