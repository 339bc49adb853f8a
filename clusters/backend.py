"""The interface a cluster agent drives: a cluster that can be reset and stepped one slot at a time.

A :class:`ClusterBackend` hides where the cluster lives: :class:`~clusters.sim_backend.SimBackend`
wraps dl2ray's simulator; a live backend (later) will convert the state of a real
cluster into a :class:`~dl2ray.view.ClusterView` and an
:class:`~dl2ray.view.Allocation` into deployments. The agent and the policy only
ever see these two types (STYLE.md, practice 2).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

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
