"""The interface a cluster agent drives: a cluster that can be reset and stepped one slot at a time.

A :class:`ClusterBackend` hides where the cluster lives: :class:`~clusters.a3c.sim_backend.SimBackend`
wraps dl2ray's simulator. A :class:`LiveBackend` converts the state of a real
cluster into a :class:`~dl2ray.view.ClusterView` and an
:class:`~dl2ray.view.Allocation` into deployments:
:class:`~clusters.ray.backend.RayBackend` (members as Ray actors) today, a
Kubernetes backend (members as pods) later. The agent and the policy only
ever see these two types (STYLE.md, practice 2).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from dl2ray.jobspec import JobSpec
from dl2ray.view import Allocation, ClusterView


class SlotOutcome(NamedTuple):
    """One slot's result: the next view, the slot reward ``r_t = Σ_j epochs_j(t)/E_j``, and whether
    the run ended."""

    view: ClusterView
    reward: float
    done: bool


@runtime_checkable
class ClusterBackend(Protocol):
    """A cluster stepped slot by slot (units: slots; rewards as in :mod:`dl2ray.sim`)."""

    def reset(self, seed: int) -> ClusterView:
        """Start a run (a trace stream position given by ``seed``); the view of its first slot."""
        ...

    def step(self, allocation: Allocation) -> SlotOutcome:
        """Apply one slot's allocation; ``(view, reward, done)`` (a NamedTuple, unpacks as a tuple)."""
        ...


@runtime_checkable
class LiveBackend(Protocol):
    """A real cluster driven by the live agent, one slot at a time (wall-clock slots).

    Level-triggered: every call reads the cluster again; nothing it needs after
    an agent restart lives only in the backend object.
    """

    def slot_now(self) -> int:
        """The index of the slot in progress."""
        ...

    def snapshot(self) -> ClusterView:
        """The view at the start of this slot, from live state (closes each job's previous slot)."""
        ...

    def apply(self, allocation: Allocation) -> Any:
        """Turn the allocation into deltas (scale-downs and pauses first, then scale-ups); a report."""
        ...

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """Register a job; :class:`~dl2ray.errors.UserError` naming the field if it is refused."""
        ...

    def cancel(self, name: str) -> dict[str, Any]:
        """Stop a job now."""
        ...

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Every job the cluster knows: name → status (state, deployment, progress, events)."""
        ...
