"""Throughput of federated A3C: slots of experience per second (all agents together) per agent count."""

from __future__ import annotations

import os
from pathlib import Path

from clusters.a3c.global_policy import A3COptions
from clusters.a3c.training import A3CRun
from clusters.a3c.weights import with_hidden_of
from dl2ray.config import ExperimentConfig


def bench_a3c(cfg: ExperimentConfig, agent_counts: list[int], seconds: float, seed: int = 0,
              warmup: float = 2.0, traces_per_agent: int = 20, single_process: bool = False,
              init: Path | None = None) -> dict:
    """For each count N: start a GlobalPolicy and N agents, warm up, then let every agent run ``seconds``.

    No validation and no checkpoints: only experience collection, gradients and
    pushes. ``slots_per_s`` = slots collected by all agents / ``seconds`` (each
    agent's own wall time of the measured call, averaged). ``speedup`` is
    relative to the first row; ``load_avg`` is the machine's 1-minute load
    average just before the measurement (other work competes for the same
    cores). Needs a running Ray instance with at least max(N) CPUs. The agents
    train ``cfg.policy.arch`` (shape: counterfactual credit in the config twin).

    ``single_process``: first measure the single-process trainer in this process
    (``train rl``: the paper's TD actor-critic with replay, or the counterfactual
    trainer for the shape policy) the same way — the reference A3C is compared with
    (``agents`` 1, ``mode`` ``process``; the Ray rows have ``mode`` ``ray``).

    ``init``: start every row from this checkpoint (its architecture and layer widths replace the
    config's), so the experience is the one a warm-started run collects; ``None``: fresh networks
    from ``seed`` (a fresh policy plays longer, slower slots than a trained one).
    """
    cfg = with_hidden_of(cfg, init)
    rows = [_single_process(cfg, init, seconds, seed, traces_per_agent)] if single_process else []
    for n in agent_counts:
        opts = A3COptions(agents=n, traces=traces_per_agent * n, val_every=None)
        run = A3CRun(cfg, init, seed, None, opts)
        try:
            run.run_for(warmup)  # actor start-up, imports and first traces out of the measurement
            load = os.getloadavg()[0]
            reps = run.run_for(seconds)
        finally:
            run.shutdown()
        wall = sum(r.seconds for r in reps) / len(reps)
        slots = sum(r.slots for r in reps)
        rows.append({"agents": n, "mode": "ray", "slots": slots, "steps": sum(r.steps for r in reps),
                     "updates": sum(r.pushed for r in reps), "seconds": round(wall, 3),
                     "slots_per_s": round(slots / wall, 2), "load_avg": round(load, 2)})
    base = rows[0]["slots_per_s"] if rows else 0.0
    for r in rows:
        r["speedup"] = round(r["slots_per_s"] / base, 3)
    return {"config": cfg.name, "init": None if init is None else str(init), "seconds": seconds,
            "cpus": os.cpu_count(), "results": rows}


def _single_process(cfg: ExperimentConfig, init: Path | None, seconds: float, seed: int, traces: int) -> dict:
    """The single-process trainer's row: one warm-up update, then updates until ``seconds`` have passed."""
    import time

    from dl2ray.learn.rl import RLOptions, make_trainer

    trainer = make_trainer(cfg, init, seed, RLOptions(
        traces=traces, algo="counterfactual" if cfg.policy.arch == "shape" else "paper"))
    trainer.update()
    load = os.getloadavg()[0]
    t0, slots, steps, updates = time.perf_counter(), 0, 0, 0
    while time.perf_counter() - t0 < seconds:
        row = trainer.update()
        updates += 1
        slots += getattr(row, "slots", getattr(row, "new_slots", 0))
        steps += getattr(row, "tries", getattr(row, "new_steps", 0))
    wall = time.perf_counter() - t0
    return {"agents": 1, "mode": "process", "slots": slots, "steps": steps, "updates": updates,
            "seconds": round(wall, 3), "slots_per_s": round(slots / wall, 2), "load_avg": round(load, 2)}
