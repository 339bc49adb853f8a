"""The interfaces a cluster agent drives; a new backend implements :class:`LiveBackend` and nothing else.

A :class:`LiveBackend` is a real cluster seen slot by slot: it converts the
cluster's state into a :class:`~dl2ray.view.ClusterView` and an
:class:`~dl2ray.view.Allocation` into changes of the cluster (deltas only).
:class:`~clusters.agent.loop.Agent` is the one control loop over it; the
scheduler and the policy only ever see those two types (STYLE.md, practice 2).
Two implement it: :class:`~clusters.ray.backend.RayBackend` (jobs as Ray actors)
and :class:`~clusters.k8s.backend.KubernetesBackend` (jobs as DL2Job objects and
pods). ``tests/clusters/test_agent.py`` checks each backend against it.

A :class:`ClusterBackend` is a *simulated* cluster stepped by its caller (the
A3C agents' and the federation members' experience): ``reset``/``step``,
:class:`~clusters.a3c.sim_backend.SimBackend` over dl2ray's simulator.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from clusters.agent.reports import ApplyReport
from dl2ray.jobspec import JobSpec
from dl2ray.view import Allocation, ClusterView


@runtime_checkable
class LiveBackend(Protocol):
    """A real cluster driven by the agent, one wall-clock slot at a time.

    Level-triggered: every :meth:`snapshot` reads the cluster again, and
    nothing the backend needs after an agent restart lives only in the backend
    object (jobs, members, progress and slot history live in the cluster), so
    a new agent adopts what runs. Every call may be repeated: applying the same
    allocation twice changes nothing the second time.
    """

    def slot_now(self) -> int:
        """The index of the slot in progress."""
        ...

    def slot_start(self, slot: int) -> float:
        """Unix time (s) at which slot ``slot`` starts (the agent sleeps until the next one)."""
        ...

    def adopt(self) -> int:
        """Read the cluster once as an agent starts; the number of running jobs found (adopted)."""
        ...

    def snapshot(self) -> ClusterView:
        """The view at the start of this slot, from live state (closes each job's previous slot)."""
        ...

    def view_parts(self) -> dict[str, float]:
        """What the last :meth:`snapshot` spent where: ``view_<part>_ms`` milliseconds per part, and any
        counts the backend keeps of its reads (``readings_<kind>``); ``{}`` when it measures none. The
        agent adds them to its slot row (``slots.parquet``, ``loop_ms``)."""
        ...

    def apply(self, allocation: Allocation) -> ApplyReport:
        """Turn the allocation into deltas against the last snapshot (scale-downs and pauses first, then
        scale-ups); new tasks go to the allocation's nodes where those have room."""
        ...

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """Register a job; :class:`~dl2ray.errors.UserError` naming the field if it is refused."""
        ...

    def cancel(self, name: str) -> dict[str, Any]:
        """Stop a job now; UserError if there is no such job."""
        ...

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Every job the cluster knows: name → status (state, deployment, progress, events; JSON)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (threads, connections); the cluster's jobs keep running."""
        ...


class SlotOutcome(NamedTuple):
    """One slot's result: the next view, the slot reward ``r_t = Σ_j epochs_j(t)/E_j``, and whether
    the run ended."""

    view: ClusterView
    reward: float
    done: bool


@runtime_checkable
class ClusterBackend(Protocol):
    """A simulated cluster stepped slot by slot (units: slots; rewards as in :mod:`dl2ray.sim`)."""

    def reset(self, seed: int) -> ClusterView:
        """Start a run (a trace stream position given by ``seed``); the view of its first slot."""
        ...

    def step(self, allocation: Allocation) -> SlotOutcome:
        """Apply one slot's allocation; ``(view, reward, done)`` (a NamedTuple, unpacks as a tuple)."""
        ...
