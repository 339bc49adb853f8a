"""First-in first-out: earlier jobs get their full share before later ones get any.

Jobs in arrival order (ties: job id); each gets bundles (1 worker + 1 PS) up
to its caps before the next job gets any. A job whose bundle no longer fits
is skipped and later jobs may still take what is left (the published code
stopped at the first job that did not fit, leaving smaller bundles unused).
"""

from __future__ import annotations

from dl2ray.schedulers.base import fill_bundles
from dl2ray.view import Allocation, ClusterView


class FIFO:
    name = "fifo"

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        for job in sorted(view.jobs, key=lambda j: (j.arrival_slot, j.job_id)):
            fill_bundles(placer, job)
        return placer.allocation()
