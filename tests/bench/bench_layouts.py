"""What the layout menu is worth and how a layout policy uses it (issue 36), on validation seeds.

``usage``: a layout checkpoint's greedy decisions over ``--traces`` validation traces: how often each
layout (``policy.shape.layouts``) and each ``(workers, PS)`` row is chosen, in all and per job type.

    .venv/bin/python tests/bench/bench_layouts.py usage --config configs/testbed-layouts.yaml \\
        --model models/dl2-testbed.pt --traces 3

``headroom``: the planner's own counts sent through the menu (its decisions labelled with their nearest
rows, as supervised learning labels them) with one layout per job type, the types' layouts chosen by
greedy coordinate search (each type in turn tries every layout, keeping the best mean JCT); the mean JCT
against the planner's under its own placer — what choosing layouts alone, without changing the counts,
could gain.

    .venv/bin/python tests/bench/bench_layouts.py headroom --config configs/testbed-layouts.yaml --traces 5

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

import numpy as np

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.metrics import censored_avg_jct
from dl2ray.learn.shape.sl import teacher_sample
from dl2ray.policy.shape import ShapeEncoding, job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.schedulers.base import make_scheduler
from dl2ray.seeds import validation
from dl2ray.sim import run_episode
from dl2ray.view import Allocation, ClusterView
from dl2ray.world import build_simulator


def usage(config: str, model: str, traces: int) -> dict:
    """Layout and row counts of ``model``'s greedy decisions on ``traces`` validation traces."""
    cfg = load_config(config)
    inner = make_scheduler(f"dl2:{model}", cfg).inner
    enc = inner.enc
    if not enc.layouts:
        raise UserError(f"--model: {model} chooses no layouts (policy.shape.layouts is empty)")
    layouts, rows, per_type = Counter(), Counter(), Counter()
    for seed in validation(traces):
        sim = build_simulator(cfg)
        view = sim.reset(seed)
        while not sim.done:
            if not view.jobs:
                view = sim.step(inner.decide(view)).view
                continue
            x, g = job_features(view, enc)
            d = decide_shapes(view, enc, inner.policy.logits(x, g))
            for job, a in zip(view.jobs, d.actions, strict=True):
                if a > 0:
                    name = enc.layouts[enc.row_layouts[a]]
                    layouts[name] += 1
                    rows["x".join(map(str, enc.menu[a]))] += 1
                    per_type[f"{job.job_type}/{name}"] += 1
            view = sim.step(d.allocation).view
    return {"bench": "layouts-usage", "config": cfg.name, "model": model, "seeds": validation(traces),
            "layouts": dict(layouts), "rows_workers_x_ps": dict(rows.most_common(12)),
            "per_type": dict(sorted(per_type.items()))}


class _PlannerThroughMenu:
    """The planner's decision labelled with its nearest menu rows, each job's row moved to its type's
    layout, decoded as the policy's decisions are."""

    name = "planner-through-menu"

    def __init__(self, cfg, enc: ShapeEncoding, per_type: list[int]) -> None:
        self.planner, self.enc, self.per_type = make_scheduler("planner", cfg), enc, per_type
        self.first = enc.layouts[0]

    def reset(self, seed: int) -> None:
        pass

    def decide(self, view: ClusterView) -> Allocation:
        label = self.planner.decide(view)
        if not view.jobs:
            return label
        acts = teacher_sample(view, self.enc, label, self.first).actions.copy()
        for i, job in enumerate(view.jobs):
            if acts[i] > 0:
                acts[i] += self.per_type[job.type_index]
        logits = np.zeros((len(view.jobs), self.enc.num_shapes), np.float32)
        logits[np.arange(len(view.jobs)), acts] = 20.0
        return decide_shapes(view, self.enc, logits).allocation


def headroom(config: str, traces: int) -> dict:
    """The greedy per-type layout search of the module docstring."""
    cfg = load_config(config)
    shape = cfg.policy.shape
    if len(shape.layouts) < 2:
        raise UserError(f"--config: {config}: policy.shape.layouts names fewer than two layouts")
    # the planner's exact counts must be on the menu: 1-12 workers x 1-16 PS
    shape = shape.model_copy(update={"menu_workers": tuple(range(1, 13)), "menu_ps": tuple(range(1, 17))})
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"shape": shape})})
    enc = ShapeEncoding.from_config(cfg)
    seeds = validation(traces)

    def score(per_type: list[int]) -> list[float]:
        # a shape's rows follow each other, one per layout (policy.shape.menu_rows): row + layout index
        sched = _PlannerThroughMenu(cfg, enc, per_type)
        return [censored_avg_jct(run_episode(build_simulator(cfg), sched, s))
                for s in seeds]

    planner = [censored_avg_jct(run_episode(build_simulator(cfg), make_scheduler("planner", cfg), s))
               for s in seeds]
    chosen = [0] * len(cfg.catalogue)
    best = score(chosen)
    through = float(np.mean(best))
    for t in range(len(cfg.catalogue)):
        for layout in range(1, len(enc.layouts)):
            cand = [*chosen[:t], layout, *chosen[t + 1:]]
            jct = score(cand)
            if np.mean(jct) < np.mean(best):
                chosen, best = cand, jct
    ratio = [a / b for a, b in zip(best, planner, strict=True)]
    return {"bench": "layouts-headroom", "config": cfg.name, "seeds": seeds,
            "planner": float(np.mean(planner)), "through_menu": through,
            "per_type": {cfg.catalogue.names[t]: enc.layouts[chosen[t]] for t in range(len(chosen))},
            "best": float(np.mean(best)), "best_over_planner": float(np.mean(ratio))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    u = sub.add_parser("usage", help="which layouts and rows a layout checkpoint chooses")
    u.add_argument("--config", required=True)
    u.add_argument("--model", required=True)
    u.add_argument("--traces", type=int, default=3)
    h = sub.add_parser("headroom", help="the planner's counts with the best layout per job type")
    h.add_argument("--config", required=True)
    h.add_argument("--traces", type=int, default=5)
    args = ap.parse_args(argv)
    if args.traces < 1:
        ap.error(f"--traces: {args.traces}: need at least one trace")
    t0 = time.perf_counter()
    try:
        out = usage(args.config, args.model, args.traces) if args.what == "usage" else \
            headroom(args.config, args.traces)
    except UserError as exc:
        ap.exit(2, f"error: {exc}\n")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
