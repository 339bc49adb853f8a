"""The two types that cross every boundary: :class:`ClusterView` and :class:`Allocation`.

A scheduler gets a ``ClusterView`` (an immutable snapshot of the cluster at
the start of a slot) and returns an ``Allocation`` (workers and PS per job
for that slot, optionally with the node of every task). The simulator, the
Ray backend and the Kubernetes backend all produce views and consume
allocations; none of them shows a scheduler anything else. In particular the
true speed function and true job lengths never appear here: a scheduler sees
declared epochs and what it observed (:class:`Observation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dl2ray.allocation import Allocation, JobPlacement, Tasks
from dl2ray.cluster import Placer, make_placer
from dl2ray.workload import JobCatalogue

__all__ = ["Allocation", "ClusterView", "JobPlacement", "JobView", "Observation", "Tasks"]


class Observation(NamedTuple):
    """What a job did in one slot it ran: its deployment and its progress.

    ``epochs`` trained in ``seconds`` of wall time (the slot length minus any
    suspension, or less in the slot it finished); ``loss`` is the training
    loss the job reported at the end of the slot.
    """

    slot: int
    ps: int
    workers: int
    epochs: float
    seconds: float
    loss: float


@dataclass(frozen=True, slots=True)
class JobView:
    """One uncompleted, arrived job as a scheduler sees it.

    ``workers``/``ps`` and ``worker_nodes``/``ps_nodes`` are the deployment of
    the previous slot (0 and empty if it did not run). Demands are shape-(3,)
    read-only arrays in (cpu, gpu, mem) order. ``requested_bundles`` is the
    size the job's user asked for (bundles of 1 worker + 1 PS: the trace's, or
    the config's ``workload.requested_bundles``), None when nobody said
    (:attr:`requested_limit` then falls back to the caps). ``fixed_tasks``: in
    gang mode (:mod:`dl2ray.gang`) the job's one size — it runs with exactly
    these workers and PS or not at all, and keeps them until it completes;
    None in the DL2 simulator. ``queue``/``priority``: the job's queue and priority class on a shared
    cluster (:mod:`dl2ray.tenancy`), None on one pool.
    """

    job_id: int
    job_type: str
    type_index: int
    arrival_slot: int
    slots_run: int
    est_epochs: float
    done_epochs: float
    workers: int
    ps: int
    worker_nodes: tuple[int, ...]
    ps_nodes: tuple[int, ...]
    worker_demand: np.ndarray
    ps_demand: np.ndarray
    max_workers: int
    max_ps: int
    history: tuple[Observation, ...] = ()
    requested_bundles: int | None = None
    fixed_tasks: Tasks | None = None
    queue: str | None = None
    priority: str | None = None

    @property
    def bundle_cap(self) -> int:
        """Most bundles (1 worker + 1 PS) the caps allow: ``min(max_workers, max_ps)``."""
        return min(self.max_workers, self.max_ps)

    @property
    def requested_limit(self) -> int:
        """Bundles the user asked for, within the caps (the caps when nobody asked)."""
        if self.requested_bundles is None:
            return self.bundle_cap
        return max(1, min(self.requested_bundles, self.bundle_cap))

    @property
    def remaining_epochs(self) -> float:
        """Declared epochs not yet trained (never below a tiny positive floor)."""
        return max(self.est_epochs - self.done_epochs, 1e-9)

    @property
    def progress(self) -> float:
        """Fraction of the declared epochs done, in [0, ∞)."""
        return self.done_epochs / self.est_epochs

    def last_trained(self) -> Observation | None:
        """The most recent observation of a slot that trained (epochs and seconds > 0), or None."""
        for obs in reversed(self.history):
            if obs.epochs > 0 and obs.seconds > 0:
                return obs
        return None

    def observed_speed(self) -> float | None:
        """Epochs per second in the most recent slot that trained, or None."""
        obs = self.last_trained()
        return None if obs is None else obs.epochs / obs.seconds


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Immutable snapshot at the start of slot ``slot``.

    ``capacity`` and ``free`` have shape (N, 3). ``free`` is what this slot's
    allocation may use: every slot reallocates all jobs, so in the simulator
    ``free == capacity``; a live backend subtracts what it does not control.
    ``jobs`` are the arrived, uncompleted jobs in arrival order.
    """

    slot: int
    slot_seconds: float
    capacity: np.ndarray
    free: np.ndarray
    jobs: tuple[JobView, ...]
    catalogue: JobCatalogue
    placement: str = "load_balancing"

    @property
    def num_nodes(self) -> int:
        return int(self.capacity.shape[0])

    @property
    def total_capacity(self) -> np.ndarray:
        """Shape (3,): cluster-wide capacity."""
        return self.capacity.sum(axis=0)

    def job(self, job_id: int) -> JobView:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(f"job {job_id} is not in this view")

    def placer(self, policy: str | None = None) -> Placer:
        """A fresh tentative placement over ``free`` with the view's policy."""
        return make_placer(self.capacity, self.free, policy or self.placement, self.catalogue)
