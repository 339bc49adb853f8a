"""The DL2 paper's learning experiments: training curves (Fig. 10), ablations (Table 2), OfflineRL.

Every experiment is a set of RL runs (:class:`RunPlan`), each one call of
:func:`dl2ray.learn.train.train_rl` writing ``OUT.pt``, ``OUT.best.pt``,
``OUT.json`` and ``OUT.tb/`` under the experiment's folder. Runs are
independent, so :func:`train_all` gives them to a process pool (``spawn``
workers, one torch thread each); one worker runs them in this process.

- :func:`training_curve`: validation average JCT (slots) per update of RL from
  scratch (``rl-only``) and RL from the SL checkpoint (``sl+rl``), optionally
  OfflineRL, next to two flat lines: the SL checkpoint itself (``sl-only``)
  and its teacher heuristic (``teacher``), all on the same validation traces.
- :func:`ablation`: the full method and the three variants of Table 2 from one
  SL init, each run's best-validated checkpoint measured on *test* traces;
  slowdown = variant JCT / full-method JCT.
- :func:`offline_rl`: the same RL trained in a simulator whose speeds come from
  the analytic model (``speed.model: analytic``), validated and tested in the
  measured-speed simulator, next to online RL trained in the measured one.

Model selection uses validation seeds only; test seeds
(:func:`dl2ray.seeds.test`) are used for the reported numbers only, through
:func:`dl2ray.evaluation.comparison.compare` with ``dl2:<best checkpoint>`` schedulers.
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import queue as queue_mod
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.learn.records import RLOptions, ValidationRow, algorithm
from dl2ray.learn.train import train_rl
from dl2ray.learn.validation import heuristic_jct, validate
from dl2ray.policy.shape_net import load_policy_net

SL_ONLY, RL_ONLY, SL_RL, OFFLINE, TEACHER = "sl-only", "rl-only", "sl+rl", "offline-rl", "teacher"
ONLINE = "online-rl"

#: Table 2's variants: the RLOptions switches each one turns off (``full`` turns off none), and the
#: standing control: the same run with the policy-gradient signal removed (``zero-advantage``).
ABLATIONS: dict[str, dict[str, Any]] = {
    "full": {},
    "no-actor-critic": {"critic": False},
    "no-exploration": {"exploration": False},
    "no-replay": {"replay": False},
    "zero-advantage": {"zero_advantage": True},
}
WARM_START = "warm-start"

Progress = Callable[[str, int], None]  # (run name, updates done)


def with_speed_model(cfg: ExperimentConfig, model: str) -> ExperimentConfig:
    """``cfg`` with ``speed.model`` replaced (validated), e.g. ``"analytic"`` for OfflineRL."""
    raw = cfg.model_dump()
    raw["speed"] = {**raw["speed"], "model": model}
    return ExperimentConfig.model_validate(raw)


@dataclass(frozen=True)
class RunPlan:
    """One RL run: trained in ``cfg``'s simulator, validated in ``val_cfg``'s (default: the same)."""

    name: str
    cfg: ExperimentConfig
    init: Path | None
    opts: RLOptions
    updates: int
    seed: int
    out: Path  # the run's checkpoint; OUT.best.pt, OUT.json and OUT.tb/ go beside it
    val_cfg: ExperimentConfig | None = None
    resume: bool = False  # continue from OUT if it exists (a finished run is only read back)


@dataclass
class RunRecord:
    """What a finished run reports: its files, its simulators' speed models and its validation curve."""

    name: str
    out: Path
    best: Path
    train_speed: str  # speed.model of the training simulator
    val_speed: str  # speed.model of the validation simulator
    validation: list[ValidationRow]  # (update, greedy avg JCT in slots on the validation traces)
    baseline_avg_jct: float  # DRF's avg JCT (slots) on the same traces, validation simulator

    @property
    def best_row(self) -> ValidationRow:
        return min(self.validation, key=lambda r: r.avg_jct)


def train_one(plan: RunPlan, progress: Progress | None = None) -> RunRecord:
    """Run ``plan`` with one torch thread; ``progress(name, update)`` after every update."""
    import torch

    torch.set_num_threads(1)
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    resume = plan.resume and plan.out.exists()
    if resume:
        _check_same_run(plan)

    def on_update(row, _val) -> None:
        if progress is not None:
            progress(plan.name, row.update)

    _, res = train_rl(plan.cfg, plan.init, plan.updates, plan.seed, plan.out, plan.opts,
                      logdir=plan.out.with_suffix(".tb"), resume=resume, on_update=on_update,
                      val_cfg=plan.val_cfg)
    val_cfg = plan.val_cfg or plan.cfg
    return RunRecord(plan.name, plan.out, plan.out.with_suffix(".best.pt"), plan.cfg.speed.model,
                     val_cfg.speed.model, list(res.validation), res.baseline_avg_jct)


def _check_same_run(plan: RunPlan) -> None:
    """Refuse to resume ``plan.out`` when its ``OUT.json`` records another seed, init, options or config."""
    meta = plan.out.with_suffix(".json")
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"--resume: {meta}: cannot read the run's record ({e}); "
                        f"remove {plan.out} to start over") from None

    def where(init) -> str | None:
        return None if init is None else str(Path(init).resolve())

    # compared as the record holds them: JSON (tuples read back as lists)
    options = json.loads(json.dumps(asdict(plan.opts)))
    wanted = {"seed": plan.seed, "init": where(plan.init), "options": options,
              "config": plan.cfg.model_dump(mode="json")}
    recorded = {**doc, "init": where(doc.get("init"))}
    for key, value in wanted.items():
        if recorded.get(key) != value:
            shown = "another config" if key == "config" else f"{key}={recorded.get(key)!r}"
            raise UserError(f"--resume: {plan.out} was trained with {shown}, not this run's; "
                            "use another --out or remove it")


_worker_queue: list = []  # set in each pool worker by _init_worker: where progress goes


def _init_worker(q) -> None:
    _worker_queue.append(q)


def _train_in_worker(plan: RunPlan) -> RunRecord:
    q = _worker_queue[0] if _worker_queue else None
    return train_one(plan, None if q is None else lambda name, u: q.put((name, u)))


def train_all(plans: Sequence[RunPlan], workers: int, progress: Progress | None = None) -> list[RunRecord]:
    """Every plan, in order; in ``workers`` spawned processes when more than one (and more than one plan).

    ``spawn``, not ``fork``: a forked child of a process that has used torch's
    thread pool can hang in its first parallel region. A failed run, Ctrl-C or a
    SIGTERM stops the experiment and terminates the workers (a pool left alone
    would finish every queued run after its parent is gone).
    """
    if workers <= 1 or len(plans) <= 1:
        return [train_one(p, progress) for p in plans]
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        with ProcessPoolExecutor(min(workers, len(plans)), mp_context=ctx, initializer=_init_worker,
                                 initargs=(q,)) as pool:
            futures = [pool.submit(_train_in_worker, p) for p in plans]
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    _drain(q, progress)
                    for fut in done:
                        fut.result()  # a failed run stops the experiment now
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                for child in multiprocessing.active_children():  # the pool's workers
                    child.terminate()
                raise
            _drain(q, progress)
            return [f.result() for f in futures]
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _drain(q, progress: Progress | None) -> None:
    while True:
        try:
            name, update = q.get_nowait()
        except queue_mod.Empty:
            return
        if progress is not None:
            progress(name, update)


def mean_jct(cfg: ExperimentConfig, schedulers: Sequence[str], trace_seeds: Sequence[int],
              processes: int) -> dict[str, dict]:
    """Per scheduler spec: the aggregate row of :func:`dl2ray.evaluation.comparison.compare` (mean over
    traces).

    ``compare`` forks its workers; a fork of a process whose torch has run an
    OpenMP region with more than one thread hangs in the child's first one
    (libgomp), and the ``dl2:`` schedulers use torch to read their checkpoint.
    With one torch thread, torch never enters OpenMP, so the fork is safe.
    """
    import torch

    from dl2ray.evaluation.comparison import compare

    torch.set_num_threads(1)
    comp = compare(cfg, list(schedulers), list(trace_seeds), processes=processes)
    return {str(row["scheduler"]): row for row in comp.summary()}


# -- Fig. 10: training curves ----------------------------------------------------------------


@dataclass
class Curve:
    """Validation avg JCT (slots) per update: one row ``(update, run, avg_jct)`` per validation."""

    teacher: str
    val_seeds: list[int]
    rows: list[tuple[int, str, float]]
    records: list[RunRecord]

    def runs(self) -> list[str]:
        return list(dict.fromkeys(run for _, run, _ in self.rows))

    def summary(self) -> dict[str, dict]:
        """Per run: first, best (and its update), final JCT; first update strictly below the teacher."""
        teacher = next(j for _, run, j in self.rows if run == TEACHER)
        doc = {}
        for name in self.runs():
            pts = [(u, j) for u, run, j in self.rows if run == name]
            best = min(pts, key=lambda p: p[1])
            below = next((u for u, j in pts if j < teacher), None)
            doc[name] = {"first": pts[0][1], "best": best[1], "best_update": best[0], "final": pts[-1][1],
                         "below_teacher_at": None if name == TEACHER else below}
        return doc


def training_curve(
    cfg: ExperimentConfig, sl_init: Path, teacher: str, updates: int, seed: int, opts: RLOptions,
    out_dir: Path, workers: int = 2, offline: bool = False, progress: Progress | None = None,
) -> Curve:
    """Train ``rl-only`` (scratch) and ``sl+rl`` (from ``sl_init``) [and ``offline-rl``]; flat lines.

    The flat lines (``sl-only``: the greedy SL policy; ``teacher``: the heuristic)
    are measured once on the same validation traces, with the same JCT as the
    runs' validation (:func:`dl2ray.learn.validation.validate`: unfinished jobs counted
    until the run stopped), and repeated at every validated update so that every
    run has the same x values.
    """
    plans = [RunPlan(RL_ONLY, cfg, None, opts, updates, seed, out_dir / f"{RL_ONLY}.pt"),
             RunPlan(SL_RL, cfg, sl_init, opts, updates, seed, out_dir / f"{SL_RL}.pt")]
    if offline:
        require_measured(cfg)
        plans.append(RunPlan(OFFLINE, with_speed_model(cfg, "analytic"), sl_init, opts, updates, seed,
                             out_dir / f"{OFFLINE}.pt", val_cfg=cfg))
    records = train_all(plans, workers, progress)
    val_seeds = seedsets.validation(opts.val_traces)
    # measured exactly as the runs' validation is (rl.validate / rl.heuristic_jct), so one scale
    sl_policy = load_policy_net(sl_init, cfg)
    sl_jct, teacher_jct = validate(cfg, sl_policy, val_seeds), heuristic_jct(cfg, teacher, val_seeds)
    grid = sorted({v.update for r in records for v in r.validation})
    rows = [(u, SL_ONLY, sl_jct) for u in grid]
    rows += [(v.update, r.name, v.avg_jct) for r in records for v in r.validation]
    rows += [(u, TEACHER, teacher_jct) for u in grid]
    return Curve(teacher, val_seeds, rows, records)


def write_curve_csv(curve: Curve, path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["update", "run", "avg_jct"])
        w.writerows(curve.rows)
    return path


# -- Table 2 and OfflineRL: best checkpoints on test traces ---------------------------------------


@dataclass
class EvalReport:
    """Per run: its best validated checkpoint's avg JCT (slots) on the test traces, and the ratio
    to the reference run's (``slowdown``: 1.0 for the reference itself).

    The test JCT is :func:`dl2ray.evaluation.comparison.compare`'s ``avg_jct`` (finished jobs
    only, as ``dl2ray compare`` reports it); ``test_completed`` / ``test_jobs``
    (means per trace) show whether a policy left jobs unfinished.
    """

    reference: str
    test_seeds: list[int]
    drf_avg_jct: float  # DRF on the same test traces, for scale
    rows: list[dict]


def train_and_test(cfg: ExperimentConfig, plans: Sequence[RunPlan], reference: str, test_traces: int,
                   workers: int = 2, progress: Progress | None = None,
                   warm_start: Path | None = None, resume: bool = False) -> EvalReport:
    """Train every plan, pick each run's best validated checkpoint, measure all on test traces in ``cfg``.

    ``warm_start``: also measure this checkpoint as it is (row ``warm-start``, no training).
    ``resume``: runs whose checkpoint exists continue from it (finished ones are only read back).
    """
    records = train_all([replace(p, resume=resume) for p in plans], workers, progress)
    test_seeds = seedsets.test(test_traces)
    specs = {r.name: f"dl2:{r.best}" for r in records}
    if warm_start is not None:
        specs[WARM_START] = f"dl2:{warm_start}"
    jct = mean_jct(cfg, ["drf", *specs.values()], test_seeds, processes=workers)
    ref = float(jct[specs[reference]]["avg_jct"])
    rows = []
    for plan, rec in zip(plans, records, strict=True):
        row = jct[specs[rec.name]]
        rows.append({
            "run": rec.name, "seed": plan.seed, "algo": plan.opts.algo, "critic": plan.opts.critic,
            "exploration": plan.opts.exploration, "replay": plan.opts.replay,
            "zero_advantage": plan.opts.zero_advantage, "train_speed": rec.train_speed,
            "val_speed": rec.val_speed, "best_update": rec.best_row.update,
            "best_val_avg_jct": rec.best_row.avg_jct,
            "test_avg_jct": float(row["avg_jct"]), "test_avg_jct_ci95": float(row["avg_jct_ci95"]),
            "test_completed": float(row["completed"]), "test_jobs": float(row["jobs"]),
            "slowdown": float(row["avg_jct"]) / ref if ref else math.nan,
            "checkpoint": str(rec.best),
        })
    if warm_start is not None:
        row = jct[specs[WARM_START]]
        rows.append({"run": WARM_START, "best_update": 0, "test_avg_jct": float(row["avg_jct"]),
                     "test_avg_jct_ci95": float(row["avg_jct_ci95"]),
                     "test_completed": float(row["completed"]), "test_jobs": float(row["jobs"]),
                     "slowdown": float(row["avg_jct"]) / ref if ref else math.nan,
                     "checkpoint": str(warm_start)})
    return EvalReport(reference, test_seeds, float(jct["drf"]["avg_jct"]), rows)


def ablation(cfg: ExperimentConfig, init: Path, updates: int, seed: int, opts: RLOptions, test_traces: int,
             out_dir: Path, workers: int = 2, progress: Progress | None = None,
             seeds: int = 1, variants: Sequence[str] | None = None, resume: bool = False) -> EvalReport:
    """Table 2 plus the zero-advantage control: ``full`` and one variant per entry of :data:`ABLATIONS`
    the algorithm has (:func:`ablations_of`), same init and updates,
    training seeds
    ``seed .. seed+seeds-1``, and the warm start itself; runs are named ``VARIANT`` (one seed) or
    ``VARIANT@SEED``, the reference is ``full`` of the first seed. ``variants``: a subset (``full``
    is always run). ``resume``: continue (or read back) the runs already in ``out_dir``."""
    full = replace(opts, critic=True, exploration=True, replay=True, zero_advantage=False)
    names = ablations_of(opts.algo)
    if variants is not None:
        unknown = sorted(set(variants) - set(names))
        if unknown:
            raise UserError(f"--variants: unknown {unknown} for algo {opts.algo}; known: {list(names)}")
        names = tuple(n for n in names if n == "full" or n in variants)
    plans = [RunPlan(_seeded(name, s, seeds), cfg, init, replace(full, **ABLATIONS[name]), updates, s,
                     out_dir / f"{_seeded(name, s, seeds)}.pt")
             for s in range(seed, seed + seeds) for name in names]
    return train_and_test(cfg, plans, _seeded("full", seed, seeds), test_traces, workers, progress,
                          warm_start=init, resume=resume)


def ablations_of(algo: str) -> tuple[str, ...]:
    """The :data:`ABLATIONS` that mean something for ``algo``: ``full``, the control, and each variant
    whose switches the algorithm has (:attr:`~dl2ray.learn.records.Algorithm.switches`)."""
    has = set(algorithm(algo).switches)
    return tuple(name for name, off in ABLATIONS.items() if set(off) - {"zero_advantage"} <= has)


def _seeded(name: str, seed: int, seeds: int) -> str:
    return name if seeds == 1 else f"{name}@{seed}"


def by_variant(report: EvalReport) -> list[dict]:
    """Per variant (runs grouped by the name before ``@``): mean, standard deviation, min and max of
    the test average JCT over its training seeds, and the mean's ratio to the warm start's."""
    groups: dict[str, list[float]] = {}
    for row in report.rows:
        groups.setdefault(row["run"].split("@")[0], []).append(row["test_avg_jct"])
    warm = groups.get(WARM_START, [math.nan])[0]
    out = []
    for name, vals in groups.items():
        arr = np.asarray(vals, dtype=np.float64)
        out.append({"variant": name, "runs": len(vals), "mean": float(arr.mean()),
                    "std": float(arr.std(ddof=1)) if len(vals) > 1 else 0.0, "min": float(arr.min()),
                    "max": float(arr.max()), "vs_warm_start": float(arr.mean() / warm) if warm else math.nan})
    return out


def offline_rl(cfg: ExperimentConfig, init: Path, updates: int, seed: int, opts: RLOptions, test_traces: int,
               out_dir: Path, workers: int = 2, progress: Progress | None = None) -> EvalReport:
    """Online RL (measured speeds) vs OfflineRL (trained on analytic speeds); both validated and
    tested on the measured simulator (``cfg``, which must use ``speed.model: measured``).

    Both select their best checkpoint on measured-speed validation traces, which
    a truly offline learner could not do, so the reported gap is likely smaller
    than a strictly offline selection would give.
    """
    require_measured(cfg)
    plans = [RunPlan(ONLINE, cfg, init, opts, updates, seed, out_dir / f"{ONLINE}.pt"),
             RunPlan(OFFLINE, with_speed_model(cfg, "analytic"), init, opts, updates, seed,
                     out_dir / f"{OFFLINE}.pt", val_cfg=cfg)]
    return train_and_test(cfg, plans, ONLINE, test_traces, workers, progress)


def require_measured(cfg: ExperimentConfig) -> None:
    if cfg.speed.model != "measured":
        raise UserError(f"speed.model: OfflineRL is validated and tested on the measured-speed simulator; "
                        f"the config has {cfg.speed.model!r}")


def write_rows_csv(rows: Sequence[dict], path: Path, columns: Sequence[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path
