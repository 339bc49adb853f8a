"""What one training slot of the counterfactual learner costs (``train rl --algo counterfactual``): the
greedy policy runs ``--skip`` slots of a training episode, then the collector takes ``--slots`` training
slots there, each with its rollouts (the greedy decision and every tried row, each simulated to
``policy.shape.horizon`` slots or the end of the run; docs/policy.md). An update is
``policy.shape.slots_per_update`` such slots, so this sizes a run before it is started
(docs/notebook/2026-11-28.md, "Re-shipped models from the distributed learner": large-busy).

    .venv/bin/python tests/bench/bench_cf_slot.py --config configs/large-busy.yaml \\
        --model models/dl2-large.pt --skip 30 --slots 2

Prints one JSON object: per slot its seconds, rollouts and jobs in view, and the update's estimate.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dl2ray import seeds
from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.learn.shape.twin import TwinExperience
from dl2ray.schedulers.base import make_scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path, help="shape checkpoint (the run's --init)")
    ap.add_argument("--skip", type=int, default=30, help="greedy slots before the measured ones")
    ap.add_argument("--slots", type=int, default=2, help="training slots measured")
    ap.add_argument("--seed", type=int, default=0, help="tried jobs and rows")
    a = ap.parse_args()
    try:
        cfg = load_config(a.config)
        greedy = make_scheduler(f"dl2:{a.model}", cfg)  # the shape policy, greedy, as deployed
    except UserError as exc:
        ap.error(str(exc))
    policy = greedy.policy
    collector = TwinExperience(cfg, seeds.training(1), np.random.default_rng(a.seed), "config").collector
    collector.sims, collector._views = collector.sims[:1], [None]  # one episode: the one stepped below
    sim, view = collector.sims[0], collector._next_view(0)
    for _ in range(a.skip):
        res = sim.step(greedy.decide(view))
        if res.done:
            raise SystemExit(f"--skip {a.skip}: the episode ended first")
        view = res.view
    collector._views[0] = view  # the collector goes on from here (it has no public way to start mid-run)
    rows = []
    for _ in range(a.slots):
        jobs = len(collector._next_view(0).jobs)
        t0 = time.perf_counter()
        out = collector.collect(policy, 1)
        seconds = round(time.perf_counter() - t0, 2)
        rows.append({"seconds": seconds, "rollouts": out.rollouts, "jobs_in_view": jobs})
    s = cfg.policy.shape
    per_slot = float(np.mean([r["seconds"] for r in rows]))
    print(json.dumps({"config": cfg.name, "model": str(a.model), "skip": a.skip, "slots": rows,
                      "slots_per_update": s.slots_per_update, "jobs_per_slot": s.jobs_per_slot,
                      "tries_per_job": 1 + s.samples + s.uniform, "horizon": s.horizon,
                      "update_hours_one_core": round(per_slot * s.slots_per_update / 3600, 2)}))


if __name__ == "__main__":
    main()
