"""Queues on a live cluster: which queue a submitted job may join, and each queue's quota, use and borrowing
as the agent's last decision left them — the one answer ``dl2ray queues list``, the dashboard, the
``dl2ray_queue_*`` metrics and the ``queue at quota`` waiting reason (:mod:`clusters.agent.waiting`) give.

The queues are the experiment's ``tenancy:`` (:mod:`dl2ray.tenancy`, docs/tenancy.md); the quotas, borrowing
and reclaim are the queue layer's (:class:`dl2ray.schedulers.queued.Queued`), which wraps the agent's
scheduler and its guardrail's fallback alike. Resources are ``(cpu, gpu, mem)`` in cores, GPUs and GB.

A queue's *use* is what the applied allocation of the last slot gives its jobs; *borrowed* is the use beyond
its nominal quota, per resource (``max(use − nominal, 0)``); it is *at quota* for a waiting job when the
job's minimum deployment would take it past its nominal quota in a resource the job needs (the job then
waits for the cohort to lend, which the queue layer grants only while the lenders ask for less than their
quotas).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec
from dl2ray.schedulers.queued import usage_of
from dl2ray.tenancy import RESOURCE_NAMES, TenancyConfig
from dl2ray.view import Allocation, ClusterView

EPS = 1e-9


def check_job_queue(tenancy: TenancyConfig | None, spec: JobSpec) -> None:
    """UserError naming the field when ``spec``'s queue or priority class is not one of this cluster's (a
    cluster without ``tenancy:`` takes no queue and no priority)."""
    if tenancy is None:
        for field in ("queue", "priority"):
            if getattr(spec, field) is not None:
                raise UserError(f"{field}: {getattr(spec, field)!r} given, but this cluster has no queues "
                                "(its experiment config has no tenancy:)")
        return
    if spec.queue is not None and spec.queue not in tenancy.names:
        raise UserError(f"queue: {spec.queue!r} is not a queue of this cluster "
                        f"(known: {', '.join(tenancy.names)})")
    if spec.priority is not None and spec.priority not in {p.name for p in tenancy.priority_classes}:
        raise UserError(f"priority: {spec.priority!r} is not a priority class of this cluster "
                        f"(known: {', '.join(p.name for p in tenancy.priority_classes)})")


def queue_use(tenancy: TenancyConfig, view: ClusterView, allocation: Allocation) -> dict[str, np.ndarray]:
    """Per queue, shape (3,): what ``allocation`` gives the jobs of ``view`` in that queue
    (:func:`dl2ray.schedulers.queued.usage_of` over each queue's jobs; a job of no known queue counts for
    none)."""
    jobs = {j.job_id: j for j in view.jobs}
    held = {i: t for i, t in allocation.tasks.items() if i in jobs and t.workers > 0 and t.ps > 0}
    return {q: usage_of(Allocation({i: t for i, t in held.items() if tenancy.queue_of(jobs[i].queue) == q}),
                        jobs) for q in tenancy.names}


def at_quota(nominal: np.ndarray, use: np.ndarray, task: np.ndarray) -> bool:
    """Whether ``task`` (shape (3,); e.g. a job's minimum) more takes ``use`` past ``nominal`` in a resource
    the task needs."""
    need = task > EPS
    return bool(np.any(use[need] + task[need] > nominal[need] + EPS))


class QueueRow(BaseModel):
    """One queue as the last decision left it (module docstring). Resources as ``{cpu, gpu, mem}``."""

    model_config = ConfigDict(frozen=True)

    name: str
    cohort: str
    weight: float
    nominal: dict[str, float]
    borrowing_limit: dict[str, float] | None
    lending_limit: dict[str, float] | None
    used: dict[str, float]
    borrowed: dict[str, float]
    jobs: int
    running: int
    waiting: int
    slot: int | None


def _named(values: np.ndarray) -> dict[str, float]:
    return {r: round(float(v), 6) for r, v in zip(RESOURCE_NAMES, values, strict=True)}


def queue_rows(tenancy: TenancyConfig, view: ClusterView | None, allocation: Allocation | None,
               jobs: Iterable[tuple[str | None, bool]]) -> list[QueueRow]:
    """Every queue of ``tenancy`` in its order: quotas, the last decision's use and borrowing (``view`` and
    ``allocation``, None before the first slot: nothing used), and its jobs from ``jobs``: one
    ``(queue, waiting)`` per job not yet ended (:func:`clusters.agent.waiting.waits` says which wait)."""
    use = queue_use(tenancy, view, allocation) if view is not None and allocation is not None else {}
    total: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    for queue, waits in jobs:
        total[tenancy.queue_of(queue)] += 1
        waiting[tenancy.queue_of(queue)] += waits
    rows = []
    for q in tenancy.queues:
        nominal = q.nominal.as_array()
        used = use.get(q.name, np.zeros(3))
        rows.append(QueueRow(
            name=q.name, cohort=q.cohort, weight=q.weight, nominal=_named(nominal),
            borrowing_limit=_named(q.borrowing_limit.as_array()) if q.borrowing_limit else None,
            lending_limit=_named(q.lending_limit.as_array()) if q.lending_limit else None,
            used=_named(used), borrowed=_named(np.maximum(used - nominal, 0.0)),
            jobs=total[q.name], running=total[q.name] - waiting[q.name], waiting=waiting[q.name],
            slot=view.slot if view is not None else None))
    return rows


def rows_json(rows: Sequence[QueueRow]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in rows]
