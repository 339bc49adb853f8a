"""FIFO: arrival order, each job to its caps before the next; skips what does not fit."""

from __future__ import annotations

from dl2ray.schedulers.fifo import FIFO
from dl2ray.view import Tasks


def test_earlier_arrival_gets_its_caps_first(make_job, make_view):
    late = make_job(0, "resnet-50", arrival=3)
    early = make_job(1, "resnet-50", arrival=1)
    third = make_job(2, "resnet-50", arrival=5)
    # 16 nodes packed 2 bundles (4 cores + 1 GPU each) per node: 32 bundles.
    alloc = FIFO().decide(make_view([late, early, third], nodes=16, placement="packing"))
    assert alloc.tasks[1] == Tasks(12, 12)
    assert alloc.tasks[0] == Tasks(12, 12)
    assert alloc.tasks[2] == Tasks(8, 8)


def test_job_that_does_not_fit_is_skipped(make_job, make_view):
    gpu_job = make_job(0, "resnet-50", arrival=0)
    cpu_job = make_job(1, "cnn-text-classification", arrival=1)
    alloc = FIFO().decide(make_view([gpu_job, cpu_job], node=(8.0, 0.0, 48.0)))
    assert 0 not in alloc.tasks
    assert alloc.tasks[1] == Tasks(2, 2)


def test_empty_view_gives_empty_allocation(make_view):
    assert FIFO().decide(make_view([])).tasks == {}
