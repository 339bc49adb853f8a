"""Per-queue metrics of a run on a shared cluster (docs/tenancy.md, "Metrics").

From the run's result and the queue layer's log (:class:`dl2ray.schedulers.queued.QueueSlot`, one per queue
and slot), per queue ``q``:

- ``avg_jct`` — censored average JCT of its jobs (slots; :func:`dl2ray.evaluation.metrics.censored_avg_jct`
  restricted to them), ``queueing_delay`` — mean slots from arrival to first run;
- ``quota_use`` — mean over the slots it had jobs of ``max_r usage_r / nominal_r`` (its dominant resource;
  1 = its whole quota), ``borrowed_share`` — mean over those slots of ``max_r max(0, usage_r − nominal_r) /
  total_r`` (the share of the cluster it held beyond its quota);
- ``violations`` — slots with ``usage > nominal + borrowing_limit`` in any resource (must be 0);
- ``reclaim_latency_p95`` — slots until the room for its guarantee was back: a slot where the other queues
  hold more than ``capacity − min(N_q, D_q)`` opens a wait, the first slot where they no longer do closes it
  (0: the room was there the slot it asked); the 95th percentile over waits (0 when none opened);
- ``shrinks``/``pauses`` — jobs taken below what they held / paused for reclaim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dl2ray.schedulers.queued import QueueSlot
from dl2ray.sim import RunResult
from dl2ray.tenancy import TenancyConfig

_EPS = 1e-9
QUEUE_METRICS = ("jobs", "avg_jct", "queueing_delay", "quota_use", "borrowed_share", "violations",
                 "reclaim_latency_p95", "shrinks", "pauses")


def _limit(q) -> np.ndarray:
    return np.full(3, np.inf) if q.borrowing_limit is None else q.borrowing_limit.as_array()


def reclaim_latencies(log: Sequence[QueueSlot], queue: str, total: np.ndarray) -> list[int]:
    """Per wait of ``queue`` (module docstring): slots from its opening to its close (an open wait at the
    end of the run counts until the last slot)."""
    slots = sorted({s.slot for s in log})
    by_slot: dict[int, list[QueueSlot]] = {t: [] for t in slots}
    for s in log:
        by_slot[s.slot].append(s)
    waits, opened = [], None
    for t in slots:
        mine = [s for s in by_slot[t] if s.queue == queue]
        if not mine:
            continue
        others = sum((s.usage for s in by_slot[t] if s.queue != queue), np.zeros(3))
        need = np.minimum(mine[0].nominal, mine[0].demand)
        short = bool(np.any(others > total - need + _EPS)) and bool(np.any(need > _EPS))
        if short and opened is None:
            opened = t
        elif not short and opened is not None:
            waits.append(t - opened)
            opened = None
        elif not short and bool(np.any(need > _EPS)):
            waits.append(0)
    if opened is not None:
        waits.append(slots[-1] - opened + 1)
    return waits


def queue_metrics(result: RunResult, queues: Mapping[int, str], log: Sequence[QueueSlot],
                  tenancy: TenancyConfig, capacity: np.ndarray) -> dict[str, dict[str, float]]:
    """Per queue name: :data:`QUEUE_METRICS` (module docstring). ``queues``: job id -> queue;
    ``capacity``: shape (N, 3)."""
    total = np.asarray(capacity, dtype=np.float64).sum(axis=0)
    stop = float(len(result.rewards))
    out: dict[str, dict[str, float]] = {}
    for q in tenancy.queues:
        ids = [j for j, name in queues.items() if name == q.name and j in result.arrival]
        rows = [s for s in log if s.queue == q.name and s.jobs > 0]
        jct = [max(result.end_time.get(j, stop) - result.arrival[j], 0.0) for j in ids]
        delays = [result.first_run[j] - result.arrival[j] for j in ids if j in result.first_run]
        nominal = q.nominal.as_array()
        use = [float(np.max(np.where(nominal > 0, s.usage / np.maximum(nominal, _EPS), 0.0))) for s in rows]
        borrowed = [float(np.max(np.maximum(s.usage - nominal, 0.0) / np.maximum(total, _EPS))) for s in rows]
        waits = reclaim_latencies(log, q.name, total)
        out[q.name] = {
            "jobs": float(len(ids)),
            "avg_jct": float(np.mean(jct)) if jct else float("nan"),
            "queueing_delay": float(np.mean(delays)) if delays else float("nan"),
            "quota_use": float(np.mean(use)) if use else 0.0,
            "borrowed_share": float(np.mean(borrowed)) if borrowed else 0.0,
            "violations": float(sum(1 for s in log if s.queue == q.name
                                    and np.any(s.usage > nominal + _limit(q) + _EPS))),
            "reclaim_latency_p95": float(np.percentile(waits, 95)) if waits else 0.0,
            "shrinks": float(sum(s.shrunk for s in rows)),
            "pauses": float(sum(s.paused for s in rows)),
        }
    return out


def flat(per_queue: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``{"queue/<name>/<metric>": value}``: per-queue metrics as run metrics (compare's JSON, aggregates)."""
    return {f"queue/{q}/{k}": v for q, row in per_queue.items() for k, v in row.items()}


def unflat(metrics: Mapping[str, float], names: Iterable[str]) -> dict[str, dict[str, float]]:
    """The inverse of :func:`flat` for the queues ``names`` (a missing metric is NaN)."""
    return {q: {k: float(metrics.get(f"queue/{q}/{k}", float("nan"))) for k in QUEUE_METRICS} for q in names}
