"""How much of the cluster a job holds or may get: dominant shares, bundle limits, filling bundles. Shared by
the heuristics; below the registry (:mod:`dl2ray.schedulers.base`), which re-exports them."""

from __future__ import annotations

import numpy as np

from dl2ray.view import JobView


def dominant_share(job: JobView, workers: int, ps: int, total: np.ndarray) -> float:
    """``max_r (workers·d_w + ps·d_p)_r / total_r`` over resources with capacity."""
    used = workers * job.worker_demand + ps * job.ps_demand
    mask = total > 0
    return float(np.max(used[mask] / total[mask])) if mask.any() else 0.0


def bundle_limit(job: JobView, requested: bool) -> int:
    """Most bundles a size-respecting scheduler gives ``job``: its requested size within the caps
    (``requested``), or the caps alone (the published code's fill-to-cap)."""
    return job.requested_limit if requested else job.bundle_cap


def fill_bundles(placer, job: JobView, limit: int | None = None) -> int:
    """Give ``job`` bundles (1 worker + 1 PS) until it holds ``limit`` (default: its caps) or none fits.

    ``placer`` is a :class:`dl2ray.cluster.Placer`; returns the bundles added.
    """
    added = 0
    w, p = placer.tasks(job.job_id)
    top = job.bundle_cap if limit is None else min(limit, job.bundle_cap)
    while w < top and p < top:
        if not placer.place_bundle(job.job_id, job.worker_demand, job.ps_demand):
            break
        w, p, added = w + 1, p + 1, added + 1
    return added
