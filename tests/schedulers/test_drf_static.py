"""Static, user-specified DRF: a job starts at its requested size, whole, and keeps it."""

from __future__ import annotations

from dl2ray.schedulers.drf_static import StaticDRF
from dl2ray.view import Tasks


def test_running_jobs_keep_their_size_and_waiting_ones_start_whole(make_job, make_view):
    # 2 nodes = 4 GPUs. Job 0 runs with 3 bundles; job 1 asks for 2 and cannot start whole;
    # job 2 asks for 1 and fits behind it (no reservation).
    running = make_job(0, "resnet-50", requested=3, workers=3, ps=3)
    big = make_job(1, "resnet-50", arrival=1, requested=2)
    small = make_job(2, "resnet-50", arrival=2, requested=1)
    alloc = StaticDRF().decide(make_view([running, big, small], nodes=2))
    assert alloc.tasks[0] == Tasks(3, 3)
    assert 1 not in alloc.tasks
    assert alloc.tasks[2] == Tasks(1, 1)


def test_a_running_job_is_not_grown_even_with_room(make_job, make_view):
    job = make_job(0, "resnet-50", requested=4, workers=1, ps=1)  # started by someone else at 1
    alloc = StaticDRF().decide(make_view([job], nodes=10))
    assert alloc.tasks[0] == Tasks(1, 1)


def test_waiting_jobs_start_smallest_dominant_share_first(make_job, make_view):
    # 1 node, 2 GPUs: the job whose request holds the smaller share starts, though it came later.
    wide = make_job(0, "resnet-50", arrival=0, requested=2)
    narrow = make_job(1, "resnet-50", arrival=1, requested=1)
    alloc = StaticDRF().decide(make_view([wide, narrow], nodes=1))
    assert alloc.tasks == {1: Tasks(1, 1)}


def test_a_request_larger_than_the_cluster_is_cut_to_what_it_holds(make_job, make_view):
    job = make_job(0, "resnet-50", requested=10)
    alloc = StaticDRF().decide(make_view([job], nodes=2))  # 4 GPUs, 16 cores: 4 bundles
    assert alloc.tasks[0] == Tasks(4, 4)
