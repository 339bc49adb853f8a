"""The DL2 paper's learning experiments in one run (``dl2ray experiment paper``): Fig. 10, 15, 16, 18, Tab. 2.

Every learner here learns **online**: ``policy.experience: cluster`` (the default), acting on its
cluster through act/observe/reward (:mod:`dl2ray.envs.cluster_env`), never in a model of it.

1. **Students** (Fig. 16's first bars): one supervised shape policy per teacher heuristic
   (``OUT/sl-TEACHER.pt``, :func:`dl2ray.learn.sl.run_sl`, ``arch="shape"``), trained in parallel.
2. **Runs**, all in one process pool (:func:`dl2ray.studies.learning.train_all`, resumable):
   ``rl-only`` (from scratch, the first seed: Fig. 10), ``TEACHER@SEED`` (online RL from each student,
   every seed: Fig. 16; the first teacher's first seed is also Fig. 10's ``sl+rl`` and Table 2's ``full``),
   ``TEACHER-zero@SEED0`` (each student's zero-advantage control: the same run with the policy-gradient
   signal removed) and one run per ablation the algorithm has (Table 2,
   :func:`~dl2ray.studies.learning.ablations_of`), from the first student, first seed.
3. **Validation** (model selection, Fig. 10's curves): each run's own validation traces
   (:func:`dl2ray.seeds.validation`); the flat lines (the first student, its teacher, Optimus, the
   planner) are measured on the same traces the same way (:func:`dl2ray.learn.validation.validate`).
   Wall-clock per validation comes from each run's TensorBoard events (runs share the machine's cores:
   with ``workers`` > 1 a run's seconds include its neighbours' contention).
4. **Test** (every reported ratio): each run's best *validated* checkpoint, the students, the teachers,
   Optimus and the planner on fresh test traces (:func:`dl2ray.seeds.test`), one
   :func:`dl2ray.evaluation.comparison.compare` (finished jobs' average JCT, slots).

5. **Fig. 18, time to quality** (:mod:`dl2ray.studies.scaling`, when the ``clusters`` plugin gives its
   trainers): from the first student, every seed, A3C with 1 and each count of ``agents`` agents (wall
   time and updates per agent to each level) and a federation of 1 and ``federation`` members (each
   member's own slots of experience to each level); levels: 0.90× the first student, Optimus's, 1.10×
   the planner's, on the validation traces.

6. **Fig. 15, unseen job types** (:mod:`dl2ray.studies.unseen`): the first teacher's student trained on the
   first half of the catalogue's types, then online RL in ``unseen_phases`` phases of ``updates // phases``
   updates, each phase's traces drawing from more of the catalogue, validated on every type; the ideal
   line is the first teacher's first-seed run (every type from the start).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.learn.records import RLOptions
from dl2ray.learn.validation import heuristic_jct, validate
from dl2ray.studies.learning import (
    ABLATIONS,
    Progress,
    RunPlan,
    RunRecord,
    ablations_of,
    mean_jct,
    train_all,
)
from dl2ray.studies.scaling import (
    A3CPoints,
    Federated,
    FedPoints,
    MultiAgent,
    a3c_runs,
    a3c_to_quality,
    federation_runs,
    federation_to_quality,
    levels,
    spread,
    validation_seconds,
)
from dl2ray.studies.unseen import curve as unseen_curve
from dl2ray.studies.unseen import phase_plans, run_phases, type_counts, types_config, with_options
from dl2ray.studies.unseen import summary as unseen_summary

#: The paper's figures for the experiments this command runs (§6.3–6.5), to put beside ours.
PAPER: dict[str, float] = {
    "vs_drf": 0.559,  # Fig. 9: DL2 improves average JCT by 44.1 % against DRF
    "vs_optimus": 0.825,  # ... and by 17.5 % against Optimus
    "srtf_speedup": 0.413,  # Fig. 16: "41.3 % speedup in the case of SRTF" (SL + RL against SRTF)
}
#: Table 2: the average JCT slowdown (%) without each training technique.
PAPER_TABLE2: dict[str, float] = {"no-actor-critic": 21.1, "no-exploration": 28.8, "no-replay": 39.6}
RL_ONLY = "rl-only"



@dataclass(frozen=True)
class PaperSettings:
    """How large a run is. :meth:`quick` is the smoke-sized one the slow tests run."""

    updates: int = 60
    seeds: tuple[int, ...] = (0, 1, 2)
    teachers: tuple[str, ...] = ("drf", "fifo", "srtf")
    algo: str = "pg"
    traces: int = 100
    val_traces: int = 5
    val_every: int = 5
    test_traces: int = 10
    sl_traces: int = 30
    sl_val_traces: int = 4
    sl_epochs: int = 40
    workers: int = 2
    agents: tuple[int, ...] = (2,)  # Fig. 18: A3C agent counts beside one agent
    # Fig. 18: A3C agents (N ≥ 2) keep pg's value baseline in the master, as `train rl --agents N` does by
    # default (the paper's shared critic); False: each agent its own (docs/paper.md of 2026-12-03 ran so)
    share_baseline: bool = True
    federation: int = 2  # Fig. 18: federation members beside a member alone (0: no federation row)
    unseen_phases: int = 3  # Fig. 15: phases of online RL, each knowing more types (0 skips it)
    # Fig. 16: (teacher, config file) whose runs learn with that config's learning settings (same cluster)
    teacher_configs: tuple[tuple[str, str], ...] = ()
    # Fig. 16: (teacher, updates) whose runs (its seeds and its control) take that many updates, not updates
    teacher_updates: tuple[tuple[str, int], ...] = ()

    @classmethod
    def quick(cls, workers: int = 2) -> PaperSettings:
        return cls(updates=1, seeds=(0,), teachers=("drf", "fifo"), traces=2, val_traces=1, val_every=1,
                   test_traces=1, sl_traces=2, sl_val_traces=1, sl_epochs=2, workers=workers)

    def updates_of(self, teacher: str) -> int:
        """The updates of ``teacher``'s runs: its ``teacher_updates`` entry, else ``updates``."""
        return dict(self.teacher_updates).get(teacher, self.updates)

    def options(self) -> RLOptions:
        return RLOptions(traces=self.traces, val_traces=self.val_traces, val_every=self.val_every,
                         checkpoint_every=max(self.updates, 1), algo=self.algo)  # type: ignore[arg-type]


@dataclass
class PaperResult:
    """What :func:`run_paper` measured (the report's inputs)."""

    config: str
    settings: PaperSettings
    students: dict[str, str]  # teacher -> SL checkpoint
    records: list[RunRecord]
    curve: list[tuple[int, str, float]]  # (update, run, validation avg JCT)
    wall: list[tuple[float, str, float]]  # (seconds since the run's start, run, validation avg JCT)
    val_seeds: list[int]
    test_seeds: list[int]
    test: dict[str, dict]  # scheduler spec -> compare's aggregate row
    wall_s: float
    stages_s: dict[str, float] = field(default_factory=dict)
    # Fig. 18: (agents, seed) -> [(global update, seconds since start, validation avg JCT)]
    learners: A3CPoints = field(default_factory=dict)
    # Fig. 15: (global update, types known, validation avg JCT); types known per phase; updates per phase
    unseen: list[tuple[int, int, float]] = field(default_factory=list)
    unseen_counts: tuple[int, ...] = ()
    unseen_updates: int = 0
    # Fig. 18: (members, seed) -> per member [(own pushes, own slots, seconds, validation avg JCT)]
    federation: FedPoints = field(default_factory=dict)

    def jct(self, spec: str) -> float:
        return float(self.test[spec]["avg_jct"])


def _student_path(out: Path, teacher: str) -> Path:
    return out / f"sl-{teacher}.pt"


def train_student(cfg: ExperimentConfig, s: PaperSettings, teacher: str, out: Path,
                   path: Path | None = None) -> str:
    import torch

    from dl2ray.learn.sl import SLRun, run_sl

    torch.set_num_threads(1)
    path = path or _student_path(out, teacher)
    run = SLRun(teacher, s.sl_traces, s.sl_val_traces, s.sl_epochs, s.seeds[0], cfg.policy.sl_max_slots,
                arch="shape")
    run_sl(cfg, run, path, path.with_suffix(".tb"))
    return str(path)


def train_students(cfg: ExperimentConfig, s: PaperSettings, out: Path) -> dict[str, str]:
    """One SL student per teacher (an existing ``OUT/sl-TEACHER.pt`` is kept: a resumed run)."""
    todo = [t for t in s.teachers if not _student_path(out, t).exists()]
    if s.workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(min(s.workers, len(todo)), mp_context=get_context("spawn")) as pool:
            list(pool.map(train_student, [cfg] * len(todo), [s] * len(todo), todo, [out] * len(todo)))
    else:
        for t in todo:
            train_student(cfg, s, t, out)
    return {t: str(_student_path(out, t)) for t in s.teachers}


LEARNING_ONLY = ("name", "policy", "base_dir")
"""What a teacher's config (``--teacher-config``) may change against the main one: how the policy learns."""


def check_teacher_config(cfg: ExperimentConfig, other: ExperimentConfig, where: str) -> None:
    """UserError naming the first field of ``other`` (from ``where``) outside :data:`LEARNING_ONLY` that
    differs from ``cfg``'s: a teacher's runs must learn on the cluster every other run is judged on."""
    mine, theirs = cfg.model_dump(mode="json"), other.model_dump(mode="json")
    for key in sorted(set(mine) | set(theirs)):
        if key not in LEARNING_ONLY and mine.get(key) != theirs.get(key):
            raise UserError(f"{where}: {key}: differs from --config's; a teacher's config may change only "
                            f"{', '.join(LEARNING_ONLY)}")
    if other.policy.shape.credit_discount != 1.0:
        raise UserError(f"{where}: policy.shape.credit_discount: {other.policy.shape.credit_discount}: the "
                        "paper's runs credit each job (--credit job), which has no discount")


def plans(cfg: ExperimentConfig, s: PaperSettings, students: dict[str, str], out: Path,
          teacher_cfgs: dict[str, ExperimentConfig] | None = None) -> list[RunPlan]:
    """Every RL run of the experiment (module docstring, 2.), resumable; a teacher in ``teacher_cfgs``
    learns (its seeds and its control) with that config."""
    opts, first, s0 = s.options(), s.teachers[0], s.seeds[0]
    runs = [RunPlan(RL_ONLY, cfg, None, opts, s.updates, s0, out / f"{RL_ONLY}.pt", resume=True)]
    for t in s.teachers:
        tc = (teacher_cfgs or {}).get(t, cfg)
        n = s.updates_of(t)
        runs += [RunPlan(f"{t}@{seed}", tc, Path(students[t]), opts, n, seed, out / f"{t}@{seed}.pt",
                         resume=True) for seed in s.seeds]
        runs.append(RunPlan(f"{t}-zero@{s0}", tc, Path(students[t]), replace(opts, zero_advantage=True),
                            n, s0, out / f"{t}-zero@{s0}.pt", resume=True))
    for name in ablations_of(s.algo):
        if name not in ("full", "zero-advantage"):
            runs.append(RunPlan(f"{name}@{s0}", cfg, Path(students[first]), replace(opts, **ABLATIONS[name]),
                                s.updates, s0, out / f"{name}@{s0}.pt", resume=True))
    return runs


def unseen_phases(cfg: ExperimentConfig, s: PaperSettings, out: Path, progress: Progress | None = None
                  ) -> tuple[list[tuple[int, int, float]], tuple[int, ...], int]:
    """Fig. 15 (module docstring, 6.): its curve, the types known per phase and the updates per phase;
    resumable."""
    counts = type_counts(len(cfg.catalogue.names), s.unseen_phases)
    first, per = s.teachers[0], max(1, s.updates // len(counts))
    student = out / f"sl-{first}-{counts[0]}types.pt"
    if not student.exists():
        train_student(types_config(cfg, counts[0]), s, first, out, student)
    plans = phase_plans(cfg, student, with_options(s.options(), per), per, s.seeds[0], out, counts)
    return unseen_curve(run_phases(plans, progress), counts, per), counts, per


def run_paper(cfg: ExperimentConfig, s: PaperSettings, out: Path, progress: Progress | None = None,
              multi: MultiAgent | None = None, federated: Federated | None = None,
              session: Callable[[int], AbstractContextManager[None]] | None = None,
              teacher_cfgs: dict[str, ExperimentConfig] | None = None) -> PaperResult:
    """Students, runs, flat lines and the test (module docstring); files under ``out``. ``multi``: the
    multi-agent trainer for Fig. 18's A3C rows, ``federated``: the runner of its federation rows (None:
    no such rows); ``session(cpus)``: held around both (one Ray instance for all of Fig. 18's runs);
    ``teacher_cfgs``: Fig. 16's teachers that learn with a config of their own (:func:`plans`)."""
    from dl2ray.policy.shape_net import load_policy_net

    out.mkdir(parents=True, exist_ok=True)
    clock, stages = time.perf_counter(), {}
    students = train_students(cfg, s, out)
    stages["students"] = time.perf_counter() - clock
    records = train_all(plans(cfg, s, students, out, teacher_cfgs), s.workers, progress)
    stages["runs"] = time.perf_counter() - clock - stages["students"]
    by_name = {r.name: r for r in records}
    first = s.teachers[0]
    val_seeds = seedsets.validation(s.val_traces)
    grid = sorted({v.update for r in records for v in r.validation})
    flats = {f"sl-{first}": validate(cfg, load_policy_net(Path(students[first]), cfg), val_seeds)}
    for name in dict.fromkeys([first, "optimus", "planner"]):
        flats[name] = heuristic_jct(cfg, name, val_seeds)
    curve = [(u, name, j) for name, j in flats.items() for u in grid]
    wall: list[tuple[float, str, float]] = []
    for name in (RL_ONLY, f"{first}@{s.seeds[0]}"):
        rec = by_name[name]
        curve += [(v.update, name, v.avg_jct) for v in rec.validation]
        wall += [(sec, name, j) for _, sec, j in validation_seconds(rec.out.with_suffix(".tb"))]
    learners: A3CPoints = {}
    federation: FedPoints = {}
    a3c = multi is not None and bool(s.agents)
    fed = federated is not None and s.federation > 0
    held = session(max((*s.agents, 2))) if session is not None and (a3c or fed) else nullcontext()
    with held:
        if a3c:
            assert multi is not None
            clock_a3c = time.perf_counter()
            shared = replace(s.options(), share_baseline=s.share_baseline and s.algo == "pg")
            learners = a3c_runs(cfg, Path(students[first]), shared, s.updates, s.seeds,
                                sorted({1, *s.agents}), out, multi)
            stages["Fig. 18 A3C"] = time.perf_counter() - clock_a3c
        if fed:
            assert federated is not None
            clock_fed = time.perf_counter()
            federation = federation_runs(cfg, Path(students[first]), s.options(), s.updates, s.seeds,
                                         sorted({1, s.federation}), out, federated)
            stages["Fig. 18 federation"] = time.perf_counter() - clock_fed
    unseen: list[tuple[int, int, float]] = []
    counts: tuple[int, ...] = ()
    per_phase = 0
    if s.unseen_phases:
        clock_unseen = time.perf_counter()
        unseen, counts, per_phase = unseen_phases(cfg, s, out, progress)
        stages["Fig. 15"] = time.perf_counter() - clock_unseen
    test_seeds = seedsets.test(s.test_traces)
    specs = [*dict.fromkeys([*s.teachers, "optimus", "planner"]),
             *(f"dl2:{p}" for p in students.values()), *(f"dl2:{r.best}" for r in records)]
    test = mean_jct(cfg, specs, test_seeds, processes=s.workers)
    stages["flat lines and test"] = time.perf_counter() - clock - sum(stages.values())
    return PaperResult(cfg.name, s, students, records, curve, wall, val_seeds, test_seeds, test,
                       time.perf_counter() - clock, stages, learners, unseen, counts, per_phase, federation)


# -- what the report shows --------------------------------------------------------------------------


def teachers_table(r: PaperResult) -> list[dict]:
    """Fig. 16: per teacher, its test JCT, its student's, online RL's over seeds and the control's."""
    by_name = {rec.name: rec for rec in r.records}
    rows = []
    for t in r.settings.teachers:
        teacher, student = r.jct(t), r.jct(f"dl2:{r.students[t]}")
        rl = [r.jct(f"dl2:{by_name[f'{t}@{s}'].best}") for s in r.settings.seeds]
        control = r.jct(f"dl2:{by_name[f'{t}-zero@{r.settings.seeds[0]}'].best}")
        ratios = [x / teacher for x in rl]
        rows.append({"teacher": t, "teacher_jct": teacher, "student_jct": student, "rl": spread(rl),
                     "rl_vs_teacher": spread(ratios), "rl_vs_student": spread([x / student for x in rl]),
                     "rl_vs_optimus": spread([x / r.jct("optimus") for x in rl]),
                     "rl_vs_planner": spread([x / r.jct("planner") for x in rl]),
                     "control_jct": control, "beats_control": all(x < control for x in rl)})
    return rows


def ablation_table(r: PaperResult) -> list[dict]:
    """Table 2: each variant's test JCT and its slowdown (%) against the full run (same seed, init)."""
    by_name = {rec.name: rec for rec in r.records}
    s0, first = r.settings.seeds[0], r.settings.teachers[0]
    full = r.jct(f"dl2:{by_name[f'{first}@{s0}'].best}")
    rows = [{"variant": "full", "test_jct": full, "slowdown_pct": 0.0, "paper_pct": 0.0}]
    names = [n for n in ablations_of(r.settings.algo) if n not in ("full", "zero-advantage")]
    for name in names:
        j = r.jct(f"dl2:{by_name[f'{name}@{s0}'].best}")
        rows.append({"variant": name, "test_jct": j, "slowdown_pct": 100.0 * (j / full - 1.0),
                     "paper_pct": PAPER_TABLE2.get(name)})
    control = r.jct(f"dl2:{by_name[f'{first}-zero@{s0}'].best}")
    rows.append({"variant": "zero-advantage", "test_jct": control,
                 "slowdown_pct": 100.0 * (control / full - 1.0), "paper_pct": None})
    for name in PAPER_TABLE2:
        if name not in names:  # the paper has it, this algorithm does not
            rows.append({"variant": name, "test_jct": math.nan, "slowdown_pct": math.nan,
                         "paper_pct": PAPER_TABLE2[name], "note": f"--algo {r.settings.algo} has none"})
    return rows


def thresholds(r: PaperResult) -> dict[str, float]:
    """Fig. 18's validation JCT levels (:func:`dl2ray.studies.scaling.levels`)."""
    level = {name: j for _, name, j in r.curve}
    return levels(level[f"sl-{r.settings.teachers[0]}"], level["optimus"], level["planner"])


def time_to_quality(r: PaperResult) -> list[dict]:
    """Fig. 18's A3C rows (:func:`dl2ray.studies.scaling.a3c_to_quality`)."""
    return a3c_to_quality(r.learners, thresholds(r), len(r.settings.seeds)) if r.learners else []


def federation_quality(r: PaperResult) -> list[dict]:
    """Fig. 18's federation rows (:func:`dl2ray.studies.scaling.federation_to_quality`)."""
    return federation_to_quality(r.federation, thresholds(r), len(r.settings.seeds)) if r.federation else []


def unseen_table(r: PaperResult) -> list[dict]:
    """Fig. 15: the unseen-types line against the ideal one (:func:`dl2ray.studies.unseen.summary`)."""
    if not r.unseen:
        return []
    ideal = [(u, j) for u, name, j in r.curve if name == f"{r.settings.teachers[0]}@{r.settings.seeds[0]}"]
    planner = next(j for _, name, j in r.curve if name == "planner")
    return unseen_summary(r.unseen, ideal, planner, r.unseen_counts, r.unseen_updates)


def curve_summary(r: PaperResult) -> dict[str, dict]:
    """Fig. 10: per line, its first, best (and update), final validation JCT and when it first went below
    the teacher."""
    teacher = r.settings.teachers[0]
    level = next(j for _, name, j in r.curve if name == teacher)
    doc = {}
    for name in dict.fromkeys(name for _, name, _ in r.curve):
        pts = sorted((u, j) for u, n, j in r.curve if n == name)
        best = min(pts, key=lambda p: p[1])
        doc[name] = {"first": pts[0][1], "best": best[1], "best_update": best[0], "final": pts[-1][1],
                     "below_teacher_at": next((u for u, j in pts if j < level), None)}
    return doc


def document(r: PaperResult) -> dict:
    """Everything measured, as JSON (``OUT/paper.json``)."""
    return {"config": r.config, "settings": asdict(r.settings), "wall_s": r.wall_s, "stages_s": r.stages_s,
            "students": r.students, "val_seeds": r.val_seeds, "test_seeds": r.test_seeds,
            "fig10": {"summary": curve_summary(r), "rows": r.curve, "wall": r.wall},
            "fig15": {"rows": r.unseen, "types_per_phase": list(r.unseen_counts),
                      "updates_per_phase": r.unseen_updates, "summary": unseen_table(r)},
            "fig16": teachers_table(r), "table2": ablation_table(r),
            "fig18": {"thresholds": thresholds(r) if r.learners or r.federation else {},
                      "rows": time_to_quality(r),
                      "validations": {f"{n}@{seed}": pts for (n, seed), pts in r.learners.items()},
                      "federation": federation_quality(r),
                      "federation_validations": {f"{n}@{seed}": m for (n, seed), m in r.federation.items()}},
            "test": {spec: {k: row[k] for k in ("avg_jct", "avg_jct_ci95", "completed", "jobs")}
                     for spec, row in r.test.items()},
            "runs": {rec.name: {"best": str(rec.best), "best_update": rec.best_row.update,
                                "best_val_avg_jct": rec.best_row.avg_jct} for rec in r.records},
            "paper": {**PAPER, "table2": PAPER_TABLE2}}
