"""Dominant-resource fairness, one worker+PS bundle at a time (progressive filling).

Repeatedly give one bundle (1 worker + 1 PS) to the job with the smallest
dominant share of the cluster (ties: earlier arrival), until no job can take
another bundle: a job leaves the queue when it reaches a cap or when no node
fits its bundle, and the others go on (the published code stopped at the
first job that did not fit; progressive filling continues, as DRF is defined).
"""

from __future__ import annotations

import heapq

from dl2ray.schedulers.bundles import dominant_share
from dl2ray.view import Allocation, ClusterView


class DRF:
    name = "drf"
    placement = "load_balancing"  # the DL2 paper's cluster default, under which it ran DRF

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        total = view.total_capacity
        # Shares grow linearly with bundles: k bundles hold k × the share of one.
        per_bundle = [dominant_share(j, 1, 1, total) for j in view.jobs]
        bundles = [0] * len(view.jobs)
        queue = [(0.0, j.arrival_slot, j.job_id, i) for i, j in enumerate(view.jobs)]
        heapq.heapify(queue)
        while queue:
            _, arrival, job_id, i = heapq.heappop(queue)
            job = view.jobs[i]
            if not placer.place_bundle(job_id, job.worker_demand, job.ps_demand):
                continue
            bundles[i] += 1
            if bundles[i] < min(job.max_workers, job.max_ps):
                heapq.heappush(queue, (bundles[i] * per_bundle[i], arrival, job_id, i))
        return placer.allocation()
