"""The oracle: Optimus's greedy on the simulator's true speeds; a registered, marked reference."""

from __future__ import annotations

from dl2ray.schedulers.base import make_scheduler


def _speed(oracle, job, t):
    return 1.0 / oracle.seconds_per_epoch(job.type_index, t.ps, t.workers)


def test_built_from_the_config_and_marked_as_reference(testbed):
    oracle = make_scheduler("optimus-truth", testbed)
    assert oracle.name == "optimus-truth" and oracle.reference is True


def test_a_lone_job_gets_a_shape_no_single_task_improves(make_job, make_view, testbed, speed_model):
    oracle = make_scheduler("optimus-truth", testbed)
    for name in ("wlm", "resnet-50", "dssm"):
        job = make_job(0, name)
        t = oracle.decide(make_view([job], nodes=30)).tasks[0]
        now = _speed(oracle, job, t)
        assert now > _speed(oracle, job, type(t)(1, 1))  # it grew the job, and it paid off
        for more in (type(t)(t.workers + 1, t.ps), type(t)(t.workers, t.ps + 1)):
            if more.workers <= job.max_workers and more.ps <= job.max_ps:
                assert _speed(oracle, job, more) <= now
        # its speeds are the simulator's nominal ones
        jt = testbed.catalogue.get(name)
        nominal = speed_model.nominal_batches_per_second(job.type_index, t.ps, t.workers)
        assert now == nominal / jt.batches_per_epoch


def test_wlm_goes_ps_heavy_on_the_measured_surface(make_job, make_view, testbed):
    t = make_scheduler("optimus-truth", testbed).decide(make_view([make_job(0, "wlm")], nodes=30)).tasks[0]
    assert t.ps > t.workers
