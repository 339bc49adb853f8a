"""FIFO, SRTF and Tetris give a job at most its requested size; the *-published variants fill to caps."""

from __future__ import annotations

import pytest

from dl2ray.config import ClusterConfig, NodeGroup
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import Simulator, run_episode
from dl2ray.view import Tasks
from dl2ray.workload import JobSpec


@pytest.mark.parametrize("name", ["fifo", "srtf", "tetris"])
def test_each_job_gets_its_requested_size_and_no_more(name, make_job, make_view, testbed):
    jobs = [make_job(0, "resnet-50", requested=3), make_job(1, "vgg-16", arrival=1, requested=1),
            make_job(2, "dssm", arrival=2, requested=40)]  # 40 > caps: cut to the caps (16)
    alloc = make_scheduler(name, testbed).decide(make_view(jobs, nodes=20))
    assert alloc.tasks[0] == Tasks(3, 3)
    assert alloc.tasks[1] == Tasks(1, 1)
    assert alloc.tasks[2] == Tasks(16, 16)


@pytest.mark.parametrize("name", ["fifo", "srtf", "tetris"])
def test_published_variant_fills_to_the_caps(name, make_job, make_view, testbed):
    jobs = [make_job(0, "resnet-50", requested=3), make_job(1, "vgg-16", arrival=1, requested=1)]
    alloc = make_scheduler(f"{name}-published", testbed).decide(make_view(jobs, nodes=20))
    assert alloc.tasks[0] == Tasks(12, 12)
    assert alloc.tasks[1] == Tasks(12, 12)


def test_a_view_without_requested_sizes_falls_back_to_the_caps(make_job, make_view, testbed):
    alloc = make_scheduler("fifo", testbed).decide(make_view([make_job(0, "wlm")], nodes=20))
    assert alloc.tasks[0] == Tasks(12, 12)


def test_requested_size_reaches_the_scheduler_from_trace_or_config(testbed, speed_model):
    """The trace's size wins; a job without one gets workload.requested_bundles."""
    cfg = testbed.model_copy(update={
        "workload": testbed.workload.model_copy(update={"requested_bundles": 3}),
        "cluster": ClusterConfig(nodes=(NodeGroup(count=20),)),
    })
    trace = (JobSpec(0, "resnet-50", 0, 500.0, 500.0, requested_bundles=5),
             JobSpec(1, "resnet-50", 0, 500.0, 500.0))
    sim = Simulator(cfg, speed_model, trace=trace, record_events=True)
    run_episode(sim, make_scheduler("fifo", cfg), seed=0)
    sizes = {(e["job_id"], e["workers"], e["ps"]) for e in sim.result.events}
    assert sizes == {(0, 5, 5), (1, 3, 3)}
