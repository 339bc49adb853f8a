"""Every scheduler under every placer on the same traces: how to choose a scheduler's placement on validation.

For each ``--placers`` entry (``own`` and the policies of :data:`dl2ray.cluster.PLACEMENTS`), every
``--schedulers`` entry runs on the same traces (seeds ``--seed ..``, the true simulator) forced onto that
placer (``dl2ray compare --placement P``). Per (scheduler, placer): average JCT, mean ± 95 % Student-t
half-width over the traces, and the paired ratio (per trace, mean ± half-width) to ``--baseline`` (a
``scheduler@placer`` pair, default the first scheduler under the first placer). ``best`` names each
scheduler's placer of lowest mean JCT: what the planner and a DL2 checkpoint are given as their own
(``planner``'s class attribute; ``dl2ray train ship|retest --placer``), chosen on validation seeds
(:func:`dl2ray.seeds.validation`, 2,000,000 onwards), never on test seeds.

    .venv/bin/python tests/bench/bench_placers.py --config configs/testbed.yaml --seed 2000000 --traces 5 \\
        --schedulers planner,optimus,dl2:models/dl2-testbed.pt

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time

from json_out import print_json

from dl2ray.cluster import PLACEMENTS
from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.comparison import compare
from dl2ray.evaluation.metrics import mean_ci95


def run(config: str | None, schedulers: list[str], placers: list[str], seeds: list[int],
        baseline: str | None, processes: int | None, trace_path: str | None = None) -> dict:
    cfg = load_config(config)
    trace = None
    if trace_path is not None:
        from dl2ray.traces.parquet import read_trace

        trace = read_trace(trace_path, cfg.catalogue)
    jct: dict[str, dict[str, list[float]]] = {s: {} for s in schedulers}
    used: dict[str, dict[str, str]] = {s: {} for s in schedulers}
    t0 = time.perf_counter()
    for placer in placers:
        forced = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"placement": placer})})
        comp = compare(forced, schedulers, seeds, trace=trace, processes=processes)
        for s in schedulers:
            jct[s][placer] = comp.per_trace(s)
            used[s][placer] = comp.runs[s][0].placement
        print(f"[bench_placers] {placer}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)
    base_s, _, base_p = (baseline or f"{schedulers[0]}@{placers[0]}").partition("@")
    if base_s not in jct or base_p not in jct[base_s]:
        raise UserError(f"--baseline {baseline!r}: not among the schedulers and placers run")
    base = jct[base_s][base_p]
    rows = []
    for s in schedulers:
        for p in placers:
            mean, half = mean_ci95(jct[s][p])
            ratios = [a / b for a, b in zip(jct[s][p], base, strict=True)]
            rmean, rhalf = mean_ci95(ratios)
            rows.append({"scheduler": s, "placer": p, "placement": used[s][p], "avg_jct": mean, "ci95": half,
                         "per_trace": jct[s][p], "vs_baseline": {"mean": rmean, "ci95": rhalf}})
    best = {s: min((p for p in placers if p != "own"), key=lambda p: sum(jct[s][p]), default=None)
            for s in schedulers}
    return {"bench": "placers", "config": cfg.name, "seeds": seeds, "trace": trace_path,
            "baseline": f"{base_s}@{base_p}",
            "results": rows, "best": best, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default=None)
    p.add_argument("--schedulers", default="planner,optimus")
    p.add_argument("--placers", default="own," + ",".join(PLACEMENTS))
    p.add_argument("--seed", type=int, default=2_000_000, help="first trace seed (validation: 2000000)")
    p.add_argument("--traces", type=int, default=5)
    p.add_argument("--baseline", default=None, help="scheduler@placer (default: the first of each)")
    p.add_argument("--processes", type=int, default=None)
    p.add_argument("--trace", default=None, help="a fixed Parquet trace (the seeds then drive the noise)")
    a = p.parse_args(argv)
    placers = [x.strip() for x in a.placers.split(",") if x.strip()]
    bad = [x for x in placers if x != "own" and x not in PLACEMENTS]
    if bad:
        p.error(f"--placers: unknown {bad}; known: own, {', '.join(PLACEMENTS)}")
    if a.traces < 1:
        p.error("--traces must be >= 1")
    schedulers = [x.strip() for x in a.schedulers.split(",") if x.strip()]
    return print_json(p, lambda: run(a.config, schedulers, placers, list(range(a.seed, a.seed + a.traces)),
                                     a.baseline, a.processes, a.trace))


if __name__ == "__main__":
    raise SystemExit(main())
