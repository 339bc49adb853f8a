"""Tetris: alignment with the free resources plus a shortest-remaining-time preference."""

from __future__ import annotations

from dl2ray.schedulers.tetris import Tetris
from dl2ray.view import Tasks


def test_better_aligned_bundle_wins_at_equal_remaining_time(make_job, make_view, testbed):
    # Same fraction of their base length left, no observations: equal preference.
    # The GPU bundle uses all three resources of the node, the CPU one two:
    # alignment 1.25 vs 0.67, then 0.69 vs 0.375 — the GPU job takes the node.
    cat = testbed.catalogue
    gpu_job = make_job(0, "resnet-50", arrival=1, est=cat.get("resnet-50").base_epochs)
    cpu_job = make_job(1, "cnn-text-classification", arrival=0,
                       est=cat.get("cnn-text-classification").base_epochs)
    alloc = Tetris().decide(make_view([cpu_job, gpu_job]))
    assert alloc.tasks == {0: Tasks(2, 2)}


def test_shorter_remaining_time_wins_at_equal_alignment(make_job, make_view, observation):
    short = make_job(0, "resnet-50", arrival=1, est=100, done=90,
                     history=[observation(0, 12.0)])
    long_ = make_job(1, "resnet-50", arrival=0, est=100, done=10,
                     history=[observation(0, 12.0)])
    alloc = Tetris().decide(make_view([long_, short], nodes=2, placement="packing"))
    assert alloc.tasks == {0: Tasks(4, 4)}


def test_fills_caps_then_moves_on(make_job, make_view):
    jobs = [make_job(i, "resnet-50", arrival=i, est=100 * (i + 1)) for i in range(3)]
    alloc = Tetris().decide(make_view(jobs, nodes=14, placement="packing"))  # 28 bundles
    assert alloc.tasks[0] == Tasks(12, 12) and alloc.tasks[1] == Tasks(12, 12)
    assert alloc.tasks[2] == Tasks(4, 4)
