"""Seeded synthetic traces drawn from ``cfg.workload``.

Every draw comes from an explicit :class:`numpy.random.Generator`.
:func:`generate_trace` spawns four independent child streams from
``SeedSequence(seed)`` — arrivals, job types, lengths, estimation error, in
that order — so changing one component's settings (say the length
distribution) leaves the other components' draws unchanged.

Time: slot ``k`` covers ``[k·slot_seconds, (k+1)·slot_seconds)`` seconds after
the trace start, and the trace starts on a Monday at 00:00 (this only matters
for the ``diurnal`` pattern).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dl2ray.config import ArrivalConfig, ConfigError, ExperimentConfig, LengthConfig
from dl2ray.tenancy import TenancyConfig
from dl2ray.workload import JobSpec, Trace, sort_trace

HOURS_PER_WEEK = 168
DIURNAL_PEAK_HOUR = 14
"""Busiest hour of every day (14:00-15:00); weekends peak at the same hour."""
WEEKEND_START_DAY = 5
"""Days 5 and 6 of the week (Saturday, Sunday) run at ``weekend_factor``."""


# -- arrivals ----------------------------------------------------------------------------


def uniform_counts(rate: float, start: int, n: int) -> np.ndarray:
    """Arrivals in slots ``start .. start+n-1`` when exactly ``rate`` jobs arrive per slot.

    The fractional part is carried over: slot ``k`` gets
    ``floor((k+1)·rate) - floor(k·rate)`` jobs (rate 0.5 → 0, 1, 0, 1, ...).
    Shape (n,), int64.
    """
    k = np.arange(start, start + n + 1, dtype=np.float64)
    # The epsilon keeps k·rate from landing just below an integer (3 × 0.1 ...).
    cum = np.floor(k * rate + 1e-9)
    return np.diff(cum).astype(np.int64)


def diurnal_profile(peak: float, weekend_factor: float) -> np.ndarray:
    """Rate multiplier per hour of the week, shape (168,), mean exactly 1.

    ``m[h] = c · day_weight(h) · exp(κ·(cos(2π(hod(h) - 14)/24) - 1))`` with
    ``day_weight`` 1 on weekdays and ``weekend_factor`` on weekends: a smooth
    daily curve (a von Mises bump, sinusoid-like for small κ) peaking at
    14:00. ``c`` normalises the mean to 1 and κ ≥ 0 is solved by bisection so
    that the busiest hour (a weekday at 14:00) is ``peak`` × the mean.

    Feasible peaks lie in ``[7/(5 + 2·weekend_factor), 168/5)``: the lower end
    is a flat weekday (weekends alone make weekdays above the mean), the upper
    end all traffic in the five weekday peak hours. Outside that range a
    :class:`~dl2ray.config.ConfigError` names the field.
    """
    hours = np.arange(HOURS_PER_WEEK)
    day_weight = np.where(hours // 24 >= WEEKEND_START_DAY, weekend_factor, 1.0)
    cos_gap = np.cos(2.0 * np.pi * (hours % 24 - DIURNAL_PEAK_HOUR) / 24.0) - 1.0

    def ratio(kappa: float) -> float:
        prof = day_weight * np.exp(kappa * cos_gap)
        return float(prof.max() / prof.mean())

    low_bound, high_bound = ratio(0.0), HOURS_PER_WEEK / 5.0
    if not low_bound - 1e-12 <= peak < high_bound:
        raise ConfigError(
            f"workload.arrivals.peak: {peak} is not reachable with weekend_factor "
            f"{weekend_factor}; it must lie in [{low_bound:.4f}, {high_bound:.1f})"
        )
    lo, hi = 0.0, 1.0
    while ratio(hi) < peak:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ratio(mid) < peak else (lo, mid)
    prof = day_weight * np.exp(hi * cos_gap)
    return prof / prof.mean()


def hour_of_week(slots: np.ndarray, slot_seconds: float) -> np.ndarray:
    """Hour of the week (0 = Monday 00:00-01:00) in which each slot starts, int64."""
    hours = np.floor(slots.astype(np.float64) * slot_seconds / 3600.0).astype(np.int64)
    return hours % HOURS_PER_WEEK


def slot_counts(
    arrivals: ArrivalConfig,
    start: int,
    n: int,
    slot_seconds: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrivals in slots ``start .. start+n-1``, capped at ``max_per_slot``. Shape (n,)."""
    if arrivals.pattern == "uniform":
        counts = uniform_counts(arrivals.rate, start, n)
    elif arrivals.pattern == "poisson":
        counts = rng.poisson(arrivals.rate, size=n)
    else:
        profile = diurnal_profile(arrivals.peak, arrivals.weekend_factor)
        slots = np.arange(start, start + n)
        counts = rng.poisson(arrivals.rate * profile[hour_of_week(slots, slot_seconds)])
    return np.minimum(counts, arrivals.max_per_slot).astype(np.int64)


def arrival_slots(
    arrivals: ArrivalConfig, num_jobs: int, slot_seconds: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival slot of each of ``num_jobs`` jobs, non-decreasing, shape (num_jobs,), int64.

    Slots are drawn in chunks until ``num_jobs`` jobs have arrived; the last
    slot keeps only as many of its arrivals as are still needed. Jobs above
    the cap are dropped, not postponed.
    """
    parts: list[np.ndarray] = []
    total, start = 0, 0
    per_slot = min(arrivals.rate, float(arrivals.max_per_slot))
    while total < num_jobs:
        n = max(64, int(np.ceil((num_jobs - total) / per_slot)) + 1)
        counts = slot_counts(arrivals, start, n, slot_seconds, rng)
        parts.append(np.repeat(np.arange(start, start + n, dtype=np.int64), counts))
        total += int(counts.sum())
        start += n
    return np.concatenate(parts)[:num_jobs]


# -- job types, lengths, estimates -------------------------------------------------------


def draw_types(num_types: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform type indices in ``[0, num_types)``, shape (n,), int64."""
    return rng.integers(0, num_types, size=n)


def length_factors(lengths: LengthConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """Multipliers of the type's ``base_epochs``, shape (n,), float64.

    ``fixed``: 1 (no draw). ``uniform``: U(low, high). ``lognormal``:
    exp(N(0, sigma)) clipped to [low, high].
    """
    if lengths.distribution == "fixed":
        return np.ones(n)
    if lengths.distribution == "uniform":
        return rng.uniform(lengths.low, lengths.high, size=n)
    return np.clip(rng.lognormal(0.0, lengths.sigma, size=n), lengths.low, lengths.high)


def estimate_epochs(true_epochs: np.ndarray, error: float, rng: np.random.Generator) -> np.ndarray:
    """User-declared epochs ``true × (1 + U(-error, error))``, same shape as ``true_epochs``.

    ``error`` must lie in [0, 1) so estimates stay positive; 0 returns a copy
    of ``true_epochs`` without drawing.
    """
    if not 0.0 <= error < 1.0:
        raise ValueError(f"epoch error must lie in [0, 1), got {error}")
    if error == 0.0:
        return np.array(true_epochs, dtype=np.float64)
    return true_epochs * (1.0 + rng.uniform(-error, error, size=np.shape(true_epochs)))


def build_jobs(
    names: tuple[str, ...],
    slots: np.ndarray,
    type_idx: np.ndarray,
    true_epochs: np.ndarray,
    est_epochs: np.ndarray,
    requested_bundles: np.ndarray | None = None,
) -> Trace:
    """Jobs with ids 0..n-1 in the given (arrival) order; ``names[type_idx[i]]`` is job i's type.

    ``requested_bundles`` (shape (n,)) sets each job's requested size; None
    leaves it unset (the config's ``workload.requested_bundles`` applies).
    """
    req = [None] * len(slots) if requested_bundles is None else [int(b) for b in requested_bundles]
    columns = zip(slots, type_idx, true_epochs, est_epochs, req, strict=True)
    jobs = [
        JobSpec(i, names[int(t)], int(s), float(tr), float(es), r)
        for i, (s, t, tr, es, r) in enumerate(columns)
    ]
    return sort_trace(jobs)


def generate_trace(cfg: ExperimentConfig, seed: int) -> Trace:
    """Exactly ``cfg.workload.num_jobs`` jobs, ids 0..n-1 in arrival order.

    Arrivals follow ``cfg.workload.arrivals`` with ``cfg.sim.slot_seconds``
    mapping slots to hours; types are uniform over ``cfg.workload.types`` (or
    the whole catalogue); ``true_epochs = base_epochs(type) × length factor``;
    ``est_epochs = true × (1 + U(-e, e))`` with ``e = cfg.workload.epoch_error``.
    Same ``cfg`` and ``seed`` → identical trace.
    """
    w = cfg.workload
    catalogue = cfg.catalogue
    names = w.types if w.types is not None else catalogue.names
    rng_arrival, rng_type, rng_length, rng_error = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    slots = arrival_slots(w.arrivals, w.num_jobs, cfg.sim.slot_seconds, rng_arrival)
    type_idx = draw_types(len(names), w.num_jobs, rng_type)
    base = np.array([catalogue.get(n).base_epochs for n in names])[type_idx]
    true_epochs = base * length_factors(w.lengths, w.num_jobs, rng_length)
    est_epochs = estimate_epochs(true_epochs, w.epoch_error, rng_error)
    trace = build_jobs(names, slots, type_idx, true_epochs, est_epochs)
    return trace if cfg.tenancy is None else assign_queues(trace, cfg.tenancy, seed)


QUEUE_STREAM = 0x7E4A
"""Entropy word of the queue draw: its own generator, so a config's traces keep every other draw."""


def assign_queues(trace: Trace, tenancy: TenancyConfig, seed: int) -> Trace:
    """Each job of ``trace`` in a queue drawn by the queues' ``share`` (generator ``[seed, QUEUE_STREAM]``),
    with its queue's priority class (None: the default class)."""
    shares = np.array([q.share for q in tenancy.queues], dtype=np.float64)
    rng = np.random.default_rng([seed, QUEUE_STREAM])
    picks = rng.choice(len(shares), size=len(trace), p=shares / shares.sum())
    return tuple(replace(j, queue=tenancy.queues[int(k)].name, priority=tenancy.queues[int(k)].priority)
                 for j, k in zip(trace, picks, strict=True))
