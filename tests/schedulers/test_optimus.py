"""Optimus: online loss and speed fits, greedy marginal gains, no access to the truth."""

from __future__ import annotations

import numpy as np
import pytest

from dl2ray.measurements import fit_optimus_speed, optimus_speed
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.optimus.fit import (
    PRIOR_THETA,
    SpeedFit,
    convergence_epochs,
    fit_loss_curve,
    fit_loss_curves,
    step_time,
)
from dl2ray.schedulers.optimus.scheduler import Optimus
from dl2ray.sim import Simulator, run_episode
from dl2ray.speed import SpeedModel
from dl2ray.view import Observation, Tasks
from dl2ray.workload import JobSpec


def test_loss_fit_recovers_noise_free_curve():
    b0, b1, b2 = 0.002, 1.5, 0.2
    k = np.linspace(50, 3000, 30)
    fit = fit_loss_curve(k, 1.0 / (b0 * k + b1) + b2)
    assert fit == pytest.approx((b0, b1, b2), rel=1e-3)


def test_batched_fit_equals_single_fits_and_flags_degenerate():
    rng = np.random.default_rng(0)
    ks = [np.cumsum(rng.uniform(10, 30, n)) for n in (3, 8, 20)]
    losses = [(1.0 / (0.01 * k + 1.0) + 0.1) * (1 + 0.01 * rng.normal(size=len(k))) for k in ks]
    ks += [np.array([1.0, 2.0]), np.array([1.0, 2.0, 3.0])]
    losses += [np.array([1.0, 0.9]), np.array([0.5, 0.5, 0.5])]  # too short; flat
    batch = fit_loss_curves(ks, losses)
    for k, loss, got in zip(ks, losses, batch, strict=True):
        assert got == fit_loss_curve(k, loss)
    assert batch[3] is None and batch[4] is None


def test_convergence_point_matches_the_simulators_curve():
    # The simulator: l = 1/(b0·k + 1) + 0.1 with b0 = (1/δ - 1)/E: converged at E.
    gap, true_epochs = 0.01, 1000.0
    b0 = (1 / gap - 1) / true_epochs
    k = np.linspace(20, 400, 12)
    fit = fit_loss_curve(k, 1.0 / (b0 * k + 1.0) + 0.1)
    assert fit is not None
    assert convergence_epochs(fit[0], fit[1], gap) == pytest.approx(true_epochs, rel=1e-2)


def test_speed_fit_recovers_theta():
    theta, batch = np.array([0.01, 0.2, 0.05, 0.01, 0.02]), 32
    fit = SpeedFit(batch)
    for p in range(1, 5):
        for w in range(1, 5):
            speed = float(optimus_speed(theta, p, w, batch)[0])
            fit.add(p, w, speed)
            fit.add(p, w, speed)  # repeats collapse to one weighted point
    c, t2, t3, t4 = fit.coefficients(default_step=1.0)
    # θ0·B and θ1 are not separable for one batch size; their sum is.
    assert (c, t2, t3, t4) == pytest.approx((0.01 * batch + 0.2, 0.05, 0.01, 0.02), rel=1e-6)


def test_weighted_speed_fit_equals_fit_on_every_observation():
    rng = np.random.default_rng(1)
    pts = [(int(rng.integers(1, 5)), int(rng.integers(1, 5))) for _ in range(40)]
    speeds = [w / (0.5 + 0.1 * w / p + 0.05 * w) * rng.uniform(0.9, 1.1) for p, w in pts]
    fit = SpeedFit(64)
    for (p, w), s in zip(pts, speeds, strict=True):
        fit.add(p, w, s)
    ps, ws = np.array([p for p, _ in pts]), np.array([w for _, w in pts])
    theta = fit_optimus_speed(ps, ws, np.full(len(pts), 64), np.array(speeds))
    coef = fit.coefficients(1.0)
    for p, w in set(pts):
        assert w / step_time(coef, p, w) == pytest.approx(
            float(optimus_speed(theta, p, w, 64)[0]), rel=1e-6
        )


def test_prior_matches_the_single_observed_point_and_still_gains():
    fit = SpeedFit(32)
    fit.add(1, 1, 0.5)  # step time 2 worker·s/epoch
    coef = fit.coefficients(default_step=99.0)
    assert step_time(coef, 1, 1) == pytest.approx(2.0)
    scale = 2.0 / step_time((PRIOR_THETA[1], PRIOR_THETA[2], PRIOR_THETA[3], 0.0), 1, 1)
    assert coef[1] == pytest.approx(PRIOR_THETA[2] * scale)
    speed = {(p, w): w / step_time(coef, p, w) for p, w in ((1, 1), (1, 2), (2, 1))}
    assert speed[(1, 2)] > speed[(1, 1)] and speed[(2, 1)] > speed[(1, 1)]


def _history(theta, batch, points, epochs_scale=1.0):
    out = []
    for slot, (p, w) in enumerate(points):
        speed = float(optimus_speed(theta, p, w, batch)[0]) * epochs_scale
        out.append(Observation(slot, p, w, speed * 1200.0, 1200.0, 1.0))
    return out


def test_every_job_first_gets_one_bundle_in_arrival_order(make_job, make_view):
    jobs = [make_job(i, "resnet-50", arrival=3 - i, est=100) for i in range(3)]
    alloc = Optimus().decide(make_view(jobs, node=(8.0, 2.0, 48.0)))  # room for 2 bundles
    assert alloc.tasks == {2: Tasks(1, 1), 1: Tasks(1, 1)}


def test_longer_job_gets_more_tasks_under_the_same_speed_model(make_job, make_view, testbed):
    batch = testbed.catalogue.get("resnet-50").batch_size
    theta = np.array([0.0, 0.3, 0.1, 0.02, 0.0]) / 1000
    points = [(1, 1), (1, 2), (2, 2), (2, 1), (3, 3)]
    hist = _history(theta, batch, points)  # 5 slots at est 1e6: no loss fit yet (loss flat)
    long_ = make_job(0, "resnet-50", arrival=0, est=5e6, done=0.0, history=hist[:2])
    short = make_job(1, "resnet-50", arrival=0, est=5e4, done=0.0, history=hist[2:])
    alloc = Optimus().decide(make_view([long_, short], nodes=3))
    t_long, t_short = alloc.tasks[0], alloc.tasks[1]
    assert t_long.workers + t_long.ps > t_short.workers + t_short.ps


def test_no_gain_means_no_extra_tasks(make_job, make_view, testbed):
    # Step time grows with w as fast as w: more workers or PS never help.
    batch = testbed.catalogue.get("resnet-50").batch_size
    theta = np.array([0.0, 0.0, 0.0, 1.0, 0.0])
    hist = _history(theta, batch, [(1, 1), (2, 2), (1, 2), (2, 1)])
    job = make_job(0, "resnet-50", est=1e6, history=hist)
    alloc = Optimus().decide(make_view([job], nodes=4))
    assert alloc.tasks == {0: Tasks(1, 1)}


def test_registry_builds_optimus_with_the_configured_gap(realistic):
    # the realistic config: each scheduler under its own placement (the clairvoyant one pins a placer)
    cfg = realistic.model_copy(update={"sim": realistic.sim.model_copy(update={"convergence_gap": 0.05})})
    sched = make_scheduler("optimus", cfg)
    assert isinstance(sched.inner, Optimus) and sched.gap == 0.05
    assert sched.placement == "optimus"  # its paper's placement, the registry's default


class _GuardedSpeed(SpeedModel):
    """The simulator's speed model, refusing to answer while a scheduler decides."""

    deciding = False

    def _speed_uncached(self, type_index, layout):
        assert not _GuardedSpeed.deciding, "a scheduler consulted the true speed model"
        return super()._speed_uncached(type_index, layout)

    def nominal_batches_per_second(self, type_index, ps, workers):
        assert not _GuardedSpeed.deciding, "a scheduler consulted the true speed model"
        return super().nominal_batches_per_second(type_index, ps, workers)


class _Watched:
    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def reset(self, seed):
        self.inner.reset(seed)

    def decide(self, view):
        _GuardedSpeed.deciding = True
        try:
            return self.inner.decide(view)
        finally:
            _GuardedSpeed.deciding = False


def test_optimus_never_consults_the_true_speed_model(testbed):
    from dl2ray.measurements import load_surfaces

    speed = _GuardedSpeed(testbed.catalogue, load_surfaces(testbed.surfaces_dir))
    speed._speed = speed._speed_uncached  # no cache: every lookup goes through the guard
    cat = testbed.catalogue
    trace = tuple(
        JobSpec(i, cat.types[i % len(cat)].name, i // 2, 0.2 * cat.types[i % len(cat)].base_epochs,
                0.2 * cat.types[i % len(cat)].base_epochs)
        for i in range(8)
    )
    sim = Simulator(testbed, speed, trace=trace)
    # Optimus is built from a convergence gap alone: it holds no speed model.
    result = run_episode(sim, _Watched(Optimus(testbed.sim.convergence_gap)), seed=3)
    assert len(result.end_time) == len(trace)
