"""Throughput of federated A3C: slots of experience per second (all agents together) per agent count."""

from __future__ import annotations

import os

from clusters.a3c.global_policy import A3COptions
from clusters.a3c.training import A3CRun
from dl2ray.config import ExperimentConfig


def bench_a3c(cfg: ExperimentConfig, agent_counts: list[int], seconds: float, seed: int = 0,
              warmup: float = 2.0, traces_per_agent: int = 20) -> dict:
    """For each count N: start a GlobalPolicy and N agents, warm up, then let every agent run ``seconds``.

    No validation and no checkpoints: only experience collection, gradients and
    pushes. ``slots_per_s`` = slots collected by all agents / ``seconds`` (each
    agent's own wall time of the measured call, averaged). ``speedup`` is
    relative to the first count; ``load_avg`` is the machine's 1-minute load
    average just before the measurement (other work competes for the same
    cores). Needs a running Ray instance with at least max(N) CPUs.
    """
    rows = []
    for n in agent_counts:
        opts = A3COptions(agents=n, traces=traces_per_agent * n, val_every=None)
        run = A3CRun(cfg, None, seed, None, opts)
        try:
            run.run_for(warmup)  # actor start-up, imports and first traces out of the measurement
            load = os.getloadavg()[0]
            reps = run.run_for(seconds)
        finally:
            run.shutdown()
        wall = sum(r.seconds for r in reps) / len(reps)
        slots = sum(r.slots for r in reps)
        rows.append({"agents": n, "slots": slots, "steps": sum(r.steps for r in reps),
                     "updates": sum(r.pushed for r in reps), "seconds": round(wall, 3),
                     "slots_per_s": round(slots / wall, 2), "load_avg": round(load, 2)})
    base = rows[0]["slots_per_s"] if rows else 0.0
    for r in rows:
        r["speedup"] = round(r["slots_per_s"] / base, 3)
    return {"config": cfg.name, "seconds": seconds, "cpus": os.cpu_count(), "results": rows}
