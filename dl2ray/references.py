"""The per-trace lower bound: every job alone on the cluster at its best configuration.

Not a scheduler and not deployable: it reads the simulator's true speed model
and true job lengths. For job ``j`` of type ``t``::

    LB_j = true_epochs_j / max_{p ≤ max_ps, w ≤ max_workers, layout} speed_t(p, w, layout)

in slots (queueing delay 0, no deployment change), with ``speed`` the
simulator's deterministic speed (:class:`~dl2ray.speed.SpeedModel`, without
variation or interference noise): ``surface_t(p, w) × t_ref / t_layout`` for
the measured model. The layout is the best one the cluster's nodes allow, found
exactly for the analytic PS model by :func:`best_layout_time` — co-locating a
job's tasks can make it faster than the measurement setting (every task on its
own node), so the bound searches layouts too. No schedule of the trace can
give job ``j`` a smaller JCT, so the mean of ``LB_j`` bounds every
scheduler's average JCT from below (up to the speed noise of configs with
``speed.variation`` > 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.speed import SpeedModel, analytic_iteration_time, spread_layout
from dl2ray.workload import JobType, Trace

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class BestConfig:
    """Fastest ``(ps, workers)`` of one job type alone on the cluster, and its speed (epochs/s)."""

    ps: int
    workers: int
    epochs_per_second: float


def node_groups(capacity: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """Distinct node capacities (shape (3,)) and how many nodes have each."""
    rows, counts = np.unique(np.asarray(capacity, dtype=np.float64), axis=0, return_counts=True)
    return [(r, int(c)) for r, c in zip(rows, counts, strict=True)]


def best_layout_time(jt: JobType, ps: int, workers: int,
                     groups: list[tuple[np.ndarray, int]]) -> float:
    """Smallest analytic iteration time (s) of ``workers`` + ``ps`` tasks over the cluster's nodes.

    The analytic model's time is ``compute + max_n c_n`` with ``c_n`` the
    communication time of node ``n``, which depends only on that node's
    ``(w_n, p_n)`` and the job's totals; so the best layout minimises the
    largest ``c_n``, found exactly by dynamic programming over nodes (state:
    tasks placed so far). ``inf`` if the tasks fit on no layout.
    """
    w, p = workers, ps
    shard = 2.0 * jt.model_size_mb / p
    wd, pd = jt.worker.as_array(), jt.ps.as_array()
    best = np.full((w + 1, p + 1), np.inf)
    best[0, 0] = 0.0
    for cap, count in groups:
        comps = [
            (a, b, max(shard * (a * (p - b) + b * (w - a)) / jt.bw_inter_mbps,
                       shard * a * b / jt.bw_intra_mbps))
            for a in range(w + 1) for b in range(p + 1)
            if (a or b) and np.all(a * wd + b * pd <= cap + _EPS)
        ]
        for _ in range(min(count, w + p)):
            nxt = best.copy()
            for a, b, cost in comps:
                cand = np.maximum(best[: w + 1 - a, : p + 1 - b], cost)
                np.minimum(nxt[a:, b:], cand, out=nxt[a:, b:])
            best = nxt
    return jt.compute_s + float(best[w, p])


def best_configs(speed: SpeedModel, capacity: np.ndarray) -> list[BestConfig]:
    """Per catalogue type: the fastest ``(ps, workers)`` within its caps and the best layout.

    Candidates are visited from the fastest measured speed down and skipped once
    even the most favourable layout (no communication at all) could not beat the
    best found, so the layout search runs for a few candidates per type.
    """
    groups = node_groups(capacity)
    out = []
    for t, jt in enumerate(speed.catalogue.types):
        cands = []
        for p in range(1, jt.max_ps + 1):
            for w in range(1, jt.max_workers + 1):
                base = speed.nominal_batches_per_second(t, p, w)
                ref = analytic_iteration_time(jt, spread_layout(w, p))
                bound = _speed_at(speed, jt, base, ref, jt.compute_s)
                cands.append((bound, base, ref, p, w))
        cands.sort(reverse=True)
        best = BestConfig(1, 1, 0.0)
        for bound, base, ref, p, w in cands:
            if bound <= best.epochs_per_second:
                break
            v = _speed_at(speed, jt, base, ref, best_layout_time(jt, p, w, groups))
            if v > best.epochs_per_second:
                best = BestConfig(p, w, v)
        out.append(best)
    return out


def _speed_at(speed: SpeedModel, jt: JobType, base: float, ref: float, layout_time: float) -> float:
    """Epochs/s of the simulator's deterministic model for a layout of iteration time ``layout_time``."""
    if not np.isfinite(layout_time):
        return 0.0
    # measured: surface × t_ref / t_layout; analytic: w / t_layout, and base = w / t_ref
    aware = speed.model == "analytic" or speed.placement_aware
    batches = base * ref / layout_time if aware else base
    return batches / jt.batches_per_epoch


def lower_bound_jcts(trace: Trace, speed: SpeedModel, capacity: np.ndarray,
                     slot_seconds: float) -> dict[int, float]:
    """Per job id: ``LB_j`` in slots (see the module docstring)."""
    best = best_configs(speed, capacity)
    cat = speed.catalogue
    out = {}
    for job in trace:
        v = best[cat.index(job.job_type)].epochs_per_second
        out[job.job_id] = job.true_epochs / (v * slot_seconds) if v > 0 else float("inf")
    return out
