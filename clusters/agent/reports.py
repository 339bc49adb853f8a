"""What a backend reports to the agent, written once for every backend: the nodes it read, what it changed.

An :class:`ApplyReport` is one slot's :meth:`~clusters.agent.backend.LiveBackend.apply`:
one :class:`ScaleAction` per job whose deployment changed, the jobs left alone
because an earlier operation of theirs is still running, and errors the
backend met (API errors, timeouts) that did not stop the slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Nodes:
    """The cluster's schedulable nodes, sorted by name: ``capacity`` shape (N, 3) in (cpu, gpu, mem GB)."""

    names: list[str]
    capacity: np.ndarray

    def index(self) -> dict[str, int]:
        """Node name → row of :attr:`capacity` (the node index a :class:`~dl2ray.view.ClusterView` uses)."""
        return {n: i for i, n in enumerate(self.names)}

    @classmethod
    def empty(cls) -> Nodes:
        return cls([], np.zeros((0, 3)))


@dataclass
class ScaleAction:
    """One job's change in one slot: from ``(ps, workers)`` to the target, and how it went.

    ``ok`` is None while the change is still running (``reason`` says so);
    ``created``/``deleted`` name the objects (pods) the backend made or removed for it.
    """

    job: str
    before: tuple[int, int]
    target: tuple[int, int]
    ok: bool | None = None
    reason: str = ""
    seconds: float = 0.0
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def event(self) -> str:
        """``job:before->target:ok:reason`` (one entry of the slot log's ``events`` column)."""
        return f"{self.job}:{self.before}->{self.target}:{self.ok}:{self.reason}"


@dataclass
class ApplyReport:
    """One slot's apply: what changed, which busy jobs were left for the next slot, errors met."""

    slot: int
    actions: list[ScaleAction] = field(default_factory=list)
    skipped_busy: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
