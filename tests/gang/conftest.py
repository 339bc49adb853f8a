"""Tiny gang-mode configs and traces (SCHED²'s catalogue on 3 servers × 4 GPUs)."""

from __future__ import annotations

import pytest
from support import CONFIGS

from dl2ray.config import ClusterConfig, NodeGroup, load_config
from dl2ray.workload import JobSpec, sort_trace


@pytest.fixture(scope="session")
def sched2_cfg():
    """configs/sched2.yaml on 3 servers × 4 GPUs with 60-s slots (Philly jobs of ≤ 8 GPUs, ≤ 4 h)."""
    cfg = load_config(CONFIGS / "sched2.yaml")
    return cfg.model_copy(
        update={
            "gang": cfg.gang.model_copy(update={"max_gpus": 8, "max_duration_s": 4 * 3600.0}),
            "cluster": ClusterConfig(
                nodes=(NodeGroup(count=3, cpu=16, gpu=4, mem=128),), placement="packing"
            ),
            "sim": cfg.sim.model_copy(update={"max_slots": 3000}),
        }
    )


def gang_trace(cat, jobs) -> tuple[JobSpec, ...]:
    """``jobs``: (type index, arrival slot, ideal seconds, GPUs) → all-reduce JobSpecs."""
    out = []
    for i, (t, arrival, seconds, gpus) in enumerate(jobs):
        jt = cat.types[t % len(cat)]
        batches = seconds / jt.compute_s
        out.append(JobSpec(i, jt.name, arrival, batches, batches, workers=gpus, ps=0))
    return sort_trace(out)
