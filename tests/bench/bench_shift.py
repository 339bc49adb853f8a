"""A shift that hurts the planner (issue 37, item 4): the gate, the cost of re-profiling, learning online.

On a config whose cluster changed after its profile was taken (``speed.compute_scale`` or
``speed.bandwidth_scale``; e.g. ``configs/testbed-new-nodes.yaml``), against a fresh profile taken on the
changed cluster (``--fresh``, written by ``dl2ray profile -c CONFIG --seed 0 --out FRESH``):

- **gate** — on ``--gate-traces`` validation traces (seeds 2,000,000 onwards): the planner on the config's
  stale profile, the planner on the fresh one, Optimus (its fits see the changed cluster) and
  ``planner-truth`` †, each row's paired ratio to the re-profiled planner; the item goes on only if the
  stale planner is ≥ 1.10× the re-profiled one (``passed``).
- **re-profiling cost** — what measuring the fresh profile takes on the changed cluster: each of its points
  one profiling job of its ``(p, w)`` tasks, every task on a node of its own, for the task start
  (``sim.task_start_s``) and ``--window-iterations`` iterations at the job's true speed there: seconds, GPU
  seconds and the share of one slot of the whole cluster's GPUs.
- **curves** — each online run (``--run R.pt``; its record ``R.json``, written by ``dl2ray train rl``):
  validation avg JCT against the slots of its own cluster's experience, and the first validation at or below
  0.95× the stale planner and 1.03× the re-profiled one on the run's own validation traces (the issue's two
  targets; a test result is ``dl2ray compare`` of the runs' best checkpoints on fresh test seeds).

    .venv/bin/python tests/bench/bench_shift.py --config configs/testbed-new-nodes.yaml \\
        --fresh configs/profiles/testbed-new-nodes.json --run runs/shift/pg-planner-s0.pt

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from json_out import print_json

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig, load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.comparison import compare
from dl2ray.knowledge.profile import load_profile
from dl2ray.learn.validation import heuristic_jct
from dl2ray.speed import spread_layout
from dl2ray.world import speed_model

GATE = 1.10  # the stale planner over the re-profiled one, on validation, for the item to go on
STALE_TARGET, FRESH_TARGET = 0.95, 1.03  # DL2 online: ≤ 0.95× the stale planner, ≤ 1.03× the re-profiled


def gate(cfg: ExperimentConfig, fresh: str, traces: int) -> dict:
    """The four rows on the validation traces, each with its paired ratio to the re-profiled planner."""
    refreshed = f"planner:{fresh}"
    names = ["planner", refreshed, "optimus", "planner-truth"]
    comp = compare(cfg, names, seedsets.validation(traces), processes=1)
    base = np.array(comp.per_trace(refreshed))
    rows = {}
    for name in names:
        jct = np.array(comp.per_trace(name))
        ratio = jct / base
        half = float(1.96 * ratio.std(ddof=1) / np.sqrt(len(ratio))) if len(ratio) > 1 else 0.0
        rows[name] = {"avg_jct": float(jct.mean()), "vs_reprofiled": float(ratio.mean()),
                      "vs_reprofiled_ci95": half}
    return {"traces": traces, "rows": rows, "passed": rows["planner"]["vs_reprofiled"] >= GATE}


def reprofiling_cost(cfg: ExperimentConfig, fresh: str, window_iterations: int) -> dict:
    """Seconds, GPU-seconds and cluster-slot share of measuring every point of ``fresh`` once (docstring)."""
    prof, speed, cat = load_profile(fresh), speed_model(cfg), cfg.catalogue
    points = prof.source.get("points")
    if not points:
        raise UserError(f"{fresh}: source.points: the profile does not say which points it measured")
    runs = int(prof.source.get("runs", 1))
    seconds = gpu_seconds = 0.0
    for t in range(len(cat.types)):
        gpus_per_worker = float(cat.worker_demand[t][1])
        for p, w in points:
            bps = speed.batches_per_second(t, spread_layout(int(w), int(p)))
            # an iteration is a batch on every worker: w / bps seconds
            run_s = cfg.sim.task_start_s + window_iterations * int(w) / bps
            seconds += runs * run_s
            gpu_seconds += runs * run_s * int(w) * gpus_per_worker
    cluster_gpus = float(cfg.cluster.capacity[:, 1].sum())
    return {"points_per_type": len(points), "runs": runs, "window_iterations": window_iterations,
            "job_seconds": seconds, "gpu_hours": gpu_seconds / 3600,
            "cluster_gpu_slots": gpu_seconds / (cluster_gpus * cfg.sim.slot_seconds)}


def curve(record: dict) -> list[tuple[int, int, float]]:
    """``(update, slots of experience, validation avg JCT)`` of a run record (slots summed over updates)."""
    slots = np.cumsum([0] + [int(h["slots"]) for h in record["history"]])
    return [(int(v["update"]), int(slots[min(int(v["update"]), len(slots) - 1)]), float(v["avg_jct"]))
            for v in record["validation"]]


def first_at(points: list[tuple[int, int, float]], level: float) -> dict | None:
    """The first validation at or below ``level``: its update and slots, or None."""
    hit = next(((u, s) for u, s, j in points if j <= level), None)
    return None if hit is None else {"update": hit[0], "slots": hit[1]}


def run_curves(cfg: ExperimentConfig, fresh: str, runs: list[Path]) -> list[dict]:
    out = []
    for path in runs:
        try:
            record = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"--run {path}: no readable run record beside it ({exc})") from None
        val = [int(s) for s in record["val_seeds"]]
        stale, refreshed = heuristic_jct(cfg, "planner", val), heuristic_jct(cfg, f"planner:{fresh}", val)
        points = curve(record)
        best = min(points, key=lambda p: p[2])
        out.append({"run": str(path), "init": record.get("init"), "seed": record.get("seed"),
                    "stale_planner": stale, "reprofiled_planner": refreshed, "curve": points,
                    "start": points[0][2], "best": {"update": best[0], "slots": best[1], "avg_jct": best[2]},
                    "end": points[-1][2],
                    "to_0.95_stale": first_at(points, STALE_TARGET * stale),
                    "to_1.03_reprofiled": first_at(points, FRESH_TARGET * refreshed)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/testbed-new-nodes.yaml")
    p.add_argument("--fresh", required=True, help="the profile taken on the changed cluster")
    p.add_argument("--gate-traces", type=int, default=10)
    p.add_argument("--window-iterations", type=int, default=35, help="iterations timed per profile point "
                   "(the live profiler's default: 5 of warm-up and 30 measured)")
    p.add_argument("--run", type=Path, action="append", default=[],
                   help="an online run's checkpoint (repeat)")
    p.add_argument("--no-gate", action="store_true", help="skip the gate (the curves alone)")
    a = p.parse_args(argv)
    if a.gate_traces < 2 or a.window_iterations < 1:
        p.error("--gate-traces must be >= 2 and --window-iterations >= 1")

    def build() -> dict:
        cfg = load_config(a.config)
        load_profile(a.fresh).covers(cfg.catalogue, "--fresh")
        return {"bench": "shift", "config": cfg.name, "fresh": a.fresh,
                "gate": None if a.no_gate else gate(cfg, a.fresh, a.gate_traces),
                "reprofiling_cost": reprofiling_cost(cfg, a.fresh, a.window_iterations),
                "runs": run_curves(cfg, a.fresh, a.run)}

    return print_json(p, build)


if __name__ == "__main__":
    sys.exit(main())
