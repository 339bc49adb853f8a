"""Tetris: multi-resource packing combined with shortest-remaining-time preference.

Grandl et al., "Multi-Resource Packing for Cluster Schedulers", SIGCOMM 2014.
One bundle (1 worker + 1 PS) at a time goes to the job with the highest

    score_j = a_j + ε · p_j

- alignment ``a_j = Σ_r (d_r / C_r)(F_r / C_r)`` summed over the bundle's two
  tasks, with ``d`` the task's demand and ``F``/``C`` the free resources and
  the capacity of the node the placement puts that task on (Placer.peek):
  under its own placement (``tetris``) the best-aligned node, so ``a_j`` is
  the paper's best (task, machine) alignment;
- remaining-time preference ``p_j = (1 / T_j) / max_k (1 / T_k)`` in (0, 1],
  with ``T_j`` the estimated remaining time
  (:class:`~dl2ray.schedulers.observed.RemainingTime`): shorter first;
- ``ε = ā / p̄``, the means over the jobs at the start of the decision, so
  both terms weigh alike (the paper's ``m = 1``).

until every job holds its requested size (``JobView.requested_limit``, the
DL2 paper's "user-defined threshold"; ``tetris-published``: its caps) or no
bundle fits. Jobs with the same bundle
demand share their alignment, so only the most preferred job of each demand
group can win a step: a step costs O(G) peeks for G demand groups (3 for the
testbed catalogue), not a scan of jobs or nodes.
"""

from __future__ import annotations

import heapq

from dl2ray.schedulers.bundles import bundle_limit
from dl2ray.schedulers.observed import RemainingTime
from dl2ray.view import Allocation, ClusterView, JobView

Key = tuple[tuple[float, ...], tuple[float, ...]]


class Tetris:
    placement = "tetris"  # its alignment score (Grandl et al. §3.2): the node whose free resources align best

    def __init__(self, requested: bool = True) -> None:
        self.requested = requested
        self.name = "tetris" if requested else "tetris-published"
        self._remaining = RemainingTime()

    def reset(self, seed: int) -> None:
        self._remaining.reset()

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        if not view.jobs:
            return placer.allocation()
        self._remaining.update(view)
        inv = [1.0 / t for t in self._remaining.estimates(view)]
        top = max(inv)
        pref = [x / top for x in inv]
        groups: dict[Key, list[tuple[float, int, int, int]]] = {}
        for i, job in enumerate(view.jobs):
            key = (tuple(job.worker_demand.tolist()), tuple(job.ps_demand.tolist()))
            groups.setdefault(key, []).append((-pref[i], job.arrival_slot, job.job_id, i))
        for heap in groups.values():
            heapq.heapify(heap)
        align = _Alignment(view, placer)
        first = {key: align(view.jobs[heap[0][3]]) for key, heap in groups.items()}
        sizes = {key: len(heap) for key, heap in groups.items()}
        mean_a = sum((first[k] or 0.0) * sizes[k] for k in groups) / len(view.jobs)
        eps = mean_a / (sum(pref) / len(pref))
        while groups:
            best = _best_group(groups, align, eps, view)
            if best is None:
                break
            heap = groups[best]
            job = view.jobs[heap[0][3]]
            if not align.place_bundle(job):
                del groups[best]  # every job of the group has this bundle demand
                continue
            w, p = placer.tasks(job.job_id)
            if min(w, p) >= bundle_limit(job, self.requested):
                heapq.heappop(heap)
                if not heap:
                    del groups[best]
        return placer.allocation()


def _best_group(groups: dict, align: _Alignment, eps: float, view: ClusterView) -> Key | None:
    """The demand group whose most preferred job scores highest; drops full groups."""
    best, best_score = None, -1.0
    for key in list(groups):
        heap = groups[key]
        a = align(view.jobs[heap[0][3]])
        if a is None:
            del groups[key]
            continue
        score = a - eps * heap[0][0]
        if score > best_score:
            best, best_score = key, score
    return best


class _Alignment:
    """Alignment of a bundle with the nodes it would land on, tracking free resources."""

    def __init__(self, view: ClusterView, placer) -> None:
        self._placer = placer
        self._free: list[list[float]] = view.free.tolist()
        self._inv2 = [[1.0 / (c * c) if c > 0 else 0.0 for c in row] for row in view.capacity]

    def _task(self, node: int, demand: list[float]) -> float:
        f, s = self._free[node], self._inv2[node]
        return demand[0] * f[0] * s[0] + demand[1] * f[1] * s[1] + demand[2] * f[2] * s[2]

    def __call__(self, job: JobView) -> float | None:
        """Alignment of ``job``'s next bundle, or None if a task of it fits nowhere."""
        nw = self._placer.peek(job.worker_demand)
        np_ = self._placer.peek(job.ps_demand)
        if nw is None or np_ is None:
            return None
        return self._task(nw, job.worker_demand.tolist()) + self._task(np_, job.ps_demand.tolist())

    def place_bundle(self, job: JobView) -> bool:
        """Place one worker and one PS of ``job`` (or neither); keep ``free`` current."""
        placer, jid = self._placer, job.job_id
        nw = placer.place(jid, "worker", job.worker_demand)
        if nw is None:
            return False
        np_ = placer.place(jid, "ps", job.ps_demand)
        if np_ is None:
            placer.unplace(jid, "worker", job.worker_demand)
            return False
        for node, demand in ((nw, job.worker_demand), (np_, job.ps_demand)):
            f = self._free[node]
            f[0] -= demand[0]
            f[1] -= demand[1]
            f[2] -= demand[2]
        return True
