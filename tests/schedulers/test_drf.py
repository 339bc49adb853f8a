"""DRF: progressive filling equalises dominant shares."""

from __future__ import annotations

from dl2ray.schedulers.drf import DRF
from dl2ray.view import Tasks


def test_equal_dominant_shares_split_evenly(make_job, make_view):
    gpu_job = make_job(0, "resnet-50", arrival=0)  # bundle: 4 cores, 1 GPU
    cpu_job = make_job(1, "cnn-text-classification", arrival=1)  # bundle: 4 cores
    alloc = DRF().decide(make_view([gpu_job, cpu_job], nodes=2))  # 16 cores: 4 bundles
    assert alloc.tasks == {0: Tasks(2, 2), 1: Tasks(2, 2)}


def test_smaller_dominant_share_gets_more_bundles(make_job, make_view):
    # One node of 32 cores and 4 GPUs: a GPU bundle's dominant share is 1/4
    # (GPU), a CPU bundle's 4/32 (cores). Filling by smallest share (ties to
    # job 0) gives shares .25/.125 -> ... -> GPU 3 bundles (.75), CPU 5 (.625),
    # when the cores run out: within one bundle's share of equal.
    gpu_job = make_job(0, "resnet-50", arrival=0)
    cpu_job = make_job(1, "cnn-text-classification", arrival=0)
    alloc = DRF().decide(make_view([gpu_job, cpu_job], node=(32.0, 4.0, 192.0)))
    assert (alloc.tasks[0].workers, alloc.tasks[1].workers) == (3, 5)
