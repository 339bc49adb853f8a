"""Where a live backend puts the new members of a job: the scheduler's node when it has room, else the
node the view's placement policy picks. Written once for every backend.

The scheduler decides every slot from scratch over the view's ``free``
capacity, and its allocation places every task of a job (:class:`~dl2ray.view.JobPlacement`).
A live cluster does not move running members: a job keeps the members it has
and only its *new* ones are placed, so the backend takes the scheduler's node
for task ``have + k`` (the ``k``-th new member of a role) — unless members that
stay (this job's or another's) already hold that node's room, which the
scheduler could not see. Then, and only then, the node is chosen by the same
placement policy the scheduler uses (:func:`dl2ray.cluster.make_placer` over
what is really free), never by a rule of the backend's own. A member for which
no node has room is not started; the job's target is cut to what fits.

Units: ``capacity`` and ``usage`` have shape (N, 3) in (cpu, gpu, mem GB), a
node's row index being its index in the view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dl2ray.cluster import make_placer
from dl2ray.view import JobPlacement
from dl2ray.workload import JobCatalogue

ROLES = ("ps", "worker")
_EPS = 1e-9


@dataclass
class NewMembers:
    """Node indices of the new members of one job, per role, in the order they are to start."""

    ps: list[int] = field(default_factory=list)
    worker: list[int] = field(default_factory=list)

    def of(self, role: str) -> list[int]:
        return self.ps if role == "ps" else self.worker


@dataclass
class MemberPlacer:
    """Places the new members of the jobs of one apply, charging each to ``usage`` (the resources held by
    the members that stay; updated in place). ``policy``: the view's placement policy."""

    capacity: np.ndarray
    usage: np.ndarray
    policy: str
    catalogue: JobCatalogue

    def place(self, job_id: int, have: dict[str, int], want: dict[str, int], wish: JobPlacement | None,
              demand: dict[str, np.ndarray]) -> NewMembers:
        """Nodes for ``want[r] - have[r]`` new members of each role ``r`` (module docstring); fewer where
        no node has room. ``wish``: the allocation's placement of the job (task ``i`` of a role on
        ``wish``'s ``i``-th node of it), or None."""
        out = NewMembers()
        for role in ROLES:
            wished = (wish.ps_nodes if role == "ps" else wish.worker_nodes) if wish is not None else ()
            for k in range(max(want[role] - have[role], 0)):
                i = have[role] + k
                node = self._node(job_id, role, wished[i] if i < len(wished) else None, demand[role])
                if node is None:
                    break
                self.usage[node] += demand[role]
                out.of(role).append(node)
        return out

    def give_back(self, new: NewMembers, demand: dict[str, np.ndarray]) -> None:
        """Undo :meth:`place` for members that will not start after all."""
        for role in ROLES:
            for node in new.of(role):
                self.usage[node] -= demand[role]

    def _fits(self, node: int, demand: np.ndarray) -> bool:
        return bool((self.usage[node] + demand <= self.capacity[node] + _EPS).all())

    def _node(self, job_id: int, role: str, wish: int | None, demand: np.ndarray) -> int | None:
        if wish is not None and 0 <= wish < len(self.capacity) and self._fits(wish, demand):
            return wish
        free = np.maximum(self.capacity - self.usage, 0.0)
        return make_placer(self.capacity, free, self.policy, self.catalogue).place(job_id, role, demand)


def final_target(have: dict[str, int], want: dict[str, int], new: NewMembers) -> tuple[int, int]:
    """``(ps, workers)`` a job can reach this slot: ``want`` where it shrinks or stays, else what it has
    plus the members that found a node."""
    ps, workers = (want[r] if want[r] <= have[r] else have[r] + len(new.of(r)) for r in ROLES)
    return ps, workers
