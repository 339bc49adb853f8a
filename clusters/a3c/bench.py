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
              init: Path | None = None, plain: bool = False, same_traces: bool = False) -> dict:
    """For each count N: start a GlobalPolicy and N agents, warm up, then let every agent run ``seconds``.

    No validation and no checkpoints: only experience collection, gradients and
    pushes. ``slots_per_s`` = slots collected by all agents / ``seconds`` (each
    agent's own wall time of the measured call, averaged). ``speedup`` is
    relative to the row of the same ``mode`` with the fewest agents; ``load_avg``
    is the machine's 1-minute load average just before the measurement (other work competes for the same
    cores). Needs a running Ray instance with at least max(N) CPUs. The agents
    train ``cfg.policy.arch`` (shape: counterfactual credit in the config twin).

    ``single_process``: first measure the single-process trainer in this process
    (``train rl``: the paper's TD actor-critic with replay, or the counterfactual
    trainer for the shape policy) the same way — the reference A3C is compared with
    (``agents`` 1, ``mode`` ``process``; the Ray rows have ``mode`` ``ray``).

    ``plain``: before each Ray row, the same agents' computation in as many plain processes without
    Ray (``mode`` ``plain``, :mod:`clusters.a3c.plain`): its scaling is what the machine gives for this
    work, and a Ray row's ``of_plain`` (its slots/s over the plain row's) what Ray's parts cost.

    ``same_traces``: every agent cycles the same ``traces_per_agent`` training traces (not its own part
    of N times as many), so that every row does the same work per push: an update's cost depends on
    its trace (11–38 s on the testbed for the same weights), and a few updates per row sample only a
    few traces. Training never does this; it is the benchmark's control.

    ``init``: start every row from this checkpoint (its architecture and layer widths replace the
    config's), so the experience is the one a warm-started run collects; ``None``: fresh networks
    from ``seed`` (a fresh policy plays longer, slower slots than a trained one).
    """
    cfg = with_hidden_of(cfg, init)
    rows = [_single_process(cfg, init, seconds, seed, traces_per_agent)] if single_process else []
    for n in agent_counts:
        opts = A3COptions(agents=n, traces=traces_per_agent * (1 if same_traces else n), val_every=None,
                          same_traces=same_traces)
        if plain:
            rows.append(_plain(cfg, init, n, seconds, seed, opts))
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
    for r in rows:
        same = [o for o in rows if o["mode"] == r["mode"]]
        r["speedup"] = round(r["slots_per_s"] / min(same, key=lambda o: o["agents"])["slots_per_s"], 3)
        twin = [o for o in rows if o["mode"] == "plain" and o["agents"] == r["agents"]]
        if r["mode"] == "ray" and twin:
            r["of_plain"] = round(r["slots_per_s"] / twin[0]["slots_per_s"], 3)
    return {"config": cfg.name, "init": None if init is None else str(init), "seconds": seconds,
            "same_traces": same_traces, "cpus": os.cpu_count(), "results": rows}


def _plain(cfg: ExperimentConfig, init: Path | None, n: int, seconds: float, seed: int,
           opts: A3COptions) -> dict:
    """The plain-process row for ``n`` agents (:func:`clusters.a3c.plain.plain_row`)."""
    from clusters.a3c.plain import PlainJob, plain_row

    jobs = [PlainJob(cfg, None if init is None else str(init), seed, i, opts.agent_traces(i),
                     opts.local_settings(), opts.threads, seconds) for i in range(n)]
    return plain_row(jobs, timeout_s=10 * seconds + 600)


def _single_process(cfg: ExperimentConfig, init: Path | None, seconds: float, seed: int, traces: int) -> dict:
    """The single-process trainer's row: one warm-up update, then updates until ``seconds`` have passed."""
    import time

    from dl2ray.learn.records import RLOptions
    from dl2ray.learn.train import make_trainer

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
