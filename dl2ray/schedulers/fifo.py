"""First-in first-out: earlier jobs get their full share before later ones get any.

Jobs in arrival order (ties: job id); each gets bundles (1 worker + 1 PS) up
to its requested size (``JobView.requested_limit``: the user's threshold
within the caps) before the next job gets any. A job whose bundle no longer
fits is skipped and later jobs may still take what is left (the published
code stopped at the first job that did not fit, leaving smaller bundles
unused). ``fifo-published`` fills every job up to its caps, as the published
DL2 code did.
"""

from __future__ import annotations

from dl2ray.schedulers.bundles import bundle_limit, fill_bundles
from dl2ray.view import Allocation, ClusterView


class FIFO:
    placement = "load_balancing"  # the DL2 paper's cluster default, under which it ran FIFO

    def __init__(self, requested: bool = True) -> None:
        self.requested = requested
        self.name = "fifo" if requested else "fifo-published"

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        for job in sorted(view.jobs, key=lambda j: (j.arrival_slot, j.job_id)):
            fill_bundles(placer, job, bundle_limit(job, self.requested))
        return placer.allocation()
