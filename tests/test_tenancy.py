"""Shared clusters (issue 40): the queue model, entitlements, the queue layer around every scheduler."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support import CONFIGS, small_config

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.comparison import RunSpec, run_one
from dl2ray.evaluation.tenancy import queue_metrics, reclaim_latencies, unflat
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.queued import Queued
from dl2ray.sim import run_episode
from dl2ray.tenancy import QueueSpec, Resources, TenancyConfig, entitlements
from dl2ray.traces.generate import generate_trace
from dl2ray.view import Tasks
from dl2ray.workload import JobSpec
from dl2ray.world import build_simulator

HEURISTICS = ("drf", "fifo", "srtf", "tetris", "optimus", "planner")


def _q(name: str, gpu: float, **kw) -> QueueSpec:
    return QueueSpec(name=name, nominal=Resources(cpu=4 * gpu, gpu=gpu, mem=24 * gpu), **kw)


def _gpu(x: float) -> np.ndarray:
    return np.array([4 * x, x, 24 * x])


def test_entitlements_guarantee_nominal_lend_what_is_unused_by_weight_within_the_limits():
    t = TenancyConfig(queues=(_q("a", 4), _q("b", 4, weight=3), _q("c", 4, lending_limit=Resources(gpu=1))))
    ent = entitlements(t, {"a": _gpu(10), "b": _gpu(10), "c": _gpu(0)})
    # c lends at most 1 GPU of its 4 (and its cpu/mem without limit); a and b share it 1:3
    assert ent["c"] == pytest.approx(np.zeros(3))
    assert ent["a"][1] == pytest.approx(4.25) and ent["b"][1] == pytest.approx(4.75)
    capped = TenancyConfig(queues=(_q("a", 4, borrowing_limit=Resources(gpu=0.5)), _q("b", 4)))
    ent = entitlements(capped, {"a": _gpu(10), "b": _gpu(1)})
    assert ent["a"][1] == pytest.approx(4.5) and ent["b"][1] == pytest.approx(1.0)  # the rest stays idle
    ent = entitlements(capped, {"a": _gpu(2), "b": _gpu(3)})  # demand below nominal: what it asks
    assert ent["a"] == pytest.approx(_gpu(2)) and ent["b"] == pytest.approx(_gpu(3))


def test_cohorts_do_not_lend_to_each_other():
    t = TenancyConfig(queues=(_q("a", 4, cohort="x"), _q("b", 4, cohort="y")))
    ent = entitlements(t, {"a": _gpu(8), "b": _gpu(0)})
    assert ent["a"] == pytest.approx(_gpu(4))


@settings(max_examples=60, deadline=None)
@given(nominal=st.lists(st.integers(0, 6), min_size=1, max_size=4),
       demand=st.lists(st.integers(0, 12), min_size=4, max_size=4),
       weights=st.lists(st.sampled_from([0.5, 1.0, 3.0]), min_size=4, max_size=4),
       borrow=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=4, max_size=4))
def test_entitlements_never_exceed_the_cohort_or_a_borrowing_limit_and_always_cover_the_guarantee(
        nominal, demand, weights, borrow):
    def limit(b):
        return None if b is None else Resources(cpu=4 * b, gpu=b, mem=24 * b)

    queues = tuple(_q(f"q{i}", n, weight=weights[i], borrowing_limit=limit(borrow[i]))
                   for i, n in enumerate(nominal))
    t = TenancyConfig(queues=queues)
    want = {q.name: _gpu(demand[i]) for i, q in enumerate(queues)}
    ent = entitlements(t, want)
    assert sum(ent.values())[1] <= sum(nominal) + 1e-9
    for q in queues:
        n, d = q.nominal.as_array(), want[q.name]
        assert np.all(ent[q.name] >= np.minimum(n, d) - 1e-9) and np.all(ent[q.name] <= d + 1e-9)
        if q.borrowing_limit is not None:
            assert np.all(ent[q.name] <= n + q.borrowing_limit.as_array() + 1e-9)


def test_bad_tenancy_config_names_the_field():
    with pytest.raises(ValidationError, match="default_priority"):
        TenancyConfig(queues=(_q("a", 1),), default_priority="gold")
    with pytest.raises(ValidationError, match=r"queues: duplicate names \['a'\]"):
        TenancyConfig(queues=(_q("a", 1), _q("a", 1)))
    with pytest.raises(ValidationError, match=r"queues\.0\.priority"):
        TenancyConfig(queues=(_q("a", 1, priority="gold"),))
    with pytest.raises(ValidationError, match=r"tenancy\.queues: cohort 'default'.*gpu 30 > 26"):
        small_config(tenancy={"queues": [_q("a", 20).model_dump(), _q("b", 10).model_dump()]})


def test_generated_jobs_get_queues_by_share_and_every_other_draw_stays():
    shared = load_config(CONFIGS / "testbed-shared.yaml")
    plain = load_config(CONFIGS / "testbed-layouts.yaml")
    a, b = generate_trace(shared, 7), generate_trace(plain, 7)
    assert [replace(j, queue=None, priority=None) for j in a] == list(b)
    assert {j.queue for j in a} == {"research", "prod", "batch"}
    assert all(j.priority == ("high" if j.queue == "prod" else None) for j in a)


SHARED = small_config(
    cluster={"nodes": [{"count": 4, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 10, "epoch_error": 0.2,
              "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 3}},
    speed={"job_deviation": 0.2, "variation": 0.05}, sim={"max_slots": 400},
    tenancy={"queues": [_q("a", 4, share=0.5).model_dump(), _q("b", 3, share=0.3).model_dump(),
                        _q("c", 1, share=0.2, borrowing_limit=Resources(cpu=4, gpu=1, mem=24)).model_dump()]})


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split=st.sampled_from([(4, 3, 1), (2, 2, 4), (6, 1, 1), (3, 3, 2)]),  # every queue fits a bundle
       borrow=st.sampled_from([None, 0, 1, 3]), lend=st.sampled_from([None, 0, 2]),
       weight=st.sampled_from([0.5, 1.0, 4.0]), seed=st.integers(0, 10_000))
def test_no_scheduler_breaks_a_quota_beyond_its_borrowing_limit_kills_a_job_or_waits_for_its_quota(
        split, borrow, lend, weight, seed):
    limit = None if borrow is None else Resources(cpu=4 * borrow, gpu=borrow, mem=24 * borrow)
    lending = None if lend is None else Resources(cpu=4 * lend, gpu=lend, mem=24 * lend)
    queues = [_q("a", split[0], share=0.5, borrowing_limit=limit),
              _q("b", split[1], share=0.3, weight=weight, lending_limit=lending),
              _q("c", split[2], share=0.2, borrowing_limit=limit, lending_limit=lending)]
    cfg = SHARED.model_copy(update={"tenancy": TenancyConfig(queues=tuple(queues))})
    trace = generate_trace(cfg, seed)
    for name in HEURISTICS:
        sim = build_simulator(cfg, trace)
        scheduler = make_scheduler(name, cfg)
        assert isinstance(scheduler, Queued)
        result = run_episode(sim, scheduler, seed)
        assert len(result.end_time) == len(trace), f"{name}: a job never finished"  # paused, never killed
        per = queue_metrics(result, {j.job_id: j.queue for j in trace}, scheduler.log, cfg.tenancy,
                            cfg.cluster.capacity)
        for q in cfg.tenancy.queues:
            assert per[q.name]["violations"] == 0, f"{name}: queue {q.name} beyond its borrowing limit"
            assert per[q.name]["reclaim_latency_p95"] <= 1, f"{name}: queue {q.name} waited for its quota"
        for s in scheduler.log:
            assert np.all(s.usage <= s.entitlement + 1e-9) or s.shrunk + s.paused == 0


def _borrower_then_owner():
    """Queue a's long job borrows the whole cluster; queue b's job arrives at slot 3."""
    cfg = SHARED.model_copy(update={"tenancy": TenancyConfig(queues=(_q("a", 4), _q("b", 4)))})
    trace = (JobSpec(0, "resnet-50", 0, 3000.0, 3000.0, queue="a"),
             JobSpec(1, "resnet-50", 0, 3000.0, 3000.0, queue="a"),
             JobSpec(2, "vgg-16", 3, 300.0, 300.0, queue="b"))
    return cfg, trace


def test_an_owner_gets_its_quota_back_the_slot_its_job_arrives_by_scaling_the_borrower_down():
    cfg, trace = _borrower_then_owner()
    sim = build_simulator(cfg, trace)
    scheduler = make_scheduler("drf", cfg)
    result = run_episode(sim, scheduler, 1)
    at = {(s.slot, s.queue): s for s in scheduler.log}
    assert at[(2, "a")].usage[1] > 4  # a borrowed b's GPUs while b had nothing
    assert at[(3, "b")].usage[1] > 0  # b's job runs the slot it arrives
    assert np.all(at[(3, "a")].usage <= _gpu(4) + 1e-9)
    assert at[(3, "a")].shrunk + at[(3, "a")].paused >= 1
    assert set(result.end_time) == {0, 1, 2}  # the borrower kept training to the end
    assert reclaim_latencies(scheduler.log, "b", cfg.cluster.capacity.sum(axis=0)) == [0] * len(
        [s for s in scheduler.log if s.queue == "b" and s.jobs > 0])


def test_the_trim_takes_from_the_lowest_priority_and_never_below_what_a_protected_job_held():
    """Queue a entitled to 4 GPUs: its scheduler gave 3 jobs 2 workers each. Job 0 is non-preemptible and
    held 2 workers, job 1 (high) and job 2 (normal) are preemptible; the trim takes job 2 first, one task
    at a time (a worker while it has as many workers as PS), pausing it only at one bundle."""
    tenancy = TenancyConfig(queues=(_q("a", 4), _q("b", 4)),
                            priority_classes=({"name": "normal"}, {"name": "high", "value": 5},
                                              {"name": "critical", "value": 9, "preemptible": False}))
    cfg = SHARED.model_copy(update={"tenancy": tenancy})
    trace = tuple(JobSpec(i, "resnet-50", 0, 3000.0, 3000.0, queue="a", priority=p)
                  for i, p in enumerate(("critical", "high", None)))
    sim = build_simulator(cfg, trace)
    view = sim.reset(1)
    view = sim.step(make_scheduler("fifo", cfg).decide(view)).view
    jobs = {j.job_id: j for j in view.jobs}
    layer = make_scheduler("fifo", cfg)
    layer._held = {0: Tasks(2, 2), 1: Tasks(2, 2), 2: Tasks(2, 2)}
    placed = view.placer("load_balancing")
    for j in (0, 1, 2):
        for _ in range(2):
            placed.place_bundle(j, jobs[j].worker_demand, jobs[j].ps_demand)
    alloc = layer._trim(placed.allocation(), jobs, _gpu(4) * [10, 1, 10], _gpu(4))
    assert alloc.tasks[0] == Tasks(2, 2) and alloc.tasks[1] == Tasks(2, 2) and 2 not in alloc.tasks
    assert layer._reclaimed(list(jobs.values()), alloc) == (0, 1)
    alloc = layer._trim(placed.allocation(), jobs, _gpu(5) * [10, 1, 10], _gpu(4))
    assert alloc.tasks[2] == Tasks(1, 2) and layer._reclaimed(list(jobs.values()), alloc) == (1, 0)
    assert {j: len(p.worker_nodes) for j, p in alloc.placement.items()} == {0: 2, 1: 2, 2: 1}
    alloc = layer._trim(placed.allocation(), jobs, _gpu(1) * [10, 1, 10], _gpu(4))
    assert alloc.tasks == {0: Tasks(2, 2)}  # everything preemptible went; the protected job stays


def test_a_job_in_an_unknown_queue_is_refused_by_name():
    cfg, trace = _borrower_then_owner()
    trace = (*trace[:2], replace(trace[2], queue="nope"))
    sim = build_simulator(cfg, trace)
    with pytest.raises(UserError, match="job 2: queue 'nope' is not a queue of this cluster"):
        run_episode(sim, make_scheduler("fifo", cfg), 1)


def test_compare_reports_per_queue_metrics_in_its_runs():
    out = run_one(SHARED, RunSpec("planner", 2_000_000), None)
    per = unflat(out.metrics, ("a", "b", "c"))
    assert sum(per[q]["jobs"] for q in per) == out.metrics["jobs"]
    assert all(per[q]["violations"] == 0 for q in per)
