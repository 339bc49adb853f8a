"""Fig. 18 of the DL2 paper, time to quality: how much sooner N clusters learning together reach a level.

Two ways to learn with more clusters, both from the same warm start (the first teacher's student), both
learning online (``policy.experience: cluster``), each run alone on the machine, one after the other:

- **A3C** (the ``clusters`` plugin's ``train rl --agents N`` trainer, :data:`MultiAgent`): for each agent
  count N (1 included: the same machinery with one agent is the single learner), N agents for
  ``N × updates`` global updates, so each agent gathers as much experience as one learner; it validates
  every ``N × val_every`` global updates (every ``val_every`` updates per agent). Its points:
  ``(global update, wall-clock seconds since the run started, validation avg JCT)`` from the run's
  TensorBoard events (:func:`validation_seconds`); experience per cluster = global update / N. With
  ``options.share_baseline`` (pg) the master keeps the value baseline of N ≥ 2 agents.
- **Federation** (the plugin's :data:`Federated`, :mod:`clusters.federation.quality`): N members of the
  same cluster config (1 included: a member alone), each with its ``traces // N`` training traces, until
  the learner has applied ``N × updates`` pushes; each member validates the global weights every
  ``val_every`` of its own pushes. Its points per member: ``(own pushes, own slots of experience,
  seconds, validation avg JCT)``.

The levels (:func:`levels`) are validation JCTs on the same validation traces: 0.90× the student, Optimus's,
1.10× the planner's. Time to a level is the first validation at or below it (a run that never gets there
counts as missing); ratios are taken per seed against the N = 1 run of the same kind and seed. The paper:
with N clusters the policy converges almost N times faster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import RLOptions, RLResult

MultiAgent = Callable[..., tuple[RLResult, dict]]
"""``train rl --agents N``'s trainer (:class:`dl2ray.cli.train.MultiAgentRL`: cfg, init, updates, seed,
out, options, agents, logdir, resume, on_progress), registered by the ``clusters`` plugin."""

Federated = Callable[..., list[list[tuple[int, int, float, float]]]]
"""The federation runner (:func:`clusters.federation.quality.federated_rl`: cfg, init, members, pushes per
member, seed, options, out) -> per member ``(own pushes, own slots, seconds, validation avg JCT)``."""

A3CPoints = dict[tuple[int, int], list[tuple[int, float, float]]]
"""``(agents, seed) -> [(global update, seconds since the start, validation avg JCT)]``."""

FedPoints = dict[tuple[int, int], list[list[tuple[int, int, float, float]]]]
"""``(members, seed) -> per member [(own pushes, own slots, seconds since it started, validation JCT)]``."""


def levels(student: float, optimus: float, planner: float) -> dict[str, float]:
    """The validation JCT levels: 0.90× the student, Optimus's, 1.10× the planner's (slots)."""
    return {"0.90× student": 0.9 * student, "Optimus": optimus, "1.10× planner": 1.1 * planner}


def validation_seconds(tb: Path) -> list[tuple[int, float, float]]:
    """``(update, seconds since the run's first event, validation avg JCT)`` from a run's TensorBoard
    events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if "rl/val_avg_jct" not in tags:
        return []
    start = min(e.wall_time for tag in tags for e in acc.Scalars(tag))
    return [(e.step, e.wall_time - start, e.value) for e in acc.Scalars("rl/val_avg_jct")]


def a3c_runs(cfg: ExperimentConfig, init: Path, options: RLOptions, updates: int, seeds: Sequence[int],
             agents: Sequence[int], out: Path, multi: MultiAgent) -> A3CPoints:
    """The A3C runs (module docstring): ``OUT/a3cN@SEED.pt`` (and ``.tb``) per agent count and seed, each
    resumed if there, and read back without starting its agents if its run record says it is done; their
    points."""
    points: A3CPoints = {}
    for seed in seeds:
        for n in agents:
            # A3C learns on each agent's fresh experience (no replay); it validates every val_every updates
            # per agent, as the one-agent run does; one agent has no baseline to share
            opts = replace(options, replay=False, val_every=options.val_every * n,
                           share_baseline=options.share_baseline and n > 1)
            path = out / f"a3c{n}@{seed}.pt"
            if not _done(path, updates * n):
                multi(cfg, init, updates * n, seed, path, opts, n, path.with_suffix(".tb"), True,
                      lambda updates, val: None)
            points[(n, seed)] = validation_seconds(path.with_suffix(".tb"))
    return points


def _done(checkpoint: Path, updates: int) -> bool:
    """Whether the run of ``checkpoint`` has written its record (``.json`` beside it) with ``updates`` or
    more updates applied; a record that cannot be read counts as not done (the trainer's resume decides)."""
    try:
        return int(json.loads(checkpoint.with_suffix(".json").read_text()).get("updates", 0)) >= updates
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def federation_runs(cfg: ExperimentConfig, init: Path, options: RLOptions, updates: int, seeds: Sequence[int],
                    sizes: Sequence[int], out: Path, federated: Federated) -> FedPoints:
    """The federation runs (module docstring): ``OUT/fedN@SEED.json`` (the members' validations) per size
    and seed; one already there is read back (a resumed run)."""
    points: FedPoints = {}
    for seed in seeds:
        for n in sizes:
            path = out / f"fed{n}@{seed}.json"
            if not path.exists():
                opts = replace(options, traces=max(options.traces // n, 1))
                members = federated(cfg, init, n, updates, seed, opts, path.with_suffix(""))
                path.write_text(json.dumps({"members": members}))
            doc = json.loads(path.read_text())
            points[(n, seed)] = [[tuple(v) for v in m] for m in doc["members"]]  # type: ignore[misc]
    return points


def spread(values: Sequence[float]) -> dict:
    """``{"n", "mean", "std" (ddof 1; 0 for one value), "values"}``."""
    arr = np.asarray(values, dtype=np.float64)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return {"n": len(values), "mean": float(arr.mean()), "std": std, "values": [float(v) for v in arr]}


def _rows(first_at: dict[tuple[int, int], tuple[float, float] | None], size: str, ratio: str,
          columns: tuple[str, str], base: dict) -> list[dict]:
    """One row per run size: over seeds, the spread of each of the two measures at the first validation at
    or below the level (``first_at[(size, seed)]``: None where it never got there), and the first measure's
    ratio, per seed, to the size-1 run's (``ratio``)."""
    rows = []
    for n in sorted({n for n, _ in first_at}):
        got = {seed: v for (m, seed), v in first_at.items() if m == n and v is not None}
        ratios = [got[seed][0] / one[0] for seed in got
                  if (one := first_at.get((1, seed))) is not None and one[0] > 0]
        measures = {c: spread([v[k] for v in got.values()]) if got else None for k, c in enumerate(columns)}
        rows.append({**base, size: n, "reached": len(got), **measures,
                     ratio: spread(ratios) if ratios else None})
    return rows


def a3c_to_quality(points: A3CPoints, lv: dict[str, float], seeds: int) -> list[dict]:
    """Per level and agent count, over seeds: the minutes and the updates per agent at the first
    validation at or below the level, and the minutes' ratio to the one-agent run's on the same seed
    (``vs_one``)."""
    rows = []
    for name, level in lv.items():
        first_at: dict[tuple[int, int], tuple[float, float] | None] = {}
        for (n, seed), pts in points.items():
            hit = next(((u, sec) for u, sec, j in sorted(pts) if j <= level), None)
            first_at[(n, seed)] = None if hit is None else (hit[1] / 60, hit[0] / n)
        rows += _rows(first_at, "agents", "vs_one", ("minutes", "updates_per_agent"),
                      {"threshold": name, "level": level, "seeds": seeds})
    return rows


def federation_to_quality(points: FedPoints, lv: dict[str, float], seeds: int) -> list[dict]:
    """Per level and federation size, over seeds: the slots of its own experience a member had at its first
    validation at or below the level (the mean over the members that got there), the minutes, and the
    slots' ratio to the lone member's on the same seed (``vs_alone``)."""
    rows = []
    for name, level in lv.items():
        first_at: dict[tuple[int, int], tuple[float, float] | None] = {}
        for (n, seed), members in points.items():
            hits = [next(((slots, sec) for _, slots, sec, j in sorted(m) if j <= level), None)
                    for m in members]
            there = [h for h in hits if h is not None]
            first_at[(n, seed)] = ((float(np.mean([h[0] for h in there])),
                                    float(np.mean([h[1] for h in there])) / 60) if there else None)
        rows += _rows(first_at, "members", "vs_alone", ("slots_per_member", "minutes"),
                      {"threshold": name, "level": level, "seeds": seeds})
    return rows
