"""Shortest remaining time first, one job's full share at a time.

Jobs ordered by estimated remaining time (see
:class:`~dl2ray.schedulers.observed.RemainingTime`; ties: arrival, job id);
in that order each gets bundles (1 worker + 1 PS) up to its requested size
(``JobView.requested_limit``; ``srtf-published``: up to its caps); a job
whose bundle no longer fits is skipped and later ones may still fit.

The published code ordered by remaining *fraction of epochs* (a job at 10 %
of a 1000-epoch run ranked behind one at 50 % of a 10-epoch run) and stopped
at the first job that did not fit; this ranks by remaining *time* estimated
from observed speeds, as SRTF is defined.
"""

from __future__ import annotations

from dl2ray.schedulers.bundles import bundle_limit, fill_bundles
from dl2ray.schedulers.observed import RemainingTime
from dl2ray.view import Allocation, ClusterView


class SRTF:
    placement = "load_balancing"  # the DL2 paper's cluster default, under which it ran SRTF

    def __init__(self, requested: bool = True) -> None:
        self.requested = requested
        self.name = "srtf" if requested else "srtf-published"
        self._remaining = RemainingTime()

    def reset(self, seed: int) -> None:
        self._remaining.reset()

    def decide(self, view: ClusterView) -> Allocation:
        self._remaining.update(view)
        times = self._remaining.estimates(view)
        order = sorted(
            range(len(view.jobs)),
            key=lambda i: (times[i], view.jobs[i].arrival_slot, view.jobs[i].job_id),
        )
        placer = view.placer()
        for i in order:
            job = view.jobs[i]
            fill_bundles(placer, job, bundle_limit(job, self.requested))
        return placer.allocation()
