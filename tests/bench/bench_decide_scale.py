"""How one slot's decision grows with the cluster: ``bench decide`` at several sizes, a log–log fit and plot.

For each scheduler (a shape checkpoint ``dl2:PATH``, or a registered heuristic such as ``planner``) and each
size ``JOBSxNODES`` of ``--sizes``: :func:`dl2ray.cli.bench.measure_decide` on a generated view
(``synthetic_view``: every job ran three slots; the config's first node kind), under the scheduler's own
placer, as deployed. The exponent is the slope of ``log p50`` against ``log jobs`` (numpy ``polyfit``; the
nodes grow with the jobs). Prints one JSON object per measurement, then one with the fits; ``--plot``
writes time against jobs on log–log axes (p50 lines, p99 markers).

    .venv/bin/python tests/bench/bench_decide_scale.py --config configs/large.yaml \\
        --schedulers dl2:models/dl2-large.pt,planner --sizes 40x500,400x2000,4000x10000 \\
        --plot docs/decide-scale.png
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from dl2ray.cli.bench import measure_decide
from dl2ray.config import load_config


def fit_exponent(jobs: list[int], ms: list[float]) -> float:
    """The slope of ``log ms`` against ``log jobs`` (least squares)."""
    return float(np.polyfit(np.log(jobs), np.log(ms), 1)[0])


def plot(rows: list[dict], fits: dict[str, float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for k, name in enumerate(fits):
        mine = [r for r in rows if r["scheduler"] == name]
        jobs = [r["jobs"] for r in mine]
        ax.plot(jobs, [r["p50_ms"] for r in mine], "-o", color=f"C{k}",
                label=f"{name} p50 (slope {fits[name]:.2f})")
        ax.plot(jobs, [r["p99_ms"] for r in mine], "x", color=f"C{k}", label=f"{name} p99")
        for r in mine:
            ax.annotate(f"{r['nodes']} nodes", (r["jobs"], r["p50_ms"]), fontsize=7, xytext=(4, -10),
                        textcoords="offset points")
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("jobs in the view")
    ax.set_ylabel("one slot's decision, ms")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/large.yaml"))
    ap.add_argument("--schedulers", default="dl2:models/dl2-large.pt,planner")
    ap.add_argument("--sizes", default="40x500,400x2000,4000x10000")
    ap.add_argument("--repeats", default="200,100,30", help="per size, for a dl2 checkpoint")
    ap.add_argument("--heuristic-repeats", default="20,3,1", help="per size, for a heuristic (slower)")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--gc-freeze", action="store_true", help="bench decide --gc-freeze")
    ap.add_argument("--rows", type=Path, help="plot and fit these JSON lines (earlier output), not measure")
    args = ap.parse_args()
    cfg = load_config(args.config)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    rows = []
    if args.rows:
        rows = [json.loads(line) for line in args.rows.read_text().splitlines() if '"bench"' in line]
    for name in args.schedulers.split(",") if not args.rows else ():
        per = args.repeats if name.startswith("dl2:") else args.heuristic_repeats
        repeats = [int(r) for r in per.split(",")]
        for (jobs, nodes), reps in zip(sizes, repeats, strict=True):
            if name.startswith("dl2:"):
                doc = measure_decide(cfg, policy=Path(name[4:]), jobs=jobs, nodes=nodes, repeats=reps,
                                     gc_freeze=args.gc_freeze)
            else:
                doc = measure_decide(cfg, scheduler=name, jobs=jobs, nodes=nodes, repeats=reps,
                                     gc_freeze=args.gc_freeze)
            doc["scheduler"] = name
            rows.append(doc)
            print(json.dumps(doc), flush=True)
    fits = {name: round(fit_exponent([r["jobs"] for r in rows if r["scheduler"] == name],
                                     [r["p50_ms"] for r in rows if r["scheduler"] == name]), 3)
            for name in dict.fromkeys(r["scheduler"] for r in rows)}
    print(json.dumps({"fits": {"p50_ms_vs_jobs_log_log_slope": fits}}))
    if args.plot:
        loads = [x for r in rows for x in r["load_avg"]]
        plot(rows, fits, args.plot, f"{cfg.name}: one decision against size, load average "
                                    f"{min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
