"""Fig. 15 alone (unseen job types, :mod:`dl2ray.studies.unseen`), without the rest of ``experiment paper``.

The teacher's SL student on every type and its online RL run (the ideal line), the student on the first
half of the types and its phases (the unseen line), the planner's validation level; one seed. Prints one
JSON object (the curve, the ideal curve and the table of :func:`dl2ray.studies.unseen.summary`) and writes
``OUT/fig15.png``.

    .venv/bin/python tests/bench/bench_unseen.py --config configs/testbed-online.yaml --updates 15 \
        --out runs/unseen
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from json_out import print_json

from dl2ray import seeds as seedsets
from dl2ray.config import load_config
from dl2ray.learn.validation import heuristic_jct
from dl2ray.studies.learning import RunPlan, train_one
from dl2ray.studies.paper import PaperResult, PaperSettings, train_student, unseen_phases
from dl2ray.studies.paper_report import plot_unseen
from dl2ray.studies.unseen import summary


def run(config: str, updates: int, teacher: str, seed: int, val_every: int, workers: int, out: Path) -> dict:
    cfg = load_config(config)
    s = PaperSettings(updates=updates, seeds=(seed,), teachers=(teacher,), val_every=val_every,
                      workers=workers)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    student = out / f"sl-{teacher}.pt"
    if not student.exists():
        train_student(cfg, s, teacher, out, student)
    name = f"{teacher}@{seed}"
    ideal_plan = RunPlan(name, cfg, student, s.options(), updates, seed, out / f"{name}.pt", resume=True)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:  # the ideal run beside the phases
        ideal_run = pool.submit(train_one, ideal_plan)
        points, counts, per = unseen_phases(cfg, s, out)
        ideal = [(v.update, v.avg_jct) for v in ideal_run.result().validation]
    val_seeds = seedsets.validation(s.val_traces)
    planner = heuristic_jct(cfg, "planner", val_seeds)
    curve = [(u, name, j) for u, j in ideal] + [(u, "planner", planner) for u, _ in ideal]
    result = PaperResult(cfg.name, s, {teacher: str(student)}, [], curve, [], val_seeds, [], {},
                         time.perf_counter() - t0, unseen=points, unseen_counts=counts, unseen_updates=per)
    plot_unseen(result, out / "fig15.png")
    return {"bench": "unseen", "config": cfg.name, "settings": dataclasses.asdict(s),
            "types_per_phase": counts, "updates_per_phase": per, "planner_val_avg_jct": planner,
            "ideal": ideal, "unseen": points,
            "summary": summary(points, ideal, planner, counts, per), "plot": str(out / "fig15.png"),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/testbed-online.yaml")
    p.add_argument("--updates", type=int, default=15, help="updates in all (each phase a third)")
    p.add_argument("--teacher", default="drf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-every", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="SL: students trained at a time")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.updates < 1 or a.val_every < 1:
        p.error("--updates and --val-every: at least 1")
    return print_json(p, lambda: run(a.config, a.updates, a.teacher, a.seed, a.val_every, a.workers, a.out))


if __name__ == "__main__":
    raise SystemExit(main())
