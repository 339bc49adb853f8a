"""The per-trace lower bound: every job alone on the cluster at its best configuration.

Not a scheduler and not deployable: it reads the simulator's true speed model,
true job lengths and each job's hidden speed factors. For job ``j`` of type ``t``::

    LB_j = true_epochs_j / ((1 + v) · max_{p ≤ max_ps, w ≤ max_workers, layout} speed_j(p, w, layout))

in slots (queueing delay 0, no deployment change, no task start), with
``speed_j`` the simulator's speed of that very job (:meth:`dl2ray.sim.Simulator._rate`)::

    speed_j = surface_t(p, w) · t_ref / (c_t · a_j + comm_t(layout) · b_j)      [batches/s]

— the type's surface times the placement factor ``t_ref / t_layout``
(``t_layout = c_t + comm_t(layout)``), divided by the job's deviation
``φ·a_j + (1 − φ)·b_j`` with ``φ = c_t / t_layout`` (``a_j``, ``b_j`` its
compute and communication factors, :func:`dl2ray.speed.job_factors`, 1 without
``speed.job_deviation``); ``v = speed.variation`` bounds the per-slot noise and
co-location interference only slows a job. Since ``a_j, b_j > 0``, the best
layout for a ``(p, w)`` is the one of least communication time, found exactly
by :func:`best_comm_time` (co-locating a job's tasks can make it faster than
the measurement setting, every task on its own node); the best ``(p, w)`` then
differs from job to job. No schedule of the trace can give job ``j`` a smaller
JCT, so the mean of ``LB_j`` bounds every scheduler's average JCT from below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.speed import ANALYTIC_PLACEMENT, PlacementModel, SpeedModel, job_factors, spread_layout
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


def best_layout_time(jt: JobType, ps: int, workers: int, groups: list[tuple[np.ndarray, int]],
                     placement: PlacementModel = ANALYTIC_PLACEMENT) -> float:
    """Smallest analytic iteration time (s) of ``workers`` + ``ps`` tasks over the cluster's nodes:
    ``compute_s + best_comm_time`` (``inf`` if the tasks fit on no layout)."""
    return jt.compute_s + best_comm_time(jt, ps, workers, groups, placement)


def best_comm_time(jt: JobType, ps: int, workers: int, groups: list[tuple[np.ndarray, int]],
                   placement: PlacementModel = ANALYTIC_PLACEMENT) -> float:
    """Smallest analytic communication time (s per iteration) of ``workers`` + ``ps`` tasks over the
    cluster's nodes.

    The analytic model's time is ``compute + max_n c_n`` with ``c_n`` the
    communication time of node ``n``, which depends only on that node's
    ``(w_n, p_n)`` and the job's totals; so the best layout minimises the
    largest ``c_n``, found exactly by dynamic programming over nodes (state:
    tasks placed so far). ``inf`` if the tasks fit on no layout.
    """
    w, p = workers, ps
    wd, pd = jt.worker.as_array(), jt.ps.as_array()
    best = np.full((w + 1, p + 1), np.inf)
    best[0, 0] = 0.0
    for cap, count in groups:
        comps = [
            (a, b, placement.node_comm_time(a, b, w, p, jt.model_size_mb, jt.bw_inter_mbps,
                                            jt.bw_intra_mbps))
            for a in range(w + 1) for b in range(p + 1)
            if (a or b) and np.all(a * wd + b * pd <= cap + _EPS)
        ]
        for _ in range(min(count, w + p)):
            nxt = best.copy()
            for a, b, cost in comps:
                cand = np.maximum(best[: w + 1 - a, : p + 1 - b], cost)
                np.minimum(nxt[a:, b:], cand, out=nxt[a:, b:])
            best = nxt
    return float(best[w, p])


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
                ref = speed.placement.iteration_time(_ref_type(speed, t), spread_layout(w, p))
                bound = _speed_at(speed, jt, base, ref, speed.network_types[t].compute_s)  # no communication
                cands.append((bound, base, ref, p, w))
        cands.sort(reverse=True)
        best = BestConfig(1, 1, 0.0)
        for bound, base, ref, p, w in cands:
            if bound <= best.epochs_per_second:
                break
            v = _speed_at(speed, jt, base, ref,
                          best_layout_time(speed.network_types[t], p, w, groups, speed.placement))
            if v > best.epochs_per_second:
                best = BestConfig(p, w, v)
        out.append(best)
    return out


def _ref_type(speed: SpeedModel, t: int) -> JobType:
    """The type ``t_ref`` is computed with: as measured (the measured model's surfaces were taken on that
    network), or as the network is now (the analytic model, whose ``base`` is ``w / t_ref`` on it)."""
    return speed.catalogue.types[t] if speed.model == "measured" else speed.network_types[t]


def _speed_at(speed: SpeedModel, jt: JobType, base: float, ref: float, layout_time: float) -> float:
    """Epochs/s of the simulator's deterministic model for a layout of iteration time ``layout_time``."""
    if not np.isfinite(layout_time):
        return 0.0
    # measured: surface × t_ref / t_layout; analytic: w / t_layout, and base = w / t_ref
    aware = speed.model == "analytic" or speed.placement_aware
    batches = base * ref / layout_time if aware else base
    return batches / jt.batches_per_epoch


class JobBounds:
    """The fastest speed (epochs/s) each job of a run can reach alone on the cluster (module docstring).

    Per type, the ``(p, w)`` candidates are kept sorted by ``surface · t_ref``; a job visits them from
    the top and stops once even a layout with no communication (``surface · t_ref / (c · a)``) cannot
    beat its best, so the layout search (:func:`best_comm_time`, cached per ``(type, p, w)``) runs for
    a few candidates per type.
    """

    def __init__(self, speed: SpeedModel, capacity: np.ndarray) -> None:
        self.speed, self.groups = speed, node_groups(capacity)
        self._cands: dict[int, list[tuple[float, int, int]]] = {}
        self._comm: dict[tuple[int, int, int], float] = {}

    def epochs_per_second(self, type_index: int, factors: tuple[float, float] = (1.0, 1.0)) -> float:
        """Largest deterministic speed of a job of type ``type_index`` with compute and communication
        time factors ``factors`` (``(a, b)``), over every ``(p, w)`` within the caps and every layout."""
        jt = self.speed.catalogue.types[type_index]
        a, b = factors
        c = self.speed.network_types[type_index].compute_s  # the compute time as the cluster runs it now
        aware = self.speed.model == "analytic" or self.speed.placement_aware
        best = 0.0
        for top, p, w in self._candidates(type_index):
            if not aware:  # the surface alone, over the smallest divisor any layout gives: min(a, b)
                best = max(best, top / min(a, b))
                continue
            if top / (c * a) <= best:
                break
            comm = self._best_comm(type_index, p, w)
            if np.isfinite(comm):
                best = max(best, top / (c * a + comm * b))
        return best / jt.batches_per_epoch

    def _candidates(self, t: int) -> list[tuple[float, int, int]]:
        """``(surface(p, w) · t_ref(p, w), p, w)`` of type ``t``, largest first (``t_ref`` 1 when the model
        is not placement-aware, so the product is the surface)."""
        if t not in self._cands:
            jt = self.speed.catalogue.types[t]
            aware = self.speed.model == "analytic" or self.speed.placement_aware
            rows = []
            for p in range(1, jt.max_ps + 1):
                for w in range(1, jt.max_workers + 1):
                    base = self.speed.nominal_batches_per_second(t, p, w)
                    ref = (self.speed.placement.iteration_time(_ref_type(self.speed, t), spread_layout(w, p))
                           if aware else 1.0)
                    rows.append((base * ref, p, w))
            self._cands[t] = sorted(rows, reverse=True)
        return self._cands[t]

    def _best_comm(self, t: int, p: int, w: int) -> float:
        key = (t, p, w)
        if key not in self._comm:
            self._comm[key] = best_comm_time(self.speed.network_types[t], p, w, self.groups,
                                             self.speed.placement)
        return self._comm[key]


def lower_bound_jcts(trace: Trace, speed: SpeedModel, capacity: np.ndarray, slot_seconds: float,
                     seed: int = 0, deviation: float = 0.0, variation: float = 0.0) -> dict[int, float]:
    """Per job id: ``LB_j`` in slots (see the module docstring). ``seed`` is the run's (it draws each job's
    factors, :func:`dl2ray.speed.job_factors`, as the simulator does), ``deviation`` and ``variation``
    the config's ``speed.job_deviation`` and ``speed.variation``."""
    bounds = JobBounds(speed, capacity)
    cat = speed.catalogue
    out = {}
    for job in trace:
        factors = job_factors(seed, job.job_id, deviation)
        v = bounds.epochs_per_second(cat.index(job.job_type), factors) * (1.0 + variation)
        out[job.job_id] = job.true_epochs / (v * slot_seconds) if v > 0 else float("inf")
    return out
