"""Headroom below the planner (issue 37, item 3): the search reference and the planner given each job's speed.

On the same traces (seeds ``--seed ..``, the true simulator): the ``--schedulers`` (default the planner,
Optimus and the two truth planners, ``planner-truth`` and ``planner-job-truth``, both †) and, for each
``--futures`` entry, the search reference of :mod:`dl2ray.studies.headroom` on top of the planner
(``0``: scored on the trace's own future, the optimistic bound; ``F``: on F redrawn futures, the honest
estimate), each candidate rolled out ``--horizon`` slots (``end``: to the end of the run). Per row: censored
average JCT per trace, mean ± 95 % Student-t half-width, and the paired ratio to the planner (per trace,
mean ± half-width). Validation seeds (2,000,000 onwards) by default: a reference to size a target, not a
test result.

    .venv/bin/python tests/bench/bench_headroom.py --config configs/testbed-layouts.yaml --seed 2000000 \\
        --traces 5 --horizon 10 --futures 0,4

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from json_out import print_json

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.comparison import compare
from dl2ray.evaluation.metrics import censored_avg_jct, mean_ci95
from dl2ray.studies.headroom import SearchSettings, search_episode


def _search(config: str | None, seed: int, s: SearchSettings) -> tuple[float, float, float]:
    """(censored avg JCT, share of slots where a change won, mean candidates per slot) of one searched run."""
    run = search_episode(load_config(config), seed, s, np.random.default_rng([seed, s.futures]))
    return censored_avg_jct(run.result), float(np.mean(run.changed)), float(np.mean(run.candidates))


def run(config: str | None, schedulers: list[str], futures: list[int], horizon: int | None, seeds: list[int],
        processes: int) -> dict:
    cfg = load_config(config)
    t0 = time.perf_counter()
    comp = compare(cfg, schedulers, seeds, processes=processes)
    jct = {s: comp.per_trace(s) for s in schedulers}
    extra: dict[str, dict[str, float]] = {}
    settings = [SearchSettings(horizon=horizon, futures=f) for f in futures]
    with ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = {(s.label, seed): pool.submit(_search, config, seed, s) for s in settings for seed in seeds}
        for s in settings:
            runs = [jobs[(s.label, seed)].result() for seed in seeds]
            jct[s.label] = [r[0] for r in runs]
            extra[s.label] = {"changed_share": float(np.mean([r[1] for r in runs])),
                              "candidates_per_slot": float(np.mean([r[2] for r in runs]))}
            print(f"[bench_headroom] {s.label}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
    if "planner" not in jct:
        raise UserError("--schedulers: must include planner (the ratios are to it)")
    base = jct["planner"]
    rows = []
    for name, values in jct.items():
        mean, half = mean_ci95(values)
        rmean, rhalf = mean_ci95([a / b for a, b in zip(values, base, strict=True)])
        rows.append({"scheduler": name, "avg_jct": mean, "ci95": half, "per_trace": values,
                     "vs_planner": {"mean": rmean, "ci95": rhalf}, **extra.get(name, {})})
    return {"bench": "headroom", "config": cfg.name, "seeds": seeds, "horizon": horizon or "end",
            "results": rows, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default=None)
    p.add_argument("--schedulers", default="planner,optimus,planner-truth,planner-job-truth")
    p.add_argument("--futures", default="0,4", help="comma-separated: 0 = own future, F = F redrawn")
    p.add_argument("--horizon", default="10", help="slots each candidate is rolled out, or 'end'")
    p.add_argument("--seed", type=int, default=2_000_000, help="first trace seed (validation: 2000000)")
    p.add_argument("--traces", type=int, default=5)
    p.add_argument("--processes", type=int, default=2)
    a = p.parse_args(argv)
    try:
        futures = [int(x) for x in a.futures.split(",") if x.strip()]
    except ValueError:
        p.error(f"--futures: {a.futures!r}: comma-separated counts, e.g. 0,4")
    if any(f < 0 for f in futures):
        p.error("--futures: each count must be >= 0")
    if a.horizon != "end" and (not a.horizon.isdigit() or int(a.horizon) < 1):
        p.error(f"--horizon: {a.horizon!r}: a number of slots >= 1, or 'end'")
    if a.traces < 1 or a.processes < 1:
        p.error("--traces and --processes must be >= 1")
    schedulers = [x.strip() for x in a.schedulers.split(",") if x.strip()]
    horizon = None if a.horizon == "end" else int(a.horizon)
    return print_json(p, lambda: run(a.config, schedulers, futures, horizon,
                                     list(range(a.seed, a.seed + a.traces)), a.processes))


if __name__ == "__main__":
    raise SystemExit(main())
