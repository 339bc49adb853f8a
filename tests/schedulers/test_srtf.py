"""SRTF: order by estimated remaining time from observed speeds, caps in that order."""

from __future__ import annotations

import pytest

from dl2ray.schedulers.observed import RemainingTime
from dl2ray.schedulers.srtf import SRTF


def test_shorter_remaining_time_gets_resources_first(make_job, make_view, observation):
    # A: 100 epochs left at 0.01 epochs/s = 1e4 s. B: 50 left at 0.001 = 5e4 s.
    a = make_job(0, "resnet-50", arrival=2, est=200, done=100,
                 history=[observation(0, 12.0, seconds=1200)])
    b = make_job(1, "resnet-50", arrival=0, est=100, done=50,
                 history=[observation(0, 1.2, seconds=1200)])
    alloc = SRTF().decide(make_view([b, a], nodes=3, placement="packing"))  # 6 bundles
    assert alloc.tasks[0].workers == 6
    assert 1 not in alloc.tasks


def test_remaining_time_of_new_jobs_from_type_speed(make_job, make_view, observation, testbed):
    rt = RemainingTime()
    seen = make_job(0, "resnet-50", est=100, done=10, history=[observation(0, 24.0)])
    rt.update(make_view([seen]))  # resnet-50 observed at 0.02 epochs/s
    fresh = make_job(1, "resnet-50", est=60)
    unseen = make_job(2, "vgg-16", est=testbed.catalogue.get("vgg-16").base_epochs / 2)
    est = rt.estimates(make_view([seen, fresh, unseen]))
    assert est[0] == pytest.approx(90 / 0.02)
    assert est[1] == pytest.approx(60 / 0.02)
    # Unseen type: half a base-length job of the mean seen type's duration.
    t_ref = testbed.catalogue.get("resnet-50").base_epochs / 0.02
    assert est[2] == pytest.approx(0.5 * t_ref)


def test_observations_count_once_and_reset_forgets(make_job, make_view, observation):
    rt = RemainingTime()
    job = make_job(0, "resnet-50", est=100, history=[observation(0, 12.0)])
    view = make_view([job])
    rt.update(view)
    rt.update(view)  # same history again: not counted twice
    job2 = make_job(0, "resnet-50", est=100,
                    history=[observation(0, 12.0), observation(1, 36.0)])
    rt.update(make_view([job2]))
    assert rt.type_speed(0) == pytest.approx((0.01 + 0.03) / 2)
    rt.reset()
    assert rt.type_speed(0) is None


def test_without_observations_ranks_by_fraction_of_base_length(make_job, make_view, testbed):
    base = testbed.catalogue.get("vgg-16").base_epochs
    long_ = make_job(0, "resnet-50", arrival=0,
                     est=testbed.catalogue.get("resnet-50").base_epochs)
    short = make_job(1, "vgg-16", arrival=1, est=0.1 * base)
    alloc = SRTF().decide(make_view([long_, short], nodes=2, placement="packing"))
    assert alloc.tasks[1].workers == 4 and 0 not in alloc.tasks
