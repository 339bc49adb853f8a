"""Shadow mode and the guardrail: a scheduler wrapper between ``decide`` and ``apply``.

:class:`GuardedScheduler` is itself a scheduler (``decide(view) -> Allocation``),
so a backend never knows it is there. Every slot it asks the policy; then

* **guardrail**: if the policy raised, did not answer within ``time_budget_s``
  (it runs in a worker thread; a late answer is dropped, and while it is still
  running the next slots use the fallback), or returned an allocation that
  :func:`violation` rejects (unknown job, negative counts, caps, capacity), the
  fallback heuristic's allocation is used for that slot, and the event is
  logged and counted by reason;
* **shadow**: the policy's allocation is recorded but the fallback's is applied;
* **refusal**: a remote policy (``serve:URL``) that is overloaded refuses the
  view (:class:`~dl2ray.errors.Refused`); the fallback decides that slot, counted
  as ``refused`` — not an error, and never a lost slot. A policy that can be
  refused offers ``decide_or_refuse``, which the guardrail calls instead of
  ``decide``, so its own fallback (not the client's) decides.

Each slot becomes one row of :class:`DecisionLog` (both allocations, which
one was applied, why, decision time), written to Parquet for
``dl2ray cluster report``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dl2ray.errors import Refused
from dl2ray.schedulers.base import Scheduler
from dl2ray.view import Allocation, ClusterView

log = logging.getLogger(__name__)


def violation(view: ClusterView, alloc: Allocation) -> str | None:
    """Why ``alloc`` cannot be applied to ``view`` (None if it can): unknown job, caps, capacity."""
    jobs = {j.job_id: j for j in view.jobs}
    need = np.zeros(3)
    for job_id, t in alloc.tasks.items():
        j = jobs.get(job_id)
        if j is None:
            return f"job {job_id} is not in the view"
        if t.workers > j.max_workers or t.ps > j.max_ps:
            return (f"job {job_id}: {t.workers} workers / {t.ps} PS exceed its caps "
                    f"({j.max_workers}/{j.max_ps})")
        need += t.workers * j.worker_demand + t.ps * j.ps_demand
    if alloc.placement is not None:
        return _placement_violation(view, alloc, jobs)
    if (need > view.free.sum(axis=0) + 1e-9).any():
        return "allocation exceeds the cluster's free capacity"
    return None


def _placement_violation(view: ClusterView, alloc: Allocation, jobs: dict) -> str | None:
    """Per-node capacity of an allocation with explicit placement."""
    assert alloc.placement is not None
    usage = np.zeros_like(view.free)
    for job_id, pl in alloc.placement.items():
        j, t = jobs.get(job_id), alloc.tasks.get(job_id)
        if j is None or t is None or len(pl.worker_nodes) != t.workers or len(pl.ps_nodes) != t.ps:
            return f"job {job_id}: placement does not match its task counts"
        for n in (*pl.worker_nodes, *pl.ps_nodes):
            if not 0 <= n < view.num_nodes:
                return f"job {job_id}: no node {n}"
        for n in pl.worker_nodes:
            usage[n] += j.worker_demand
        for n in pl.ps_nodes:
            usage[n] += j.ps_demand
    over = np.argwhere(usage > view.free + 1e-9)
    if len(over):
        return f"node {int(over[0][0])}: {('cpu', 'gpu', 'mem')[int(over[0][1])]} over capacity"
    return None


def alloc_dict(alloc: Allocation | None) -> dict[str, list[int]] | None:
    """``{job_id: [ps, workers]}`` (JSON-friendly)."""
    if alloc is None:
        return None
    return {str(k): [int(t.ps), int(t.workers)] for k, t in sorted(alloc.tasks.items())}


@dataclass
class DecisionLog:
    """One row per slot; :meth:`write` rewrites ``path`` (Parquet) with every row so far."""

    path: Path | None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def write(self) -> None:
        if self.path is None or not self.rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        # Every key of every row is a column (pyarrow takes the columns of the first row only, which
        # dropped the ``error`` of a failed slot whenever the first slot had none).
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        pq.write_table(pa.Table.from_pydict({k: [row.get(k) for row in self.rows] for k in keys}), tmp)
        tmp.replace(self.path)


class GuardedScheduler:
    """``policy`` behind the guardrail (and in shadow mode, never applied). Module docstring."""

    def __init__(self, policy: Scheduler, fallback: Scheduler, time_budget_s: float = 5.0,
                 shadow: bool = False, decisions: DecisionLog | None = None) -> None:
        self.policy, self.fallback = policy, fallback
        self.time_budget_s, self.shadow = time_budget_s, shadow
        self.name = f"{'shadow' if shadow else 'guarded'}({policy.name}, fallback {fallback.name})"
        self.decisions = decisions or DecisionLog(None)
        self.fallbacks: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self._running: Future | None = None

    def decide(self, view: ClusterView) -> Allocation:
        t0 = time.perf_counter()
        proposed, reason = self._ask_policy(view)
        policy_ms = (time.perf_counter() - t0) * 1e3
        if reason is None and proposed is not None:
            reason = violation(view, proposed)
            if reason is not None:
                reason = f"invalid: {reason}"
        fallback = self.fallback.decide(view) if (reason is not None or self.shadow) else None
        if reason is not None:
            if hasattr(self.policy, "rejected"):
                self.policy.rejected()  # a learning policy drops the slot: its actions were not applied
            kind = reason.split(":", 1)[0]
            self.fallbacks[kind] += 1
            log.warning("slot %d: guardrail: %s; applying %s", view.slot, reason, self.fallback.name)
        applied = fallback if fallback is not None else proposed
        assert applied is not None
        self.decisions.add({
            "slot": view.slot, "time": time.time(), "jobs": len(view.jobs),
            "policy": self.policy.name, "fallback": self.fallback.name,
            "policy_alloc": json.dumps(alloc_dict(proposed)),
            "fallback_alloc": json.dumps(alloc_dict(fallback)),
            "applied": "fallback" if fallback is not None else "policy",
            "reason": reason or ("shadow" if self.shadow else ""), "policy_ms": policy_ms,
        })
        return applied

    def _ask_policy(self, view: ClusterView) -> tuple[Allocation | None, str | None]:
        if self._running is not None and not self._running.done():
            return None, "timeout: the policy's previous decision is still running"
        ask = getattr(self.policy, "decide_or_refuse", self.policy.decide)
        self._running = self._pool.submit(ask, view)
        try:
            return self._running.result(timeout=self.time_budget_s), None
        except FutureTimeout:
            return None, f"timeout: no decision within {self.time_budget_s:g} s"
        except Refused as exc:
            return None, f"refused: {exc}"
        except Exception as exc:  # any policy error must fall back, never stop the cluster
            return None, f"error: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
