"""Static, user-specified DRF: the DRF baseline as the DL2 paper describes it.

"These schedulers allocate resources according to user specification and do
not adjust resource allocation during training" (DL2, §1). Every job runs at
its requested size (``JobView.requested_limit`` bundles of 1 worker + 1 PS)
from the slot it starts until it completes:

1. jobs that ran in the previous slot keep their bundles (re-placed first, in
   arrival order);
2. waiting jobs start whole (all requested bundles or none) in DRF order:
   the smallest dominant share of the request first (ties: arrival, job id) —
   every waiting job holds a share of 0, and progressive filling serves the
   one whose share stays smallest; a job whose request does not fit now is
   skipped and smaller ones behind it may start (no reservation).

A request larger than the empty cluster could ever host is cut to what it
could (otherwise the job would wait forever). ``drf`` is the elastic variant,
which re-divides the whole cluster every slot.
"""

from __future__ import annotations

from dl2ray.schedulers.bundles import dominant_share, fill_bundles
from dl2ray.view import Allocation, ClusterView, JobView


class StaticDRF:
    name = "drf-static"
    placement = "load_balancing"  # the DL2 paper's cluster default, under which it ran DRF

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        running = [j for j in view.jobs if min(j.workers, j.ps) > 0]
        for job in sorted(running, key=lambda j: (j.arrival_slot, j.job_id)):
            fill_bundles(placer, job, min(job.workers, job.ps))
        total = view.total_capacity
        fits_empty: dict[int, int] = {}
        waiting = []
        for job in view.jobs:
            if min(job.workers, job.ps) > 0:
                continue
            if job.type_index not in fits_empty:
                fits_empty[job.type_index] = _bundles_on_empty(view, job)
            size = min(job.requested_limit, fits_empty[job.type_index])
            if size > 0:
                waiting.append((dominant_share(job, size, size, total), job.arrival_slot,
                                job.job_id, size, job))
        for *_, size, job in sorted(waiting, key=lambda w: w[:3]):
            if fill_bundles(placer, job, size) < size:
                _remove(placer, job)
        return placer.allocation()


def _bundles_on_empty(view: ClusterView, job: JobView) -> int:
    """Bundles of ``job``'s type the whole cluster holds when nothing else runs (within the caps)."""
    from dl2ray.cluster import make_placer

    placer = make_placer(view.capacity, view.capacity, view.placement, view.catalogue)
    return fill_bundles(placer, job)


def _remove(placer, job: JobView) -> None:
    """Take back every task ``job`` was given in this decision (it starts whole or not at all)."""
    w, p = placer.tasks(job.job_id)
    for _ in range(w):
        placer.unplace(job.job_id, "worker", job.worker_demand)
    for _ in range(p):
        placer.unplace(job.job_id, "ps", job.ps_demand)
