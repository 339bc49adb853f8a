"""Where a shape student disagrees with its teacher: in the teacher's states (what SL trained on) and in the
states the student reaches itself (what DAgger adds; docs/notebook/2026-11-28.md, "The Philly student's
own states").

Two runs of the true simulator on the same trace and noise seed, the first ``--slots`` slots each: one driven
by the teacher, one by the student (greedy). In every slot the teacher labels each job with the menu row
nearest its allocation (as SL labels it) and the student decides; each job decision counts as

- agreement: the student's chosen row is the label;
- ``label did not fit``: the label was not allowed at the student's turn (the jobs it ran first took the
  room: a different order or different sizes before this job);
- ``teacher waits, student may not``: the teacher left the job out while a row of it still fitted, which
  the decoder's work conservation forbids;
- ``wait / run`` and ``workers …, PS …``: the label fitted and the student chose otherwise.

    .venv/bin/python tests/bench/bench_own_states.py --config configs/testbed-philly.yaml \\
        --model models/dl2-philly.pt --seed 2000001 --slots 2500 --trace philly32/val-0e4a51-0-200.parquet

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Literal

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.learn.shape.sl import teacher_sample
from dl2ray.policy.shape import WAIT, job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.schedulers.base import make_scheduler
from dl2ray.workload import Trace
from dl2ray.world import build_simulator


def _kind(enc, label: int, chosen: int) -> str:
    if label == WAIT:
        return "teacher waits, student runs"
    if chosen == WAIT:
        return "student waits, teacher runs"
    (tw, tp), (sw, sp) = enc.shapes[label], enc.shapes[chosen]

    def cmp(a: int, b: int) -> str:
        return "more" if a > b else "fewer" if a < b else "same"

    return f"workers {cmp(sw, tw)}, PS {cmp(sp, tp)}"


def disagreements(cfg: ExperimentConfig, model: str, teacher: str, seed: int, slots: int,
                  driver: Literal["teacher", "student"], trace: Trace | None = None) -> dict:
    """One run of ``slots`` slots driven by ``driver``: job decisions, agreement and the disagreements by
    kind (module docstring)."""
    sim = build_simulator(cfg, trace)
    lead, student = make_scheduler(teacher, cfg), make_scheduler(f"dl2:{model}", cfg)
    for s in (lead, student):
        if hasattr(s, "reset"):
            s.reset(seed)
    enc = student.enc
    kinds: Counter[str] = Counter()
    decisions = agree = 0
    view = sim.reset(seed)
    while not sim.done and sim.slot < slots:
        label = lead.decide(view)
        if not view.jobs:
            view = sim.step(label).view
            continue
        x, g = job_features(view, enc)
        mine = decide_shapes(view, enc, student.policy.logits(x, g))
        labels = teacher_sample(view, enc, label).actions
        for j, (a, b) in enumerate(zip(labels.tolist(), mine.actions.tolist(), strict=True)):
            decisions += 1
            if a == b:
                agree += 1
            elif a == WAIT and not mine.masks[j, a]:
                kinds["teacher waits, student may not (work conservation)"] += 1
            elif not mine.masks[j, a]:
                kinds["label did not fit"] += 1
            else:
                kinds[_kind(enc, a, b)] += 1
        view = sim.step(label if driver == "teacher" else mine.allocation).view
    return {"driver": driver, "slots": sim.slot, "decisions": decisions,
            "agreement": round(agree / decisions, 4) if decisions else None,
            "disagreements": dict(kinds.most_common())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", required=True, help="a shape checkpoint")
    ap.add_argument("--teacher", default="planner")
    ap.add_argument("--seed", type=int, default=2000000, help="noise (and trace) seed")
    ap.add_argument("--slots", type=int, default=2500, help="slots per run")
    ap.add_argument("--trace", default=None, help="a fixed Parquet trace instead of the generated one")
    a = ap.parse_args()
    cfg = load_config(a.config)
    trace = None
    if a.trace:
        from dl2ray.traces.parquet import read_trace

        trace = read_trace(a.trace, cfg.catalogue)
    runs = [disagreements(cfg, a.model, a.teacher, a.seed, a.slots, d, trace) for d in ("teacher", "student")]
    print(json.dumps({"config": a.config, "model": a.model, "teacher": a.teacher, "seed": a.seed,
                      "trace": a.trace, "runs": runs}))


if __name__ == "__main__":
    main()
