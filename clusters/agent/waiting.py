"""Why a live job waits, and where it is in the queue: read from the agent's last decision. The one answer
``dl2ray jobs list``/``jobs status`` (:mod:`clusters.ray.agent`), the dashboard
(:mod:`clusters.agent.dashboard`) and the ``dl2ray_queue_length`` metric (:func:`waits`) give.

A job *waits* while it is ``pending`` (never started), ``paused`` (the scheduler
took its workers away; one PS keeps its state), or ``running`` with no worker
yet (its first members are starting). Waiting jobs are numbered 1, 2, ... in
the agent's order (the order of the view the schedulers get: submission
order). The reason is one of :data:`REASONS`, decided from the last slot's
view (what the scheduler saw: free resources per node), its applied
allocation and the backend's report of what it did with it:

* ``waiting for its first slot``: submitted after the last decision;
* ``members starting``: the job was given tasks and its members are starting
  (a scale operation in flight, or running with no worker yet);
* ``paused by the scheduler``: a paused job the allocation gave nothing;
* ``queue at quota``: on a shared cluster (:mod:`clusters.agent.queues`), given
  nothing while its queue holds its nominal quota: the job's minimum would
  take the queue past it (the queue layer lent it nothing);
* ``no free resources``: given nothing, and the jobs the scheduler kept or
  started leave no node room for even one of its PS or one of its workers;
* ``min demand does not fit``: given nothing (or given tasks that placement
  could not fit), and the room they leave per node cannot hold its minimum
  (``ps_count.min`` PS and ``workers.min`` workers, first fit);
* ``scheduler gave it 0``: its minimum fits in the room left, the scheduler
  gave it nothing (its policy prefers to leave the room free);
* ``start refused``: the backend tried to start it and the job host refused.

The room left is :func:`room_after`: the view's ``free`` (what the scheduler
may give out, since every slot reallocates every job) less every task of the
allocation, on its node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from clusters.agent.queues import at_quota, queue_use
from clusters.agent.reports import ApplyReport
from dl2ray.tenancy import TenancyConfig
from dl2ray.view import Allocation, ClusterView

FIRST_SLOT = "waiting for its first slot"
STARTING = "members starting"
PAUSED = "paused by the scheduler"
NO_RESOURCES = "no free resources"
MIN_DOES_NOT_FIT = "min demand does not fit"
GIVEN_ZERO = "scheduler gave it 0"
REFUSED = "start refused"
AT_QUOTA = "queue at quota"
REASONS = (FIRST_SLOT, STARTING, PAUSED, AT_QUOTA, NO_RESOURCES, MIN_DOES_NOT_FIT, GIVEN_ZERO, REFUSED)
EPS = 1e-9


@dataclass(frozen=True)
class LastDecision:
    """One slot's decision as the agent made it: the view, the allocation applied, the backend's report;
    ``tenancy``: the cluster's queues (None: one pool)."""

    view: ClusterView
    allocation: Allocation
    report: ApplyReport
    tenancy: TenancyConfig | None = None

    @cached_property
    def queue_use(self) -> dict[str, np.ndarray]:
        """Per queue, what the applied allocation gives its jobs ({} on one pool; computed once)."""
        if self.tenancy is None:
            return {}
        return queue_use(self.tenancy, self.view, self.allocation)


@dataclass(frozen=True)
class WaitingJob:
    """What the reasons need of a job: its state and the demands of its minimum deployment.

    ``ps_demand``/``worker_demand``: shape (3,), (cpu, gpu, mem GB) of one task; ``busy``: a scale
    operation of the job is running; ``workers``: workers in its running plan.
    """

    name: str
    job_id: int
    state: str
    workers: int
    busy: bool
    ps_min: int
    workers_min: int
    ps_demand: np.ndarray
    worker_demand: np.ndarray
    queue: str | None = None

    @classmethod
    def from_status(cls, st: dict[str, Any]) -> WaitingJob:
        """From a job host's ``status()`` (its ``spec`` is the job spec as JSON)."""
        spec = st["spec"]

        def demand(d: dict[str, float]) -> np.ndarray:
            return np.array([d.get("cpu", 1.0), d.get("gpu", 0.0), d.get("mem", 1.0)], dtype=np.float64)

        return cls(st["name"], int(st["job_id"]), st["state"], int(st["workers"]), bool(st.get("busy")),
                   int(spec["ps_count"]["min"]), int(spec["workers"]["min"]), demand(spec["ps"]),
                   demand(spec["worker"]), spec.get("queue"))

    @property
    def waiting(self) -> bool:
        return waits(self.state, self.workers)


def waits(state: str, workers: int) -> bool:
    """Whether a job in ``state`` with ``workers`` in its running plan waits (module docstring)."""
    return state in ("pending", "paused") or (state == "running" and workers == 0)


def fits(free: np.ndarray, tasks: Sequence[np.ndarray]) -> bool:
    """Whether ``tasks`` (each shape (3,)) fit into ``free`` (shape (N, 3)) placed first fit, biggest
    task first (a task never spans nodes)."""
    room = free.copy()
    for t in sorted(tasks, key=lambda d: -float(d.sum())):
        node = first_fit(room, t)
        if node is None:
            return False
        room[node] -= t
    return True


def first_fit(room: np.ndarray, task: np.ndarray) -> int | None:
    """The first node of ``room`` (shape (N, 3)) with room for ``task`` (shape (3,)), or None."""
    ok = np.flatnonzero(np.all(room + EPS >= task, axis=1))
    return int(ok[0]) if ok.size else None


def room_after(view: ClusterView, allocation: Allocation) -> np.ndarray:
    """Shape (N, 3): the room per node once ``allocation`` runs. The view's ``free`` is what the scheduler
    may give out (every slot reallocates every job); each allocated task is charged on the node the
    allocation names for it, else on a node the job's tasks of that role run on now, else first fit (a
    task that fits nowhere is left out: the backend cuts it too)."""
    room = view.free.copy()
    jobs = {v.job_id: v for v in view.jobs}
    for job_id, t in allocation.tasks.items():
        v = jobs.get(job_id)
        if v is None or t.workers <= 0 or t.ps <= 0:
            continue
        wish = (allocation.placement or {}).get(job_id)
        for n, demand, wished, now in ((t.ps, v.ps_demand, wish.ps_nodes if wish else (), v.ps_nodes),
                                       (t.workers, v.worker_demand, wish.worker_nodes if wish else (),
                                        v.worker_nodes)):
            nodes = list(wished) or list(now)
            for k in range(n):
                node = nodes[k] if k < len(nodes) and k < len(room) else None
                if node is None or not np.all(room[node] + EPS >= demand):
                    node = first_fit(room, demand)
                if node is not None:
                    room[node] -= demand
    return room


def _fmt(d: np.ndarray) -> str:
    return f"(cpu {d[0]:g}, gpu {d[1]:g}, mem {d[2]:g} GB)"


def reason(job: WaitingJob, last: LastDecision | None) -> tuple[str, str]:
    """``(reason, detail)`` of one waiting job (module docstring)."""
    if job.busy or job.state == "running":  # also while the decision that started it is still applied
        return STARTING, "given tasks; its members are starting"
    seen = last is not None and any(v.job_id == job.job_id for v in last.view.jobs)
    if last is None or not seen:
        return FIRST_SLOT, "submitted after the agent's last decision"
    free = room_after(last.view, last.allocation)
    minimum = [job.ps_demand] * job.ps_min + [job.worker_demand] * job.workers_min
    need = f"{job.ps_min} PS {_fmt(job.ps_demand)} + {job.workers_min} workers {_fmt(job.worker_demand)}"
    largest = _fmt(free.max(axis=0)) if len(free) else "(no nodes)"  # most room on a node, per resource
    t = last.allocation.tasks.get(job.job_id)
    if t is not None and t.workers > 0 and t.ps > 0:
        action = next((a for a in last.report.actions if a.job == job.name), None)
        if job.name in last.report.skipped_busy or (action is not None and action.ok is None):
            return STARTING, f"given {t.ps} PS + {t.workers} workers; its members are starting"
        if action is not None and action.ok is False:
            return REFUSED, f"given {t.ps} PS + {t.workers} workers; the job host refused: {action.reason}"
        return MIN_DOES_NOT_FIT, (f"given {t.ps} PS + {t.workers} workers, placement found no room; "
                                  f"needs {need}, most left on a node {largest}")
    quota = _at_quota(job, last)
    if quota is not None:
        return AT_QUOTA, quota
    if job.state == "paused":
        return PAUSED, f"the scheduler gave it nothing in slot {last.view.slot}"
    if not (fits(free, [job.ps_demand]) and fits(free, [job.worker_demand])):
        return NO_RESOURCES, f"no node has room for one PS {_fmt(job.ps_demand)} and one worker " \
                             f"{_fmt(job.worker_demand)}; most left on a node {largest}"
    if not fits(free, minimum):
        return MIN_DOES_NOT_FIT, f"needs {need}; most left on a node {largest}"
    return GIVEN_ZERO, f"its minimum ({need}) fit; the scheduler gave it nothing in slot {last.view.slot}"


def _at_quota(job: WaitingJob, last: LastDecision) -> str | None:
    """The detail of ``queue at quota`` when the job's minimum (``ps_min`` PS and ``workers_min`` workers)
    would take its queue past its nominal quota after the last decision (it could run only on borrowed
    resources, which the queue layer did not grant); else None."""
    tenancy = last.tenancy
    if tenancy is None:
        return None
    name = tenancy.queue_of(job.queue)
    nominal = tenancy.queue(name).nominal.as_array()
    used = last.queue_use[name]
    minimum = job.ps_min * job.ps_demand + job.workers_min * job.worker_demand
    if not at_quota(nominal, used, minimum):
        return None
    borrowed = np.maximum(used - nominal, 0.0)
    return (f"queue {name} uses {_fmt(used)} of its nominal quota {_fmt(nominal)}"
            + (f", {_fmt(borrowed)} of it borrowed" if np.any(borrowed > EPS) else "")
            + f"; the job's minimum {_fmt(minimum)} would pass it")


def queue(statuses: Sequence[dict[str, Any]], last: LastDecision | None) -> dict[str, dict[str, Any]]:
    """Job name → ``{position, waiting, reason, detail, slot}`` for every waiting job among ``statuses``
    (job host statuses); ``position`` counts from 1 in the agent's order (submission order),
    ``waiting`` is the number of waiting jobs, ``slot`` the slot of the decision read (None: none yet)."""
    order = sorted(statuses, key=lambda s: s["submitted_at"])
    waiting = [j for j in (WaitingJob.from_status(s) for s in order) if j.waiting]
    slot = last.view.slot if last is not None else None
    out = {}
    for k, job in enumerate(waiting, start=1):
        why, detail = reason(job, last)
        out[job.name] = {"position": k, "waiting": len(waiting), "reason": why, "detail": detail,
                         "slot": slot}
    return out
