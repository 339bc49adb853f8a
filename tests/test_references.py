"""The per-trace lower bound: exact best layout, and no scheduler ever beats it on any job."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2ray.config import ClusterConfig, NodeGroup
from dl2ray.evaluation.references import (
    JobBounds,
    best_configs,
    best_layout_time,
    lower_bound_jcts,
    node_groups,
)
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import Simulator, run_episode
from dl2ray.speed import analytic_iteration_time, layout_of
from dl2ray.workload import JobSpec, sort_trace


def _brute_force(jt, ps, workers, capacity):
    """Smallest analytic iteration time over every assignment of tasks to nodes."""
    n = len(capacity)
    best = np.inf
    wd, pd = jt.worker.as_array(), jt.ps.as_array()
    for wn in itertools.product(range(n), repeat=workers):
        for pn in itertools.product(range(n), repeat=ps):
            use = np.zeros_like(capacity)
            for x in wn:
                use[x] += wd
            for x in pn:
                use[x] += pd
            if np.all(use <= capacity + 1e-9):
                best = min(best, analytic_iteration_time(jt, layout_of(wn, pn)))
    return best


@pytest.mark.parametrize("name", ["resnet-50", "wlm", "dssm"])
@pytest.mark.parametrize(("ps", "workers"), [(1, 1), (2, 1), (3, 2), (1, 3)])
def test_layout_search_matches_brute_force(testbed, name, ps, workers):
    jt = testbed.catalogue.get(name)
    capacity = np.array([[8.0, 2.0, 48.0], [8.0, 2.0, 48.0], [4.0, 1.0, 16.0]])
    got = best_layout_time(jt, ps, workers, node_groups(capacity))
    assert got == pytest.approx(_brute_force(jt, ps, workers, capacity))


def test_tasks_that_fit_nowhere_give_an_infinite_time(testbed):
    jt = testbed.catalogue.get("resnet-50")
    assert best_layout_time(jt, 1, 3, node_groups(np.array([[8.0, 2.0, 48.0]]))) == np.inf


def test_best_config_is_at_least_as_fast_as_every_simple_shape(testbed, speed_model):
    best = best_configs(speed_model, testbed.cluster.capacity)
    for t, jt in enumerate(testbed.catalogue.types):
        for p, w in ((1, 1), (2, 2), (4, 1), (1, 4)):
            spread = speed_model.nominal_batches_per_second(t, p, w) / jt.batches_per_epoch
            assert best[t].epochs_per_second >= spread - 1e-12
        assert best[t].ps <= jt.max_ps and best[t].workers <= jt.max_workers


@pytest.mark.parametrize("scheduler", ["drf", "optimus-truth", "optimus", "fifo-published"])
@pytest.mark.parametrize("placement", ["load_balancing", "packing"])
def test_no_scheduler_finishes_a_job_faster_than_its_bound(testbed, speed_model, scheduler, placement):
    cfg = testbed.model_copy(update={"cluster": ClusterConfig(
        nodes=(NodeGroup(count=3), NodeGroup(count=1, cpu=16, gpu=4, mem=96)), placement=placement)})
    rng = np.random.default_rng(7)
    cat = cfg.catalogue
    trace = sort_trace([
        JobSpec(i, cat.types[int(t)].name, int(a), f * cat.types[int(t)].base_epochs,
                f * cat.types[int(t)].base_epochs)
        for i, (t, a, f) in enumerate(zip(rng.integers(0, 8, 10), rng.integers(0, 4, 10),
                                          rng.uniform(0.02, 0.1, 10), strict=True))
    ])
    bound = lower_bound_jcts(trace, speed_model, cfg.cluster.capacity, cfg.sim.slot_seconds)
    jct = run_episode(Simulator(cfg, speed_model, trace=trace), make_scheduler(scheduler, cfg), 0).jct
    assert set(jct) == set(bound)
    for job_id, v in jct.items():
        assert bound[job_id] <= v + 1e-9


def _bound_by_brute_force(speed_model, t, factors, capacity):
    """Reference for :class:`JobBounds`: every (p, w) in the caps, the exact best layout of each."""
    jt = speed_model.catalogue.types[t]
    a, b = factors
    groups = node_groups(capacity)
    best = 0.0
    for p in range(1, jt.max_ps + 1):
        for w in range(1, jt.max_workers + 1):
            layout_time = best_layout_time(jt, p, w, groups, speed_model.placement)
            if not np.isfinite(layout_time):
                continue
            comm = layout_time - jt.compute_s
            base = speed_model.nominal_batches_per_second(t, p, w)
            ref = speed_model.placement.iteration_time(jt, tuple(sorted([(1, 0)] * w + [(0, 1)] * p)))
            best = max(best, base * ref / (jt.compute_s * a + comm * b))
    return best / jt.batches_per_epoch


@pytest.mark.parametrize("factors", [(1.0, 1.0), (0.8, 1.2), (1.2, 0.8)])
@pytest.mark.parametrize("t", [0, 2, 7])
def test_job_bound_is_the_best_over_every_shape(testbed, speed_model, t, factors):
    capacity = np.array([[8.0, 2.0, 48.0]] * 3)
    got = JobBounds(speed_model, capacity).epochs_per_second(t, factors)
    assert got == pytest.approx(_bound_by_brute_force(speed_model, t, factors, capacity))


def test_a_job_with_slow_communication_has_a_longer_bound_than_its_type(testbed, speed_model):
    """The bound is per job: it sees the job's factors (it used to be its type's, whatever the deviation)."""
    bounds = JobBounds(speed_model, testbed.cluster.capacity)
    assert bounds.epochs_per_second(0, (1.0, 1.3)) < bounds.epochs_per_second(0) < \
        bounds.epochs_per_second(0, (0.7, 1.0))


SCHEDULERS = ["drf", "drf-static", "fifo", "srtf", "tetris", "optimus", "planner", "optimus-truth",
              "srtf-published"]


@settings(max_examples=12)
@given(
    deviation=st.sampled_from([0.0, 0.1, 0.3, 0.5]),
    variation=st.sampled_from([0.0, 0.05, 0.2]),
    interference=st.sampled_from([0.0, 0.2]),
    placement=st.sampled_from(["own", "load_balancing", "packing", "optimus", "tetris"]),
    bandwidth=st.sampled_from([1.0, 0.5, 0.1]),
    compute=st.sampled_from([1.0, 0.5, 2.0]),
    seed=st.integers(0, 10_000),
)
def test_no_scheduler_beats_the_bound_of_any_job_in_the_realistic_world(
        realistic, deviation, variation, interference, placement, bandwidth, compute, seed):
    """Every job of generated traces under the realistic information model: each scheduler's JCT is at
    least the job's bound (hidden factors, variation, interference, change costs, any placer, the network
    slower or the accelerators faster or slower than when the speeds were measured)."""
    cfg = realistic.model_copy(update={
        "cluster": ClusterConfig(nodes=(NodeGroup(count=4),), placement=placement),
        "workload": realistic.workload.model_copy(update={"num_jobs": 8}),
        "speed": realistic.speed.model_copy(update={
            "job_deviation": deviation, "variation": variation, "interference": interference,
            "bandwidth_scale": bandwidth, "compute_scale": compute}),
    })
    from dl2ray.traces.generate import generate_trace
    from dl2ray.world import build_simulator

    trace = generate_trace(cfg, seed)
    sim = build_simulator(cfg, trace)
    bound = lower_bound_jcts(trace, sim.speed, cfg.cluster.capacity, cfg.sim.slot_seconds, seed,
                             deviation, variation)
    for name in SCHEDULERS:
        jct = run_episode(sim, make_scheduler(name, cfg), seed).jct
        assert set(jct) == set(bound)
        late = {j: (bound[j], v) for j, v in jct.items() if bound[j] > v + 1e-9}
        assert not late, f"{name}: jobs faster than their bound: {late}"
