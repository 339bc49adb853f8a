"""``dl2ray experiment ...``: the paper's learning experiments (composition root for them).

``paper`` (Fig. 10, Fig. 16 and Table 2 in one run, online), ``training-curve`` (Fig. 10),
``ablation`` (Table 2) and ``offline-rl`` (the OfflineRL baseline); the experiments themselves are
in :mod:`dl2ray.studies.learning` and :mod:`dl2ray.studies.paper`. Every bad option is one ``UserError`` line
naming it (exit 2), raised before any training starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.errors import UserError

app = typer.Typer(no_args_is_help=True, add_completion=False)
_err = Console(stderr=True)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")]
OutOpt = Annotated[Path, typer.Option(help="output directory (created; runs' checkpoints go inside)")]
UpdatesOpt = Annotated[int, typer.Option(help="RL updates per run (>= 1)")]
SeedOpt = Annotated[int, typer.Option(help="seed of every run (init, sampling, exploration, replay)")]
TracesOpt = Annotated[int, typer.Option(help="training traces, cycled")]
ValTracesOpt = Annotated[int, typer.Option(help="validation traces (model selection and curves)")]
ValEveryOpt = Annotated[int, typer.Option(help="updates between validations")]
TestTracesOpt = Annotated[int, typer.Option(help="test traces for the reported JCTs")]
WorkersOpt = Annotated[int, typer.Option(help="runs trained in parallel processes (1 torch thread each)")]
RLOptOpt = Annotated[list[str] | None, typer.Option(
    "--rl-opt", help="another RLOptions field for every run, KEY=VALUE (repeatable), e.g. critic_warmup=10")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]

_OWN_FLAGS = {"traces": "--traces", "val_traces": "--val-traces", "val_every": "--val-every"}


def _at_least(option: str, value: int, low: int = 1) -> None:
    if value < low:
        raise UserError(f"{option}: must be at least {low} (got {value})")


def rl_options(traces: int, val_traces: int, val_every: int, extra: list[str] | None,
               reserved: dict[str, str] | None = None):
    """RLOptions from the common flags and ``--rl-opt KEY=VALUE`` items (typed by RLOptions' fields)."""
    from pydantic import TypeAdapter, ValidationError

    from dl2ray.learn.records import RLOptions

    for opt, v in (("--traces", traces), ("--val-traces", val_traces), ("--val-every", val_every)):
        _at_least(opt, v)
    hints = typing.get_type_hints(RLOptions)
    taken = {**_OWN_FLAGS, **(reserved or {})}
    fields: dict[str, typing.Any] = {}
    for item in extra or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in hints:
            raise UserError(f"--rl-opt: {item!r}: expected KEY=VALUE, KEY one of {sorted(hints)}")
        if key in taken:
            raise UserError(f"--rl-opt: {key} is set by {taken[key]}")
        value = None if raw.strip().lower() in ("none", "null") else raw.strip()
        try:
            fields[key] = TypeAdapter(hints[key]).validate_python(value)
        except ValidationError as exc:
            raise UserError(f"--rl-opt: {item}: {exc.errors()[0]['msg']}") from None
    return RLOptions(traces=traces, val_traces=val_traces, val_every=val_every, **fields)


def _checkpoint(option: str, path: Path, cfg: ExperimentConfig) -> dict:
    """Fail fast on a missing or mismatched checkpoint; its ``extra`` record.

    Sets torch to one thread first: this process forks evaluation workers later
    (see :func:`dl2ray.studies.learning.mean_jct`), which is only safe if its
    torch never ran a multi-threaded OpenMP region.
    """
    import torch

    from dl2ray.policy.network import CheckpointError, read_checkpoint_doc
    from dl2ray.policy.shape_net import load_policy_net

    torch.set_num_threads(1)
    try:
        load_policy_net(path, cfg)  # of either architecture, checked against the config
        return dict(read_checkpoint_doc(path).get("extra", {}))
    except CheckpointError as exc:
        raise UserError(f"{option}: {exc}") from None


def _teacher(name: str) -> str:
    from dl2ray.schedulers.base import scheduler_names

    name = name.strip().lower()
    heuristics = [n for n in scheduler_names() if n != "dl2"]
    if name not in heuristics:
        raise UserError(f"--teacher: {name!r} is not a heuristic; choose from {heuristics}")
    return name


def _out_dir(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: {out}: cannot create the directory ({exc.strerror})") from None
    return out


def _finite(doc):
    """NaN (e.g. the JCT of a run in which no job finished) as JSON null."""
    if isinstance(doc, float) and math.isnan(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(v) for v in doc]
    return doc


def _write_json(doc: dict, path: Path, json_out: bool) -> None:
    text = json.dumps(_finite(doc))
    path.write_text(text + "\n", encoding="utf-8")
    if json_out:
        print(text)


class _Bars:
    """One progress bar per run (on stderr, only when it is a terminal)."""

    def __init__(self, updates: int) -> None:
        self.updates = updates
        self.tasks: dict[str, typing.Any] = {}
        self.progress = Progress("[progress.description]{task.description}", BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=_err, transient=True,
                                 disable=not _err.is_terminal)

    def __enter__(self) -> _Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, run: str, update: int) -> None:
        if run not in self.tasks:
            self.tasks[run] = self.progress.add_task(run, total=self.updates)
        self.progress.update(self.tasks[run], completed=update)


def _console() -> Console:
    """stdout; at least 120 columns when it is not a terminal, so a log keeps one row per line."""
    console = Console()
    return console if console.is_terminal else Console(width=120)


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3f}" if isinstance(x, float) else str(x)


@app.command("training-curve")
def training_curve(
    out: OutOpt,
    updates: UpdatesOpt,
    config: ConfigOpt = None,
    sl_init: Annotated[Path | None, typer.Option(
        help="SL checkpoint for sl-only and sl+rl; default: train one first (OUT/sl.pt)")] = None,
    teacher: Annotated[str | None, typer.Option(
        help="heuristic of the flat teacher line (and of SL when training it); default: the "
             "checkpoint's teacher, else policy.teacher")] = None,
    val_every: ValEveryOpt = 25,
    val_traces: ValTracesOpt = 3,
    traces: TracesOpt = 100,
    seed: SeedOpt = 0,
    workers: WorkersOpt = 2,
    offline: Annotated[bool, typer.Option(
        help="also OfflineRL: from the SL checkpoint on analytic speeds, validated on measured")] = False,
    rl_opt: RLOptOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Fig. 10: validation avg JCT per update of SL-only, RL-only, SL+RL (and OfflineRL) vs the teacher."""
    from dl2ray.studies import learning as ex

    cfg = load_config(config)
    _at_least("--updates", updates)
    _at_least("--workers", workers)
    opts = rl_options(traces, val_traces, val_every, rl_opt)
    if offline:
        ex.require_measured(cfg)
    recorded = _checkpoint("--sl-init", sl_init, cfg).get("teacher") if sl_init is not None else None
    name = _teacher(teacher or recorded or cfg.policy.teacher)
    out = _out_dir(out)
    if sl_init is None:
        sl_init = _train_sl(cfg, name, seed, out / "sl.pt")
    with _Bars(updates) as bars:
        curve = ex.training_curve(cfg, sl_init, name, updates, seed, opts, out, workers, offline, bars)
    csv_path = ex.write_curve_csv(curve, out / "training_curve.csv")
    png = _plot_curve(curve, cfg, out / "training_curve.png")
    summary = curve.summary()
    doc = {"config": cfg.name, "seed": seed, "updates": updates, "sl_init": str(sl_init), "teacher": name,
           "val_seeds": curve.val_seeds, "options": asdict(opts), "runs": summary,
           "csv": str(csv_path), "png": str(png)}
    _write_json(doc, out / "training_curve.json", json_out)
    if not json_out:
        table = Table(title=f"{cfg.name}: validation avg JCT (slots), {len(curve.val_seeds)} trace(s)")
        for col in ("run", "first", "best", "best update", "final", f"below {name} at"):
            table.add_column(col, justify="left" if col == "run" else "right")
        for run, s in summary.items():
            table.add_row(run, *(_fmt(s[k]) for k in ("first", "best", "best_update", "final",
                                                        "below_teacher_at")))
        _console().print(table)
        print(f"wrote {csv_path} and {png}")


def _train_sl(cfg: ExperimentConfig, teacher: str, seed: int, out: Path) -> Path:
    import torch

    from dl2ray.learn.sl import SLRun, run_sl

    p = cfg.policy
    torch.set_num_threads(1)
    with _err.status(f"training SL on {teacher}", spinner="dots") if _err.is_terminal else nullcontext():
        run_sl(cfg, SLRun(teacher, p.sl_traces, p.sl_val_traces, p.sl_epochs, seed, p.sl_max_slots),
               out, out.with_suffix(".tb"))
    return out


def _plot_curve(curve, cfg: ExperimentConfig, path: Path) -> Path:
    from dl2ray.evaluation.report import plot_training_curve
    from dl2ray.studies import learning as ex

    labels = {ex.SL_ONLY: "SL only", ex.RL_ONLY: "RL only (scratch)", ex.SL_RL: "SL + RL",
              ex.OFFLINE: "OfflineRL (analytic speeds)", ex.TEACHER: f"{curve.teacher.upper()} (teacher)"}
    return plot_training_curve(curve.rows, path, f"{cfg.name}: validation JCT during RL", labels,
                               flat=(ex.SL_ONLY, ex.TEACHER))


_REPORT_COLUMNS = ("run", "seed", "algo", "critic", "exploration", "replay", "zero_advantage", "train_speed",
                   "val_speed", "best_update",
                   "best_val_avg_jct", "test_avg_jct", "test_avg_jct_ci95", "test_completed", "test_jobs",
                   "slowdown", "checkpoint")


def _report(report, cfg: ExperimentConfig, init: Path, updates: int, seed: int, opts, out: Path, stem: str,
            title: str, json_out: bool, variants: list[dict] | None = None) -> None:
    from dl2ray.studies import learning as ex

    csv_path = ex.write_rows_csv(report.rows, out / f"{stem}.csv", _REPORT_COLUMNS)
    doc = {"config": cfg.name, "seed": seed, "updates": updates, "init": str(init),
           "options": asdict(opts), "reference": report.reference, "test_seeds": report.test_seeds,
           "drf_test_avg_jct": report.drf_avg_jct, "runs": report.rows, "csv": str(csv_path)}
    if variants is not None:
        doc["variants"] = variants
    _write_json(doc, out / f"{stem}.json", json_out)
    if json_out:
        return
    table = Table(title=f"{title} — {cfg.name}, {len(report.test_seeds)} test trace(s), {updates} updates")
    for col in ("run", "trained on", "best update", "val JCT", "test JCT (slots)", "done",
                f"/ {report.reference}"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in report.rows:
        table.add_row(r["run"], r.get("train_speed", "-"), str(r["best_update"]),
                      _fmt(r.get("best_val_avg_jct")),
                      f"{_fmt(r['test_avg_jct'])} ± {_fmt(r['test_avg_jct_ci95'])}",
                      f"{r['test_completed']:.1f}/{r['test_jobs']:.0f}", _fmt(r["slowdown"]))
    _console().print(table)
    if variants:
        per = Table(title="per variant over training seeds: test avg JCT (slots)")
        for col in ("variant", "runs", "mean", "std", "min", "max", "/ warm start"):
            per.add_column(col, justify="left" if col == "variant" else "right")
        for v in variants:
            per.add_row(v["variant"], str(v["runs"]), *(_fmt(v[k]) for k in ("mean", "std", "min", "max",
                                                                                "vs_warm_start")))
        _console().print(per)
    print(f"DRF on the same test traces: {_fmt(report.drf_avg_jct)}; wrote {csv_path}")


def _held_out_inputs(cfg: ExperimentConfig, init: Path, updates: int, test_traces: int, workers: int,
                     out: Path) -> Path:
    _at_least("--updates", updates)
    _at_least("--test-traces", test_traces)
    _at_least("--workers", workers)
    _checkpoint("--init", init, cfg)
    return _out_dir(out)


@app.command("ablation")
def ablation(
    init: Annotated[Path, typer.Option(help="the SL checkpoint every variant starts from")],
    out: OutOpt,
    updates: UpdatesOpt,
    config: ConfigOpt = None,
    seed: SeedOpt = 0,
    test_traces: TestTracesOpt = 10,
    val_every: ValEveryOpt = 25,
    val_traces: ValTracesOpt = 3,
    traces: TracesOpt = 100,
    workers: WorkersOpt = 2,
    seeds: Annotated[int, typer.Option(help="training seeds per variant: SEED .. SEED+N-1")] = 1,
    variants: Annotated[str | None, typer.Option(
        help="comma-separated subset of the variants (full always runs), e.g. zero-advantage")] = None,
    rl_opt: RLOptOpt = None,
    resume: Annotated[bool, typer.Option(
        help="continue the runs already in OUT (same seed, init and options); finished ones are read back")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Table 2 and the zero-advantage control: full method vs no actor-critic / exploration / replay /
    zero advantages, over training seeds, and the warm start; best checkpoints on test traces."""
    from dl2ray.studies import learning as ex

    cfg = load_config(config)
    _at_least("--seeds", seeds)
    switches = {k: "each ablation variant" for k in ("critic", "exploration", "replay", "zero_advantage")}
    opts = rl_options(traces, val_traces, val_every, rl_opt, switches)
    out = _held_out_inputs(cfg, init, updates, test_traces, workers, out)
    subset = None if variants is None else [v.strip() for v in variants.split(",") if v.strip()]
    with _Bars(updates) as bars:
        report = ex.ablation(cfg, init, updates, seed, opts, test_traces, out, workers, bars, seeds, subset,
                             resume)
    _report(report, cfg, init, updates, seed, opts, out, "ablation", "Ablation (Table 2)", json_out,
            variants=ex.by_variant(report))


@app.command("paper")
def paper(
    ctx: typer.Context,
    out: OutOpt,
    config: ConfigOpt = None,
    quick: Annotated[bool, typer.Option(
        help="smoke-sized: 1 update, 1 seed, DRF and FIFO, 1-2 traces per stage")] = False,
    updates: Annotated[int | None, typer.Option(help="RL updates per run (default 60; quick 1)")] = None,
    seeds: Annotated[int | None, typer.Option(help="training seeds 0..N-1 (default 3; quick 1)")] = None,
    test_traces: Annotated[int | None, typer.Option(help="test traces (default 10; quick 1)")] = None,
    workers: WorkersOpt = 2,
    agents: Annotated[str, typer.Option(
        help="Fig. 18: A3C agent counts beside one agent, comma-separated ('' for none)")] = "2",
    federation: Annotated[int, typer.Option(
        help="Fig. 18: federation members beside a member alone (0: no federation rows)")] = 2,
    share_baseline: Annotated[bool, typer.Option(
        "--share-baseline/--own-baseline",
        help="Fig. 18: A3C agents keep the value baseline in the master, as `train rl --agents N` does "
             "(--own-baseline: each agent its own, as docs/paper.md of 2026-12-03 ran)")] = True,
    teacher_config: Annotated[list[str] | None, typer.Option(
        help="Fig. 16: TEACHER=CONFIG: that teacher's runs learn with CONFIG's policy settings (the same "
             "cluster as --config; repeat)")] = None,
    teacher_updates: Annotated[list[str] | None, typer.Option(
        help="Fig. 16: TEACHER=N: that teacher's runs (its seeds and its control) take N updates instead "
             "of --updates (repeat)")] = None,
    json_out: JsonOpt = False,
) -> None:
    """The paper's learning experiments, online: Fig. 10 (SL only, RL only, SL+RL), Fig. 16 (DRF, FIFO and
    SRTF students, then online RL, over seeds), Table 2 (the learner's parts, beside the
    zero-advantage control), Fig. 15 (unseen job types) and Fig. 18 (time to quality: A3C agents, a
    federation's members); OUT/paper.md with
    the paper's numbers beside ours, plots, OUT/paper.json. A run left unfinished continues where it
    stopped when started again with the same OUT."""
    import shlex

    import torch

    from dl2ray.studies import paper as study
    from dl2ray.studies.paper_report import write_report

    cfg = load_config(config)
    _at_least("--workers", workers)
    s = study.PaperSettings.quick(workers) if quick else study.PaperSettings(workers=workers)
    for option, value in (("--updates", updates), ("--seeds", seeds), ("--test-traces", test_traces)):
        if value is not None:
            _at_least(option, value)
    try:
        counts = tuple(int(a) for a in agents.split(",") if a.strip())
    except ValueError:
        raise UserError(f"--agents: {agents!r}: comma-separated agent counts, e.g. 2 or 2,4") from None
    if any(n < 2 for n in counts):
        raise UserError(f"--agents: {agents!r}: each count at least 2 (the single learner is always run)")
    if federation < 0 or federation == 1:
        raise UserError(f"--federation {federation}: 0 (none) or at least 2 members (a member alone is "
                        "always run beside them)")
    multi = getattr(ctx.obj, "multi_agent_rl", None) if counts else None
    federated = getattr(ctx.obj, "federated_rl", None) if federation else None
    teacher_cfgs = _teacher_configs(cfg, s.teachers, teacher_config or [])
    s = dataclasses.replace(s, updates=updates or s.updates, test_traces=test_traces or s.test_traces,
                            seeds=tuple(range(seeds)) if seeds else s.seeds, agents=counts,
                            federation=federation, share_baseline=share_baseline,
                            teacher_configs=tuple((t, x.partition("=")[2]) for t, x in
                                                  zip(teacher_cfgs, teacher_config or [], strict=True)),
                            teacher_updates=_teacher_updates(s.teachers, teacher_updates or []))
    out = _out_dir(out)
    torch.set_num_threads(1)  # this process forks evaluation workers (see _checkpoint)
    with _Bars(s.updates) as bars:
        result = study.run_paper(cfg, s, out, bars, multi, federated, getattr(ctx.obj, "ray_session", None),
                                 teacher_cfgs)
    given = [("--config", config), ("--updates", updates), ("--seeds", seeds), ("--test-traces", test_traces),
             ("--agents", agents if agents != "2" else None),
             ("--federation", federation if federation != 2 else None),
             *(("--teacher-config", spec) for spec in teacher_config or []),
             *(("--teacher-updates", spec) for spec in teacher_updates or [])]
    command = shlex.join(["dl2ray", "experiment", "paper", "--out", str(out), *(["--quick"] if quick else []),
                          *([] if share_baseline else ["--own-baseline"]),
                          *(x for opt, v in given if v is not None for x in (opt, str(v))),
                          "--workers", str(workers)])
    report = write_report(result, out, command)
    _write_json({**study.document(result), "report": str(report)}, out / "paper.json", json_out)
    if not json_out:
        print(f"wrote {report} ({result.wall_s / 60:.1f} min)")


def _teacher_entries(option: str, teachers: tuple[str, ...], specs: list[str], form: str
                     ) -> list[tuple[str, str, str]]:
    """``OPTION TEACHER=VALUE`` entries, in order, as ``(teacher, value, spec)`` (UserError for an entry
    without ``=`` or a value, a teacher the run does not train, or one given twice); ``form`` is the
    message's ``TEACHER=…, e.g. …``."""
    out: list[tuple[str, str, str]] = []
    for spec in specs:
        teacher, sep, value = spec.partition("=")
        if not sep or not value:
            raise UserError(f"{option} {spec!r}: {form}")
        if teacher not in teachers:
            raise UserError(f"{option} {spec!r}: {teacher!r} is not a teacher of this run "
                            f"({', '.join(teachers)})")
        if teacher in (t for t, _, _ in out):
            raise UserError(f"{option} {spec!r}: {teacher} given twice")
        out.append((teacher, value, spec))
    return out


def _teacher_updates(teachers: tuple[str, ...], specs: list[str]) -> tuple[tuple[str, int], ...]:
    """``--teacher-updates TEACHER=N`` entries as ``((teacher, N), …)`` (:func:`_teacher_entries`'s
    errors, and one for N not a count ≥ 1)."""
    form = "TEACHER=N, e.g. fifo=120"
    out = []
    for teacher, count, spec in _teacher_entries("--teacher-updates", teachers, specs, form):
        if not count.strip().isdigit():
            raise UserError(f"--teacher-updates {spec!r}: {form}")
        if int(count) < 1:
            raise UserError(f"--teacher-updates {spec!r}: need at least 1 update")
        out.append((teacher, int(count)))
    return tuple(out)


def _teacher_configs(cfg: ExperimentConfig, teachers: tuple[str, ...], specs: list[str]) -> dict:
    """``--teacher-config TEACHER=CONFIG`` entries, in order, as ``{teacher: config}``
    (:func:`_teacher_entries`' errors, and one for a config of another cluster)."""
    from dl2ray.studies.paper import check_teacher_config

    form = "TEACHER=CONFIG, e.g. fifo=configs/testbed-online-explore.yaml"
    out: dict[str, ExperimentConfig] = {}
    for teacher, path, spec in _teacher_entries("--teacher-config", teachers, specs, form):
        other = load_config(path)
        check_teacher_config(cfg, other, f"--teacher-config {spec}")
        out[teacher] = other
    return out


@app.command("offline-rl")
def offline_rl(
    init: Annotated[Path, typer.Option(help="the SL checkpoint both runs start from")],
    out: OutOpt,
    updates: UpdatesOpt,
    config: ConfigOpt = None,
    seed: SeedOpt = 0,
    test_traces: TestTracesOpt = 10,
    val_every: ValEveryOpt = 25,
    val_traces: ValTracesOpt = 3,
    traces: TracesOpt = 100,
    workers: WorkersOpt = 2,
    rl_opt: RLOptOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """OfflineRL: RL trained on analytic speeds vs online RL on measured ones, both tested on measured."""
    from dl2ray.studies import learning as ex

    cfg = load_config(config)
    opts = rl_options(traces, val_traces, val_every, rl_opt)
    ex.require_measured(cfg)
    out = _held_out_inputs(cfg, init, updates, test_traces, workers, out)
    with _Bars(updates) as bars:
        report = ex.offline_rl(cfg, init, updates, seed, opts, test_traces, out, workers, bars)
    _report(report, cfg, init, updates, seed, opts, out, "offline_rl", "OfflineRL vs online RL", json_out)


@app.command("rllib")
def rllib(
    out: OutOpt,
    minutes: Annotated[float, typer.Option(help="wall time of training + validation (the build is extra)")],
    algo: Annotated[str, typer.Option(help="RLlib algorithm (new API stack): ppo, appo or impala")] = "ppo",
    config: ConfigOpt = None,
    seed: SeedOpt = 0,
    warm_start: Annotated[Path | None, typer.Option(
        help="start from this checkpoint, as `train rl --init` (paper: policy and value weights; shape: "
             "the shape network); its architecture, else the config's policy.arch, picks the module")] = None,
    iterations: Annotated[int | None, typer.Option(
        help="stop after this many iterations, even before --minutes")] = None,
    traces: TracesOpt = 100,
    val_traces: ValTracesOpt = 3,
    val_every: Annotated[int, typer.Option(help="iterations between validations")] = 2,
    reward: Annotated[str, typer.Option(
        help="the environment's reward for training: paper, jct or avg_jct")] = "avg_jct",
    max_slots: Annotated[int | None, typer.Option(
        help="cut training episodes off after this many slots (validation runs to sim.max_slots)")] = 400,
    algo_opt: Annotated[list[str] | None, typer.Option(
        "--algo-opt", help="algorithm option KEY=VALUE (repeatable, JSON values), e.g. lr=3e-4")] = None,
    max_jobs: Annotated[int | None, typer.Option(
        help="shape architecture: job rows the environment shows (later jobs wait; default policy.window)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """An RLlib algorithm on DL2Env (paper) or ShapeEnv (shape) with action masking: validated like
    `train rl`, best policy exported to OUT/policy.pt for `dl2ray compare --schedulers rllib:OUT`, every Ray
    process it started stopped."""
    from dl2ray.envs.dl2_env import REWARDS
    from dl2ray.learn.rllib.train import RLlibRun, algorithm_refusal

    cfg = load_config(config)
    algo = algo.strip().lower()
    refusal = algorithm_refusal(algo)
    if refusal is not None:
        raise UserError(f"--algo {refusal}")
    if not minutes > 0:
        raise UserError(f"--minutes: must be positive (got {minutes})")
    for opt, v in (("--traces", traces), ("--val-traces", val_traces), ("--val-every", val_every),
                   ("--iterations", iterations), ("--max-slots", max_slots), ("--max-jobs", max_jobs)):
        if v is not None:
            _at_least(opt, v)
    if reward not in REWARDS:
        raise UserError(f"--reward: {reward!r}: known: {', '.join(REWARDS)}")
    if warm_start is not None:
        _checkpoint("--warm-start", warm_start, cfg)
    run = RLlibRun(algo, minutes, iterations, seed, None if warm_start is None else str(warm_start.resolve()),
                   traces, val_traces, val_every, reward, max_slots, _algo_options(algo_opt), max_jobs)
    from dl2ray.learn.rllib.train import algorithm_config

    try:  # RLlib's own checks of the settings (no Ray needed), before Ray starts
        algorithm_config(cfg, run).validate()
    except (ValueError, TypeError) as exc:
        raise UserError(f"--algo-opt: {' '.join(str(exc).split())}") from None
    out = _out_dir(out)
    result, session = _run_rllib(cfg, run, out)
    best = result.best
    doc = {"out": str(out), "policy": str(out / "policy.pt"), "algo": algo, "arch": result.arch, "seed": seed,
           "init": run.init, "iterations": len(result.history), "build_seconds": result.build_seconds,
           "seconds": result.seconds, "initial_val_avg_jct": result.validation[0].avg_jct,
           "best_val_avg_jct": best.avg_jct if best else None,
           "best_iteration": best.iteration if best else None,
           "drf_val_avg_jct": result.drf_val_avg_jct, "ray_session_dir": session}
    _write_json(doc, out / "rllib.json", json_out)
    if not json_out:
        print(f"{algo}: {len(result.history)} iterations in {result.seconds:.0f} s; best validation avg JCT "
              f"{_fmt(doc['best_val_avg_jct'])} at iteration {doc['best_iteration']} (DRF "
              f"{_fmt(result.drf_val_avg_jct)}); wrote {out / 'policy.pt'} (rllib:{out})")


def _algo_options(items: list[str] | None) -> dict:
    """``--algo-opt KEY=VALUE`` items; VALUE parsed as JSON, else kept as a string."""
    opts: dict = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--algo-opt: {item!r}: expected KEY=VALUE")
        try:
            opts[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            opts[key.strip()] = raw
    return opts


def _run_rllib(cfg: ExperimentConfig, run, out: Path):
    """Train on a Ray instance of our own, and stop every process of it whatever happens.

    ``address="local"``: never attach to a running or stale cluster (plain
    ``ray.init()``, which RLlib calls when Ray is not up, would). Ray 2.60 starts a
    dashboard head even with ``include_dashboard=False`` (only its usage-stats
    module, no web UI); it is one of the processes ``ray.shutdown()`` stops. SIGTERM
    is turned into KeyboardInterrupt like Ctrl-C, so both reach the ``finally``.
    """
    import os
    import signal

    from dl2ray.learn.rllib.train import train_rllib

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # register the node on 127.0.0.1
    import ray

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        ctx = _start_ray(ray)
        session = ctx.address_info.get("session_dir")
        try:
            with _err.status(f"{run.algo} training", spinner="dots") if _err.is_terminal else nullcontext():
                result = train_rllib(cfg, run, out, _rllib_progress, {"ray_session_dir": session})
        except KeyboardInterrupt:
            _err.print(f"interrupted; the best policy so far is in {out}; stopping Ray", highlight=False)
            raise SystemExit(130) from None
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous)
    return result, session


def _start_ray(ray, attempts: int = 3):
    """``ray.init`` of a private local instance, tried again after a failed start: Ray 2.60 gives the
    raylet a fixed 30 s to register, which a machine at load average 12-15 on two cores exceeded."""
    for attempt in range(1, attempts + 1):
        try:
            return ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        except Exception as exc:
            ray.shutdown()  # stop what the failed start left running before trying again
            if attempt == attempts:
                raise UserError(f"Ray did not start in {attempts} tries ({exc})") from None
            _err.print(f"Ray did not start ({exc}); trying again", highlight=False)
    raise AssertionError("unreachable")


def _rllib_progress(row, val) -> None:
    if _err.is_terminal:
        jct = f", val JCT {val.avg_jct:.2f}" if val is not None else ""
        _err.print(f"iteration {row.iteration} ({row.seconds:.0f} s{jct})", highlight=False)
