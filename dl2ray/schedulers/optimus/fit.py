"""Optimus's two online models, fitted from observations only.

Peng et al., "Optimus: An Efficient Dynamic Resource Scheduler for Deep
Learning Clusters", EuroSys 2018, §3.1-3.2.

Convergence (per job), with ``k`` the cumulative epochs at the end of each
observed slot and ``l`` the loss reported then::

    l(k) = 1 / (b0·k + b1) + b2,      b0, b1, b2 ≥ 0

For a fixed ``b2 < min l`` the curve is a line ``1/(l - b2) = b0·k + b1``,
solved by least squares in closed form; a ``b2`` whose solution leaves the
open quadrant ``b0, b1 > 0`` (where the NNLS optimum would sit on an axis: a
flat curve or an infinite initial loss) is rejected. ``b2`` is searched on a
grid over ``[0, min l)``, refined around the best candidate by the squared
residual in loss space. The job converges when its gap
``l - b2`` has shrunk to ``δ`` of the initial gap ``1/b1``, i.e. at
``k* = b1·(1/δ - 1) / b0`` epochs.

Speed (per job type), Optimus's form in epochs/s for ``p`` PS, ``w`` workers
and per-worker batch ``B`` (see :func:`dl2ray.measurements.optimus_features`)::

    f(p, w) = w / (θ0·B + θ1 + θ2·w/p + θ3·w + θ4·p),      θ ≥ 0

fitted by NNLS of the step time ``w / speed`` on the features. Repeated
observations of one ``(p, w)`` are collapsed to their mean step time with
weight √count, which is the same least-squares problem as fitting every
observation (:func:`dl2ray.measurements.fit_optimus_speed`) in bounded memory.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from dl2ray.measurements import optimus_features

PRIOR_THETA = (0.0, 1.0, 1.0, 0.5, 0.0)
"""Shape of the speed prior, scaled to the observed step time: compute, PS
traffic ``w/p`` and a per-worker synchronisation cost equal to half the
compute at (1, 1). It promises a modest speed-up — 1.25× for one more worker
or PS at (1, 1), 3.75× at (12, 12) — so an unmeasured type never outbids a
measured one by optimism, yet every single addition still shows a gain and
the type gets measured at new (p, w) points."""


# -- convergence ------------------------------------------------------------------------


MAX_LOSS_POINTS = 32
"""Longer loss histories are thinned to this many evenly spaced points (first
and last kept), bounding the cost of a fit for long-running jobs."""


def fit_loss_curve(
    k: np.ndarray, loss: np.ndarray, grid: int = 12, rounds: int = 4
) -> tuple[float, float, float] | None:
    """``(b0, b1, b2)`` of ``loss = 1/(b0·k + b1) + b2``; None if degenerate.

    ``k`` and ``loss`` have shape (n,). Degenerate: fewer than 3 distinct
    ``k``, a non-positive loss, or a best fit on the NNLS boundary (``b0 = 0``:
    a flat curve; ``b1 = 0``: an infinite initial loss).
    """
    return fit_loss_curves([k], [loss], grid, rounds)[0]


def fit_loss_curves(
    ks: list[np.ndarray], losses: list[np.ndarray], grid: int = 12, rounds: int = 4
) -> list[tuple[float, float, float] | None]:
    """:func:`fit_loss_curve` for many jobs at once (one padded batch, no per-job loop)."""
    out: list[tuple[float, float, float] | None] = [None] * len(ks)
    rows = []
    for i, (k, loss) in enumerate(zip(ks, losses, strict=True)):
        k = np.asarray(k, dtype=np.float64)
        loss = np.asarray(loss, dtype=np.float64)
        if len(k) >= 3 and np.unique(k).size >= 3 and loss.min() > 0:
            if len(k) > MAX_LOSS_POINTS:
                keep = np.linspace(0, len(k) - 1, MAX_LOSS_POINTS).round().astype(int)
                k, loss = k[keep], loss[keep]
            rows.append((i, k, loss))
    for start in range(0, len(rows), 256):  # bounded memory: (256, grid, 64) floats
        chunk = rows[start:start + 256]
        fits = _fit_batch([r[1] for r in chunk], [r[2] for r in chunk], grid, rounds)
        for (i, _, _), fit in zip(chunk, fits, strict=True):
            out[i] = fit
    return out


MIN_DROP = 1e-3
"""A fit whose gap shrinks by less than this fraction over the observed
epochs is degenerate: extrapolating a flat curve to ``δ`` means nothing."""


def _fit_batch(ks, losses, grid: int, rounds: int) -> list[tuple[float, float, float] | None]:
    n = max(len(k) for k in ks)
    mask = np.zeros((len(ks), n))
    k = np.ones((len(ks), n))
    loss = np.ones((len(ks), n))
    for i, (ki, li) in enumerate(zip(ks, losses, strict=True)):
        mask[i, :len(ki)], k[i, :len(ki)], loss[i, :len(li)] = 1.0, ki, li
        loss[i, len(li):] = li.min() + 1.0  # padding: finite, above every b2, masked
    lmin = np.where(mask > 0, loss, np.inf).min(axis=1)
    lo, hi = np.zeros(len(ks)), lmin.copy()
    best = np.full((len(ks), 4), np.inf)  # b0, b1, b2, sse
    frac = np.arange(grid) / grid
    step = lmin / grid
    for _ in range(rounds):
        b2 = lo[:, None] + (hi - lo)[:, None] * frac[None, :]  # (J, G)
        _keep_best(best, b2, *_lines(k, loss, mask, b2))
        step = (hi - lo) / grid
        centre = np.where(np.isfinite(best[:, 3]), best[:, 2], (lo + hi) / 2)
        lo, hi = np.maximum(centre - 2 * step, 0.0), np.minimum(centre + 2 * step, lmin)
    _parabolic_step(best, step, lmin, k, loss, mask)
    span = np.where(mask > 0, k, -np.inf).max(axis=1) - np.where(mask > 0, k, np.inf).min(axis=1)
    ok = np.isfinite(best).all(axis=1) & (best[:, 0] > 0) & (best[:, 1] > 0)
    ok &= best[:, 0] * span >= MIN_DROP * best[:, 1]
    return [
        (float(b[0]), float(b[1]), float(b[2])) if good else None
        for b, good in zip(best, ok, strict=True)
    ]


def _keep_best(best, b2, b0, b1, sse) -> None:
    """Update ``best`` rows (b0, b1, b2, sse) in place with each row's best candidate."""
    rows = np.arange(len(best))
    g = np.argmin(sse, axis=1)
    cand = np.stack([b0[rows, g], b1[rows, g], b2[rows, g], sse[rows, g]], axis=1)
    better = cand[:, 3] < best[:, 3]
    best[better] = cand[better]


def _parabolic_step(best, step, lmin, k, loss, mask) -> None:
    """One parabola through the residuals at ``b2 - h, b2, b2 + h``; keep its vertex if better."""
    h = step[:, None] * np.array([-1.0, 0.0, 1.0])[None, :]
    b2 = np.clip(best[:, 2:3] + h, 0.0, lmin[:, None] * (1 - 1e-12))
    _, _, sse = _lines(k, loss, mask, b2)
    with np.errstate(invalid="ignore", divide="ignore"):
        curv = sse[:, 0] - 2 * sse[:, 1] + sse[:, 2]
        shift = np.where(curv > 0, 0.5 * step * (sse[:, 0] - sse[:, 2]) / curv, 0.0)
    shift = np.nan_to_num(np.clip(shift, -step, step))
    vertex = np.clip(best[:, 2] + shift, 0.0, lmin * (1 - 1e-12))[:, None]
    _keep_best(best, vertex, *_lines(k, loss, mask, vertex))


def _lines(
    k: np.ndarray, loss: np.ndarray, mask: np.ndarray, b2: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job and candidate ``b2`` (shape (J, G)): ``(b0, b1)`` and the loss-space SSE.

    ``k``, ``loss``, ``mask`` have shape (J, n); padded entries have mask 0.
    """
    y = mask[:, None, :] / (loss[:, None, :] - b2[:, :, None])  # (J, G, n)
    km = k * mask
    count = mask.sum(axis=1)[:, None]
    sk, skk = km.sum(axis=1)[:, None], (km * km).sum(axis=1)[:, None]
    sy = y.sum(axis=2)
    sky = np.einsum("jgn,jn->jg", y, km)
    ybar = sy / count
    b0 = (sky - sk * ybar) / (skk - sk * sk / count)
    b1 = ybar - b0 * sk / count
    # Off the feasible quadrant the NNLS optimum lies on an axis (b0 = 0: a
    # flat curve; b1 = 0: infinite initial loss), which the model excludes:
    # such b2 candidates get an infinite residual. Clamping keeps them finite.
    inside = (b0 > 0) & (b1 > 0)
    b0 = np.where(inside, b0, 1.0)
    b1 = np.where(inside, b1, 1.0)
    err = (1.0 / (b0[:, :, None] * k[:, None, :] + b1[:, :, None]) + b2[:, :, None]
           - loss[:, None, :]) * mask[:, None, :]
    return b0, b1, np.where(inside, np.einsum("jgn,jgn->jg", err, err), np.inf)


def convergence_epochs(b0: float, b1: float, gap: float) -> float:
    """``k* = b1·(1/δ - 1)/b0``: epochs at which ``l - b2`` is ``δ`` of ``1/b1``."""
    return b1 * (1.0 / gap - 1.0) / b0


# -- speed -------------------------------------------------------------------------------


class SpeedFit:
    """Observed step times of one job type and the θ fitted to them.

    :meth:`coefficients` returns ``(c, t2, t3, t4)`` with step time
    ``c + t2·w/p + t3·w + t4·p`` (``c = θ0·B + θ1``) in worker·seconds per
    epoch, so ``f(p, w) = w / step`` is in epochs/s. Before observations at 2
    distinct ``(p, w)`` points it is :data:`PRIOR_THETA` scaled to the mean
    step time observed (or to ``default_step`` at (1, 1) with none).
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._sum: dict[tuple[int, int], float] = {}
        self._count: dict[tuple[int, int], int] = {}
        self._coef: tuple[float, float, float, float] | None = None

    @property
    def observed(self) -> bool:
        return bool(self._count)

    @property
    def points(self) -> int:
        """Distinct ``(p, w)`` observed."""
        return len(self._count)

    def mean_ratio(self, step) -> float:
        """Mean over the observed ``(p, w)`` of observed mean step time / ``step(p, w)`` (1 if none)."""
        if not self._count:
            return 1.0
        ratios = [self._sum[k] / self._count[k] / step(*k) for k in self._count]
        return float(np.mean(ratios))

    def add(self, ps: int, workers: int, epochs_per_second: float) -> None:
        self.add_many(((ps, workers, epochs_per_second),))

    def add_many(self, points) -> None:
        """Add ``(ps, workers, epochs_per_second)`` triples (speeds > 0)."""
        total, count = self._sum, self._count
        for p, w, speed in points:
            key = (p, w)
            total[key] = total.get(key, 0.0) + w / speed
            count[key] = count.get(key, 0) + 1
        self._coef = None

    def coefficients(self, default_step: float) -> tuple[float, float, float, float]:
        if not self._count:
            return _prior(1, 1, default_step, self.batch_size)
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple[float, float, float, float]:
        keys = list(self._count)
        mean = np.array([self._sum[x] / self._count[x] for x in keys])
        if len(keys) < 2:
            (p, w), = keys
            return _prior(p, w, float(mean[0]), self.batch_size)
        ps = np.array([x[0] for x in keys])
        ws = np.array([x[1] for x in keys])
        weight = np.sqrt(np.array([self._count[x] for x in keys], dtype=np.float64))
        a = optimus_features(ps, ws, np.full(len(keys), self.batch_size))
        theta, _ = nnls(a * weight[:, None], mean * weight)
        if not theta.any():  # cannot happen for positive step times; keep f finite
            return _prior(int(ps[0]), int(ws[0]), float(mean[0]), self.batch_size)
        return _coefficients(theta, self.batch_size)


def _coefficients(theta, batch: int) -> tuple[float, float, float, float]:
    t = [float(x) for x in theta]
    return t[0] * batch + t[1], t[2], t[3], t[4]


def _prior(p: int, w: int, step: float, batch: int) -> tuple[float, float, float, float]:
    """:data:`PRIOR_THETA` scaled so the step time at ``(p, w)`` is ``step``."""
    c, t2, t3, t4 = _coefficients(PRIOR_THETA, batch)
    scale = step / (c + t2 * w / p + t3 * w + t4 * p)
    return c * scale, t2 * scale, t3 * scale, t4 * scale


def step_time(coef: tuple[float, float, float, float], p: int, w: int) -> float:
    """Step time (worker·s/epoch) of ``coef`` at ``(p, w)``; speed is ``w / step``."""
    c, t2, t3, t4 = coef
    return c + t2 * w / p + t3 * w + t4 * p
