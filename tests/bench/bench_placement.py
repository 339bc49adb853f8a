"""How much of a shape policy's gap to the planner is its decoder: the decoder's placement, per-job against
interleaved (``policy.shape.placement``; docs/notebook/2026-11-28.md, "The decoder's placement").

Rows, each on the same traces and noise seeds (the true simulator), average JCT and the paired ratio to the
planner (per trace, mean ± 95 % Student-t half-width):

- ``planner``: the teacher itself;
- ``menu per-job`` / ``menu interleaved``: the planner's own decisions sent through the shape policy's
  action space, each job's ``(workers, PS)`` labelled with its nearest menu row as SL labels it, then
  decoded by :func:`~dl2ray.policy.shape_decode.decide_shapes` — a perfect imitator of the teacher;
- ``dl2 per-job`` / ``dl2 interleaved``: the checkpoint ``--model`` decoded each way.

    .venv/bin/python tests/bench/bench_placement.py --config configs/testbed.yaml \\
        --model models/dl2-testbed.pt --seed 2000000 --traces 5

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable

import numpy as np

from dl2ray.config import load_config
from dl2ray.evaluation.metrics import censored_avg_jct, mean_ci95
from dl2ray.learn.shape.sl import teacher_sample
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import run_episode
from dl2ray.view import Allocation, ClusterView
from dl2ray.world import build_simulator


class PlannerThroughMenu:
    """The planner's allocation of each slot as the shape policy would carry it out: every job's menu label
    (its nearest row, wait where that row does not fit) given all the probability, then decoded."""

    name = "planner-through-menu"

    def __init__(self, cfg, enc: ShapeEncoding) -> None:
        self.planner, self.enc = make_scheduler("planner", cfg), enc

    def reset(self, seed: int) -> None:
        if hasattr(self.planner, "reset"):
            self.planner.reset(seed)

    def decide(self, view: ClusterView) -> Allocation:
        label = self.planner.decide(view)
        if not view.jobs:
            return label
        sample = teacher_sample(view, self.enc, label)
        logits = np.zeros((len(view.jobs), self.enc.num_shapes), np.float32)
        logits[np.arange(len(view.jobs)), sample.actions] = 20.0
        return decide_shapes(view, self.enc, logits).allocation


def _ratio(values: np.ndarray) -> dict[str, float]:
    """Mean and 95 % Student-t half-width of paired per-trace ratios."""
    mean, half = mean_ci95(values.tolist())
    return {"mean": round(mean, 4), "ci95": round(half, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", required=True, help="a shape checkpoint (its own placement is ignored)")
    ap.add_argument("--seed", type=int, required=True, help="first trace (or noise) seed")
    ap.add_argument("--traces", type=int, default=5)
    ap.add_argument("--trace", help="a fixed Parquet trace: the seeds then vary only the noise")
    args = ap.parse_args()
    cfg = load_config(args.config)
    trace = None
    if args.trace:
        from dl2ray.traces.parquet import read_trace

        trace = read_trace(args.trace, cfg.catalogue)
    enc = ShapeEncoding.from_config(cfg)
    per_job, inter = dataclasses.replace(enc, interleaved=False), dataclasses.replace(enc, interleaved=True)

    def student(e: ShapeEncoding):
        sched = make_scheduler(f"dl2:{args.model}", cfg)
        sched.enc = dataclasses.replace(sched.enc, interleaved=e.interleaved)
        return sched

    rows: dict[str, Callable[[], object]] = {
        "planner": lambda: make_scheduler("planner", cfg),
        "menu per-job": lambda: PlannerThroughMenu(cfg, per_job),
        "menu interleaved": lambda: PlannerThroughMenu(cfg, inter),
        "dl2 per-job": lambda: student(per_job),
        "dl2 interleaved": lambda: student(inter),
    }
    seeds = range(args.seed, args.seed + args.traces)
    jct = {k: np.array([censored_avg_jct(run_episode(build_simulator(cfg, trace), make(), s)) for s in seeds])
           for k, make in rows.items()}
    out = {"config": args.config, "model": args.model, "trace": args.trace, "seeds": list(seeds),
           "rows": {k: {"avg_jct": round(float(v.mean()), 3), "over_planner": _ratio(v / jct["planner"])}
                    for k, v in jct.items()},
           "dl2 interleaved over per-job": _ratio(jct["dl2 interleaved"] / jct["dl2 per-job"])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
