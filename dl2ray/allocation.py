"""What a scheduler returns: :class:`Allocation` (workers and PS per job for one slot, optionally the node of
every task: :class:`JobPlacement`). Re-exported by :mod:`dl2ray.view` beside the view a scheduler reads; here
on its own so that the placement policies (:mod:`dl2ray.cluster`), which build allocations, sit below the
view, whose :meth:`~dl2ray.view.ClusterView.placer` hands them out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class Tasks(NamedTuple):
    """Workers and PS of one job for one slot."""

    workers: int
    ps: int


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Node index of each worker and each PS of one job."""

    worker_nodes: tuple[int, ...]
    ps_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Allocation:
    """Workers and PS per job for the next slot.

    Jobs not listed get nothing. ``placement``, when given, must list one node
    per task of every allocated job; otherwise the backend places tasks with
    its configured policy, in the order of ``tasks``.
    """

    tasks: Mapping[int, Tasks] = field(default_factory=dict)
    placement: Mapping[int, JobPlacement] | None = None

    def __post_init__(self) -> None:
        for job_id, t in self.tasks.items():
            if t.workers < 0 or t.ps < 0:
                raise ValueError(f"job {job_id}: negative task count {tuple(t)}")

    @staticmethod
    def empty() -> Allocation:
        return Allocation({})
