"""The queue layer: quotas, borrowing and reclaim between the view and any scheduler (docs/tenancy.md).

On a shared cluster (a config with ``tenancy:``, :mod:`dl2ray.tenancy`)
:func:`dl2ray.schedulers.base.make_scheduler` wraps every scheduler in
:class:`Queued`. Each slot, with the view's jobs grouped by queue:

1. each queue's demand ``D_q`` = what the wrapped scheduler asks for it: the
   resources of its decision on a view of that queue's jobs alone over the whole
   cluster (elastic jobs can use far more than their requested size, so the
   scheduler's own ask, not the requests, is the demand; a queue that asks for
   less leaves the rest of its quota to lend); its entitlement ``E_q``
   (:func:`dl2ray.tenancy.entitlements`: nominal first, then what the cohort
   lends, by weight, within the borrowing limits);
2. this slot's nodes of each queue (:func:`assign_nodes`): whole nodes adding up
   to at most ``E_q`` — the ones it held last slot first, so its jobs stay where
   they run — and the nodes nobody could take whole shared by the queues still
   below their entitlement;
3. queue by queue — those entitled to least beyond their nominal quota first, so
   a queue reclaiming its quota places before the borrowers — the wrapped
   scheduler decides **on a view of that queue's jobs alone, over its nodes**
   (what the queues before it left of them): every heuristic works unchanged, on
   what is in effect this slot's partition of the cluster, and the planner and
   Optimus decide within the queue's share;
4. its allocation is trimmed to ``E_q`` (and a non-preemptible job's growth to
   its queue's nominal quota), one task at a time — from the lowest priority
   value, the latest arrival, the job with most tasks; a worker when it has at
   least as many workers as PS, else a PS; a job at one worker and one PS is
   paused (it keeps its progress; nothing is ever killed). A job that has run
   fewer than ``min_run_slots`` slots, or of a non-preemptible class, is never
   taken below what it held last slot; a job that held nothing last slot can
   always be left waiting (not starting is not a preemption).

Since the queues' entitlements add up to at most their cohort's nominal total
and a queue with demand is entitled to ``min(N_q, D_q)``, a queue gets its
quota back the slot its jobs ask for it, by scaling borrowers down.
:attr:`Queued.log` keeps one :class:`QueueSlot` per queue and slot: what
:func:`dl2ray.evaluation.tenancy.queue_metrics` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dl2ray.cluster import node_usage
from dl2ray.errors import UserError
from dl2ray.tenancy import TenancyConfig, entitlements
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Tasks

_EPS = 1e-9


@dataclass(frozen=True)
class QueueSlot:
    """One queue in one slot (resources as shape-(3,) arrays: cpu, gpu, mem). ``waiting``: its jobs left with
    nothing; ``shrunk``/``paused``: when the queue gives back (it held more last slot than it is entitled
    to now), its jobs holding less than last slot / paused."""

    slot: int
    queue: str
    jobs: int
    demand: np.ndarray
    nominal: np.ndarray
    entitlement: np.ndarray
    usage: np.ndarray
    waiting: int
    shrunk: int
    paused: int


def usage_of(allocation: Allocation, jobs: dict[int, JobView]) -> np.ndarray:
    """Shape (3,): the resources ``allocation``'s tasks hold."""
    total = np.zeros(3)
    for job_id, t in allocation.tasks.items():
        j = jobs[job_id]
        total += t.workers * j.worker_demand + t.ps * j.ps_demand
    return total


def assign_nodes(free: np.ndarray, entitled: dict[str, np.ndarray], previous: dict[str, list[int]]
                 ) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """This slot's nodes of each queue (step 2 of the module docstring): ``(own, shared)``.

    ``free``: shape (N, 3); ``entitled``: per queue with jobs, in the order the queues decide (those
    reclaiming their quota first), its ``E_q``. Nodes are counted by their dominant share of the cluster
    ``d_n = max_r free[n, r] / total_r``, a queue's entitlement by ``e_q = max_r E_q[r] / total_r``: in
    turn, each queue *owns* whole nodes while their shares add up to at most ``e_q`` — first the nodes it
    owned last slot (``previous``: its jobs stay where they run), then any free ones. The nodes left over
    are *shared* by every queue still below its entitlement; the queues decide on them in turn and the trim
    keeps each within ``E_q``.
    """
    total = np.maximum(free.sum(axis=0), _EPS)
    share = np.max(free / total, axis=1)
    own: dict[str, list[int]] = {q: [] for q in entitled}
    held = {q: np.zeros(3) for q in entitled}
    taken = np.zeros(len(free), dtype=bool)
    for q, ent in entitled.items():
        room = float(np.max(ent / total)) + _EPS
        for n in [*previous.get(q, []), *range(len(free))]:
            if not taken[n] and share[n] > _EPS and share[n] <= room:
                own[q].append(n)
                held[q] += free[n]
                taken[n] = True
                room -= float(share[n])
    rest = [int(n) for n in np.flatnonzero(~taken) if share[n] > _EPS]
    shared = {q: rest for q in entitled if np.any(entitled[q] - held[q] > _EPS)}
    return own, shared


class Queued:
    """``inner`` deciding queue by queue within each queue's entitlement (module docstring)."""

    def __init__(self, inner: Any, tenancy: TenancyConfig) -> None:
        self.inner = inner
        self.tenancy = tenancy
        self.log: list[QueueSlot] = []
        self._held: dict[int, Tasks] = {}
        self._nodes: dict[str, list[int]] = {}
        self._usage: dict[str, np.ndarray] = {}

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def reset(self, seed: int) -> None:
        self.log.clear()
        self._held.clear()
        self._nodes.clear()
        self._usage.clear()
        if hasattr(self.inner, "reset"):
            self.inner.reset(seed)

    def queue_of(self, job: JobView) -> str:
        """The job's queue (the first queue when the trace names none); UserError for an unknown one."""
        name = self.tenancy.queue_of(job.queue)
        if name not in self.tenancy.names:
            raise UserError(f"job {job.job_id}: queue {job.queue!r} is not a queue of this cluster "
                            f"(known: {', '.join(self.tenancy.names)})")
        return name

    def decide(self, view: ClusterView) -> Allocation:
        by_queue: dict[str, list[JobView]] = {q: [] for q in self.tenancy.names}
        for job in view.jobs:
            by_queue[self.queue_of(job)].append(job)
        index = {j.job_id: j for j in view.jobs}
        demand = {q: usage_of(self.inner.decide(replace(view, jobs=tuple(jobs))), index) if jobs
                  else np.zeros(3) for q, jobs in by_queue.items()}
        ent = entitlements(self.tenancy, demand)
        nominal = {q.name: q.nominal.as_array() for q in self.tenancy.queues}
        order = sorted(by_queue, key=lambda q: (float(np.max(np.maximum(ent[q] - nominal[q], 0.0)
                                                             / np.maximum(nominal[q], 1.0))), q))
        free = np.array(view.free, dtype=np.float64)
        own, shared = assign_nodes(free, {q: ent[q] for q in order if by_queue[q]}, self._nodes)
        self._nodes = own
        tasks: dict[int, Tasks] = {}
        placement: dict[int, JobPlacement] = {}
        for q in order:
            jobs = by_queue[q]
            usage = np.zeros(3)
            shrunk = paused = 0
            mine = np.zeros(len(free), dtype=bool)
            mine[own.get(q, [])] = True
            mine[shared.get(q, [])] = True
            if jobs and mine.any():  # (no node of its own and none left to share: its jobs wait)
                # the queue's slice of the cluster, as if it were the whole: schedulers that weigh tasks
                # by the cluster's total (DRF's shares, Optimus's and the planner's gains) see its size
                sub = replace(view, jobs=tuple(jobs), free=np.where(mine[:, None], free, 0.0),
                              capacity=np.where(mine[:, None], view.capacity, 0.0))
                alloc = self._placed(sub, self.inner.decide(sub))
                alloc = self._trim(alloc, {j.job_id: j for j in jobs}, ent[q], nominal[q])
                if np.any(self._usage.get(q, np.zeros(3)) > ent[q] + _EPS):  # it gives back: a reclaim
                    shrunk, paused = self._reclaimed(jobs, alloc)
                free -= node_usage(view.capacity, alloc, lambda i: (index[i].worker_demand,
                                                                     index[i].ps_demand))
                tasks.update(alloc.tasks)
                placement.update(alloc.placement or {})
                usage = usage_of(alloc, index)
            self.log.append(QueueSlot(view.slot, q, len(jobs), demand[q], nominal[q], ent[q], usage,
                                      sum(1 for j in jobs if j.job_id not in tasks), shrunk, paused))
        self._held = dict(tasks)
        self._usage = {s.queue: s.usage for s in self.log[-len(order):]}
        return Allocation(tasks, placement)

    def _reclaimed(self, jobs: list[JobView], alloc: Allocation) -> tuple[int, int]:
        """(jobs holding less than last slot but something, jobs paused that held something) of a queue
        made to give back (its last slot's use above its entitlement now)."""
        shrunk = paused = 0
        for j in jobs:
            held = self._held.get(j.job_id, Tasks(0, 0))
            now = alloc.tasks.get(j.job_id, Tasks(0, 0))
            if held.workers + held.ps == 0:
                continue
            paused += now.workers + now.ps == 0
            shrunk += now.workers + now.ps > 0 and (now.workers < held.workers or now.ps < held.ps)
        return shrunk, paused

    @staticmethod
    def _placed(view: ClusterView, alloc: Allocation) -> Allocation:
        """``alloc`` with every task on a node (a scheduler that names no nodes: the view's placer)."""
        if alloc.placement is not None and set(alloc.placement) >= set(alloc.tasks):
            return alloc
        placer = view.placer()
        for job_id, t in alloc.tasks.items():
            j = view.job(job_id)
            for _ in range(t.workers):
                placer.place(job_id, "worker", j.worker_demand)
            for _ in range(t.ps):
                placer.place(job_id, "ps", j.ps_demand)
        placed = placer.allocation()
        return Allocation({j: t for j, t in placed.tasks.items() if t.workers > 0 and t.ps > 0},
                          {j: p for j, p in (placed.placement or {}).items()
                           if placed.tasks[j].workers > 0 and placed.tasks[j].ps > 0})

    def _floor(self, job: JobView) -> Tasks:
        """What the trim may not take ``job`` below: what it held last slot when it is protected (too young
        for reclaim, or of a non-preemptible class), else nothing."""
        held = self._held.get(job.job_id, Tasks(0, 0))
        young = job.slots_run < self.tenancy.min_run_slots
        if young or not self.tenancy.job_priority(self.queue_of(job), job.priority).preemptible:
            return held
        return Tasks(0, 0)

    def _preemptible(self, job: JobView) -> bool:
        return self.tenancy.job_priority(self.queue_of(job), job.priority).preemptible

    def _trim(self, alloc: Allocation, jobs: dict[int, JobView], entitled: np.ndarray,
              nominal: np.ndarray) -> Allocation:
        """``alloc`` within ``entitled``, and its non-preemptible jobs within ``nominal`` (step 4)."""
        values = {j: self.tenancy.job_priority(self.queue_of(v), v.priority).value for j, v in jobs.items()}
        trim = _Trim(alloc, jobs, {j: self._floor(v) for j, v in jobs.items()}, values)
        trim.within(nominal, [j for j in jobs if not self._preemptible(jobs[j])])
        trim.within(entitled, list(jobs))
        return trim.allocation()

    def __repr__(self) -> str:
        return f"Queued({self.inner!r}, {list(self.tenancy.names)})"


class _Trim:
    """One queue's allocation being taken down, task by task (the module docstring's step 3)."""

    def __init__(self, alloc: Allocation, jobs: dict[int, JobView], floors: dict[int, Tasks],
                 priority: dict[int, int]) -> None:
        self.tasks = dict(alloc.tasks)
        self.nodes = {j: (list(p.worker_nodes), list(p.ps_nodes)) for j, p in (alloc.placement or {}).items()}
        self.jobs, self.floors, self.priority = jobs, floors, priority

    def within(self, limit: np.ndarray, ids: list[int]) -> None:
        """Take tasks of the jobs ``ids`` until they hold at most ``limit`` (or nothing more may go)."""
        while self._over(limit, ids) and self._take_one(ids):
            pass

    def allocation(self) -> Allocation:
        placement = {j: JobPlacement(tuple(self.nodes[j][0]), tuple(self.nodes[j][1]))
                     for j in self.tasks if j in self.nodes}
        return Allocation(self.tasks, placement)

    def _over(self, limit: np.ndarray, ids: list[int]) -> bool:
        used = usage_of(Allocation({i: self.tasks[i] for i in ids if i in self.tasks}), self.jobs)
        return bool(np.any(used > limit + _EPS))

    def _rank(self, job_id: int) -> tuple:
        """Lowest priority value first, then the latest arrival, the job with most tasks, the highest id."""
        j, t = self.jobs[job_id], self.tasks[job_id]
        return (self.priority[job_id], -j.arrival_slot, -(t.workers + t.ps), -job_id)

    def _take_one(self, ids: list[int]) -> bool:
        for job_id in sorted((i for i in ids if i in self.tasks), key=self._rank):
            t, floor = self.tasks[job_id], self.floors[job_id]
            if t.workers == 1 and t.ps == 1:
                if floor.workers + floor.ps > 0:
                    continue
                del self.tasks[job_id]  # paused: it keeps its progress
                self.nodes.pop(job_id, None)
                return True
            can_w = t.workers - 1 >= max(floor.workers, 1)
            can_p = t.ps - 1 >= max(floor.ps, 1)
            if not (can_w or can_p):
                continue
            worker = can_w and (t.workers >= t.ps or not can_p)
            self.tasks[job_id] = Tasks(t.workers - 1, t.ps) if worker else Tasks(t.workers, t.ps - 1)
            if job_id in self.nodes:
                self.nodes[job_id][0 if worker else 1].pop()
            return True
        return False
