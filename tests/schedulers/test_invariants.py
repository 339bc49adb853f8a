"""Invariants of every registered scheduler under every placement policy.

Hypothesis draws tiny clusters (1-6 nodes, mixed capacities; node 0 always
hosts a bundle of every job type) and tiny traces (1-8 jobs, random types,
arrivals and lengths, estimates off by up to ±30 %), runs them through the
simulator of the realistic testbed config (per-job speed deviation, noise,
interference, hot-scaling costs) with a fixed trace and checks every slot's allocation against the
view it answered: capacity per node (recomputed here from the placement),
caps, only arrived and uncompleted jobs; then that every job completes
exactly once and that the same seed gives the same completion times (the
second run reuses the scheduler after ``reset``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl2ray.config import ClusterConfig, NodeGroup
from dl2ray.errors import UserError
from dl2ray.schedulers.base import make_scheduler, scheduler_names
from dl2ray.sim import Simulator
from dl2ray.view import Allocation, ClusterView
from dl2ray.workload import JobSpec, sort_trace

POLICIES = ["load_balancing", "packing", "optimus"]
MAX_SLOTS = 2000

node_st = st.builds(
    lambda cpu, gpu, mem: NodeGroup(count=1, cpu=cpu, gpu=gpu, mem=mem),
    st.sampled_from([2.0, 4.0, 8.0, 16.0]),
    st.sampled_from([0.0, 1.0, 2.0, 4.0]),
    st.sampled_from([8.0, 16.0, 48.0]),
)
first_node_st = st.builds(  # fits a worker + PS of every testbed type
    lambda cpu, gpu, mem: NodeGroup(count=1, cpu=cpu, gpu=gpu, mem=mem),
    st.sampled_from([4.0, 8.0, 16.0]),
    st.sampled_from([1.0, 2.0, 4.0]),
    st.sampled_from([16.0, 48.0]),
)
job_st = st.tuples(
    st.integers(0, 7),  # type index
    st.integers(0, 6),  # arrival slot
    st.floats(0.01, 0.15),  # true epochs as a fraction of the type's base epochs
    st.floats(-0.3, 0.3),  # estimate error
)


def _trace(cat, jobs) -> tuple[JobSpec, ...]:
    specs = []
    for i, (t, arrival, frac, err) in enumerate(jobs):
        jt = cat.types[t % len(cat)]
        true = frac * jt.base_epochs
        specs.append(JobSpec(i, jt.name, arrival, true, true * (1 + err)))
    return sort_trace(specs)


def _check(view: ClusterView, alloc: Allocation) -> None:
    jobs = {j.job_id: j for j in view.jobs}
    assert set(alloc.tasks) <= set(jobs), "allocated a job not arrived or already completed"
    assert alloc.placement is not None
    usage = np.zeros_like(view.capacity)
    for job_id, t in alloc.tasks.items():
        job = jobs[job_id]
        assert job.arrival_slot <= view.slot
        assert t.workers <= job.max_workers and t.ps <= job.max_ps
        pl = alloc.placement[job_id]
        assert (len(pl.worker_nodes), len(pl.ps_nodes)) == (t.workers, t.ps)
        for node in pl.worker_nodes:
            usage[node] += job.worker_demand
        for node in pl.ps_nodes:
            usage[node] += job.ps_demand
    assert np.all(usage <= view.capacity + 1e-9), "node capacity exceeded"


def _run(sim: Simulator, sched, seed: int) -> dict[int, float]:
    view = sim.reset(seed)
    if hasattr(sched, "reset"):
        sched.reset(seed)
    completed: list[int] = []
    while not sim.done:
        alloc = sched.decide(view)
        _check(view, alloc)
        step = sim.step(alloc)
        completed += step.completed
        view = step.view
    assert sorted(completed) == sorted(j.job_id for j in sim.trace), "not all completed once"
    return sim.result.jct


def _build(name: str, cfg):
    if name == "dl2":
        return _untrained_dl2(cfg)
    if name == "dl2-shape":
        return _untrained_shape(cfg)
    try:
        return make_scheduler(name, cfg)
    except UserError as exc:  # a scheduler that needs an argument we cannot invent
        pytest.skip(f"{name} cannot be built without an argument: {exc}")


def _untrained_dl2(cfg):
    """The learned scheduler with freshly initialised weights, sampling its actions:
    the invariants must hold for any weights, not just trained ones."""
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import NumpyPolicy, build_networks
    from dl2ray.schedulers.dl2 import DL2Scheduler

    policy, _ = build_networks(Encoding.from_config(cfg), cfg.policy.hidden, seed=0)
    return DL2Scheduler.from_policy(NumpyPolicy.from_torch(policy), greedy=False, seed=0)


def _untrained_shape(cfg):
    """The learned scheduler of the shape architecture, freshly initialised, sampling its rows."""
    from dl2ray.policy.shape import ShapeEncoding
    from dl2ray.policy.shape_net import NumpyShapePolicy, build_shape_policy
    from dl2ray.schedulers.dl2 import DL2Scheduler

    s = cfg.policy.shape
    net = build_shape_policy(ShapeEncoding.from_config(cfg), s.embed, s.head, seed=0)
    return DL2Scheduler.from_policy(NumpyShapePolicy(net), greedy=False, seed=0)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", [*scheduler_names(), "dl2-shape"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=first_node_st,
    others=st.lists(node_st, min_size=0, max_size=5),
    jobs=st.lists(job_st, min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_scheduler_invariants(name, policy, realistic, speed_model, first, others, jobs, seed):
    cfg = realistic.model_copy(update={
        "cluster": ClusterConfig(nodes=(first, *others), placement=policy),
        "sim": realistic.sim.model_copy(update={"max_slots": MAX_SLOTS}),
    })
    trace = _trace(cfg.catalogue, jobs)
    sim = Simulator(cfg, speed_model, trace=trace)
    sched = _build(name, cfg)
    jct = _run(sim, sched, seed)
    assert _run(Simulator(cfg, speed_model, trace=trace), sched, seed) == jct
