"""Tiny hand-built views for the policy tests."""

from __future__ import annotations

import numpy as np
from support import small_config

from dl2ray.view import ClusterView, JobView

CFG = small_config(cluster={"nodes": [{"count": 2, "cpu": 8, "gpu": 2, "mem": 48}]})
CAT = CFG.catalogue
L = len(CAT)


def job(job_id: int, type_name: str = "resnet-50", slots_run: int = 0, done: float = 0.0,
        est: float = 100.0, max_workers: int | None = None, max_ps: int | None = None) -> JobView:
    ti = CAT.index(type_name)
    jt = CAT.types[ti]
    return JobView(job_id, type_name, ti, 0, slots_run, est, done, 0, 0, (), (),
                   CAT.worker_demand[ti], CAT.ps_demand[ti],
                   max_workers or jt.max_workers, max_ps or jt.max_ps)


def view(*jobs: JobView, nodes: int = 2, cpu: float = 8, gpu: float = 2) -> ClusterView:
    cap = np.tile([[cpu, gpu, 48.0]], (nodes, 1))
    return ClusterView(0, 1200.0, cap, cap, tuple(jobs), CAT, "load_balancing")
