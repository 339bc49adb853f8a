"""Fig. 15 of the DL2 paper: job types the policy never saw start arriving during online RL.

The paper (§6.4, "Unseen job types") trains the network on the first four categories of models of its
Table 1 in supervised learning and the first 1,000 steps of online RL; at steps 1,000 and 2,000 jobs of
two new categories each start arriving. Its "ideal" line is the same training with every category from
the beginning; both are validated on the validation dataset (every category).

Here, with the config's catalogue in its order (``configs/jobtypes.yaml`` is the paper's Table 1 order)
and ``counts`` = :func:`type_counts` (4, 6, 8 types of an 8-type catalogue, as in the paper):

1. **Student**: the first teacher's SL student on traces of the first ``counts[0]`` types only
   (``workload.types``), ``OUT/sl-TEACHER-Ntypes.pt``.
2. **Phases**: online RL (the paper experiment's options) for ``updates`` updates per phase; phase *k*
   trains on traces of the first ``counts[k]`` types, starting from the *last* weights of phase *k − 1*
   (learning goes on; the best checkpoint is a selection, not the learner's state), and is validated on
   the validation traces of every type (``RunPlan.val_cfg``): the curve, against global updates
   ``k × updates + u``.
3. **Ideal**: the paper run's ``TEACHER@SEED0`` — SL and online RL with every type from the start, the
   same teacher, seed and number of updates in all.

The shape policy describes a job by the operator's profile (with ``policy.shape.profile_features``) or by
its type's column (without): a type it never saw is a job whose profile rows, or type column, no weight
was trained on. The planner, which plans with every type profiled, is the flat line.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import RLOptions
from dl2ray.studies.learning import Progress, RunPlan, RunRecord, train_all


def type_counts(types: int, phases: int = 3) -> tuple[int, ...]:
    """Types known in each of ``phases`` phases: half the catalogue (rounded up) first, then evenly more, all
    of it in the last (the paper: 4, 6, 8 of its 8 categories); phases that would add nothing are dropped."""
    if types < 1 or phases < 1:
        raise ValueError(f"{types} types, {phases} phases: both must be at least 1")
    if phases == 1:
        return (types,)
    first = math.ceil(types / 2)
    return tuple(dict.fromkeys(first + round((types - first) * k / (phases - 1)) for k in range(phases)))


def types_config(cfg: ExperimentConfig, n: int) -> ExperimentConfig:
    """``cfg`` whose generated traces draw only the first ``n`` types of its catalogue."""
    names = tuple(cfg.catalogue.names)
    if not 1 <= n <= len(names):
        raise ValueError(f"{n} types: the catalogue of {cfg.name} has {len(names)}")
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"types": names[:n]})})


def phase_plans(cfg: ExperimentConfig, student: Path, opts: RLOptions, updates: int, seed: int, out: Path,
                counts: tuple[int, ...]) -> list[RunPlan]:
    """One resumable RL run per phase (module docstring, 2.); phase *k*'s init is phase *k − 1*'s ``out``."""
    plans: list[RunPlan] = []
    init = student
    for n in counts:
        path = out / f"unseen-{n}types@{seed}.pt"
        plans.append(RunPlan(f"unseen-{n}types@{seed}", types_config(cfg, n), init, opts, updates, seed,
                             path, val_cfg=cfg, resume=True))
        init = path
    return plans


def run_phases(plans: list[RunPlan], progress: Progress | None = None) -> list[RunRecord]:
    """The phases in order (each starts from the one before it)."""
    return [train_all([p], 1, progress)[0] for p in plans]


def curve(records: list[RunRecord], counts: tuple[int, ...], updates: int) -> list[tuple[int, int, float]]:
    """``(global update, types known, validation avg JCT)``; a phase's update 0 (the weights the phase before
    it ended with) is kept only for the first phase."""
    rows = []
    for k, (rec, n) in enumerate(zip(records, counts, strict=True)):
        rows += [(k * updates + v.update, n, v.avg_jct) for v in rec.validation if k == 0 or v.update > 0]
    return rows


def summary(points: list[tuple[int, int, float]], ideal: list[tuple[int, float]], planner: float,
            counts: tuple[int, ...], updates: int) -> list[dict]:
    """Per phase start and at the end: the unseen-types line, the ideal line at the nearest validated update
    at or before it, their ratio and the unseen line over the planner's level."""
    marks = [(k * updates, f"now {counts[k]} types" if k else f"start ({counts[0]} types)")
             for k in range(len(counts))] + [(len(counts) * updates, "end")]
    rows = []
    for update, what in marks:
        mine = [j for u, _, j in points if u <= update]
        theirs = [j for u, j in sorted(ideal) if u <= update]
        if not mine or not theirs:
            continue
        rows.append({"update": update, "what": what, "unseen": mine[-1], "ideal": theirs[-1],
                     "unseen_vs_ideal": mine[-1] / theirs[-1], "unseen_vs_planner": mine[-1] / planner})
    return rows


def with_options(opts: RLOptions, updates: int) -> RLOptions:
    """A phase's options: checkpoints at its end only (what the next phase starts from)."""
    return replace(opts, checkpoint_every=max(updates, 1))
