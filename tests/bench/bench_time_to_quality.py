"""Fig. 18 alone (time to quality, :mod:`dl2ray.studies.scaling`), without the rest of ``experiment paper``.

The teacher's SL student (``OUT/sl-TEACHER.pt``, kept if there), the levels on the validation traces (0.90×
the student, Optimus, 1.10× the planner), then for every seed, each run alone on this machine: A3C with 1
and each of ``--agents`` agents, a member alone and a federation of ``--federation`` members, all learning
online from the student. Every run is resumed or read back from OUT. ``--member-weight W``: a federation of
more than one member applies each push × W (the shape policy's outer step ``θ ← θ − W·g``; a member
alone keeps 1). ``--share-baseline``: A3C runs of two or more agents and federations of two or more members
keep the online learner's value baseline in the master (``train rl --share-baseline``); one agent and a
member alone learn as they always do. ``--defer-validation``: every A3C run (one agent too) validates its
snapshots after its last update (``train rl --defer-validation``), so the validator never takes CPU
from the agents and the minutes count learning alone. Prints one JSON object: the levels,
the A3C rows (minutes, updates per agent, ratio to one agent) and the federation rows (own slots per
member, minutes, ratio to a member alone), and every run's validations.

    .venv/bin/python tests/bench/bench_time_to_quality.py --config configs/testbed-online.yaml \
        --updates 30 --seeds 3 --val-every 2 --out runs/fig18
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path

from json_out import print_json

from clusters.cli.a3c import train_multi_agent
from clusters.federation.quality import federated_rl
from clusters.runtime import ray_session
from dl2ray import seeds as seedsets
from dl2ray.config import load_config
from dl2ray.learn.validation import heuristic_jct, validate
from dl2ray.policy.shape_net import load_policy_net
from dl2ray.studies.paper import PaperSettings, train_student
from dl2ray.studies.scaling import a3c_runs, a3c_to_quality, federation_runs, federation_to_quality, levels


def _federated(cfg, init, members, pushes, seed, options, out, weight: float = 1.0, share: bool = False):
    """:func:`federated_rl` with ``weight`` on every push and the shared baseline (``share``) for a
    federation of two or more members."""
    if members < 2:
        return federated_rl(cfg, init, members, pushes, seed, options, out)
    options = dataclasses.replace(options, share_baseline=share)
    return federated_rl(cfg, init, members, pushes, seed, options, out, weight=weight)


def _multi(cfg, init, updates, seed, out, options, agents, *rest, share: bool = False, defer: bool = False):
    """:func:`train_multi_agent` with the shared baseline (``share``) for two or more agents, and the
    validations after the last update (``defer``) for any number."""
    options = dataclasses.replace(options, share_baseline=share and agents > 1, defer_validation=defer)
    return train_multi_agent(cfg, init, updates, seed, out, options, agents, *rest)


def run(config: str, updates: int, seeds: int, teacher: str, agents: list[int], federation: int,
        val_every: int, val_traces: int, out: Path, member_weight: float = 1.0,
        share_baseline: bool = False, defer_validation: bool = False, first_seed: int = 0) -> dict:
    cfg = load_config(config)
    s = PaperSettings(updates=updates, seeds=tuple(range(first_seed, first_seed + seeds)),
                      teachers=(teacher,), val_every=val_every, val_traces=val_traces, agents=tuple(agents),
                      federation=federation, unseen_phases=0, share_baseline=share_baseline)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    student = out / f"sl-{teacher}.pt"
    if not student.exists():
        # SL seed 0 whatever --first-seed is: every seed's runs start from the same student
        train_student(cfg, dataclasses.replace(s, seeds=(0,)), teacher, out, student)
    val = seedsets.validation(val_traces)
    lv = levels(validate(cfg, load_policy_net(student, cfg), val), heuristic_jct(cfg, "optimus", val),
                heuristic_jct(cfg, "planner", val))
    stages = {"student and levels": time.perf_counter() - t0}
    with ray_session(max((*agents, 2))):
        clock = time.perf_counter()
        multi = functools.partial(_multi, share=share_baseline, defer=defer_validation)
        a3c = a3c_runs(cfg, student, s.options(), updates, s.seeds, sorted({1, *agents}), out,
                       multi) if agents else {}
        stages["A3C"] = time.perf_counter() - clock
        clock = time.perf_counter()
        federated = functools.partial(_federated, weight=member_weight, share=share_baseline)
        fed = federation_runs(cfg, student, s.options(), updates, s.seeds, sorted({1, federation}), out,
                              federated) if federation else {}
        stages["federation"] = time.perf_counter() - clock
    return {"bench": "time_to_quality", "config": cfg.name, "settings": dataclasses.asdict(s),
            "member_weight": member_weight, "share_baseline": share_baseline,
            "defer_validation": defer_validation,
            "validation_seeds": val, "levels": lv,
            "a3c": a3c_to_quality(a3c, lv, seeds), "federation": federation_to_quality(fed, lv, seeds),
            "a3c_validations": {f"{n}@{seed}": pts for (n, seed), pts in a3c.items()},
            "federation_validations": {f"{n}@{seed}": m for (n, seed), m in fed.items()},
            "stages_s": {k: round(v, 1) for k, v in stages.items()},
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/testbed-online.yaml")
    p.add_argument("--updates", type=int, default=30, help="updates per agent (pushes per member)")
    p.add_argument("--seeds", type=int, default=3, help="training seeds FIRST..FIRST+N-1")
    p.add_argument("--first-seed", type=int, default=0, help="the first training seed (FIRST)")
    p.add_argument("--teacher", default="drf")
    p.add_argument("--agents", default="2", help="A3C agent counts beside one agent, comma-separated")
    p.add_argument("--federation", type=int, default=2, help="members beside a member alone (0: none)")
    p.add_argument("--val-every", type=int, default=2)
    p.add_argument("--val-traces", type=int, default=5)
    p.add_argument("--member-weight", type=float, default=1.0,
                   help="a federation's pushes × this (a member alone: 1)")
    p.add_argument("--share-baseline", action="store_true",
                   help="two or more agents / members: the master keeps the value baseline")
    p.add_argument("--defer-validation", action="store_true",
                   help="A3C runs validate their snapshots after the last update (off the agents' cores)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    try:
        agents = [int(x) for x in a.agents.split(",") if x.strip()]
    except ValueError:
        p.error(f"--agents {a.agents!r}: comma-separated agent counts")
    if a.first_seed < 0:
        p.error(f"--first-seed {a.first_seed}: at least 0")
    if min((a.updates, a.seeds, a.val_every, a.val_traces)) < 1 or any(n < 2 for n in agents):
        p.error("--updates, --seeds, --val-every, --val-traces: at least 1; each --agents count at least 2")
    if a.federation == 1 or a.federation < 0:
        p.error("--federation: 0 (none) or at least 2")
    if not a.member_weight > 0:
        p.error("--member-weight: above 0")
    return print_json(p, lambda: run(a.config, a.updates, a.seeds, a.teacher, agents, a.federation,
                                     a.val_every, a.val_traces, a.out, a.member_weight,
                                     a.share_baseline, a.defer_validation, a.first_seed))


if __name__ == "__main__":
    raise SystemExit(main())
