"""``dl2ray train ...``: the learners' command line (composition root for training runs)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.report import emit

if TYPE_CHECKING:
    from dl2ray.config import ExperimentConfig
    from dl2ray.learn.records import Algorithm, RLOptions, RLResult, ValidationRow

app = typer.Typer(no_args_is_help=True, add_completion=False)
_err = Console(stderr=True)


@app.command("sl")
def train_sl(
    out: Annotated[Path, typer.Option(help="checkpoint to write (its .json run record goes beside it)")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    teacher: Annotated[str | None, typer.Option(help="heuristic to imitate (default policy.teacher)")] = None,
    traces: Annotated[int | None, typer.Option(min=1, help="training traces")] = None,
    val_traces: Annotated[int | None, typer.Option(min=1, help="validation traces")] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help="default: policy.sl_epochs")] = None,
    seed: Annotated[int, typer.Option(help="network init and shuffling seed")] = 0,
    logdir: Annotated[Path | None, typer.Option(help="TensorBoard logs (default: OUT.tb/)")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 1,
    train_trace: Annotated[list[Path] | None, typer.Option(
        help="record this Parquet trace instead of generated training traces (repeatable)")] = None,
    val_trace: Annotated[list[Path] | None, typer.Option(
        help="validate on this Parquet trace instead of generated ones (repeatable)")] = None,
    arch: Annotated[str | None, typer.Option(
        help="paper: the 3J+1 incremental steps; shape: one (workers, PS) menu row per job "
             "(default: policy.arch)")] = None,
    dagger: Annotated[int, typer.Option(
        min=0, help="shape: DAgger rounds after the first fit: the student runs the training traces, the "
        "teacher labels its slots, training goes on (epochs/2 each) on everything")] = 0,
    init: Annotated[Path | None, typer.Option(
        help="shape: start from this checkpoint instead of a fresh network; with --dagger the first fit is "
        "skipped (the init is the first round's student)")] = None,
    lr: Annotated[float | None, typer.Option(help="Adam learning rate (default: policy.sl_lr)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Supervised warm-start: imitate a heuristic's decisions with the policy of either architecture."""
    import torch

    from dl2ray.learn.sl import SLRun, run_sl
    from dl2ray.schedulers.base import make_scheduler, scheduler_names

    cfg = load_config(config)
    p = cfg.policy
    name = (teacher or p.teacher).strip().lower()
    if name.startswith("dl2") or name not in scheduler_names():
        raise UserError(f"--teacher: {name!r} is not a heuristic; choose from "
                        f"{[n for n in scheduler_names() if n != 'dl2']}")
    make_scheduler(name, cfg)
    if out.suffix != ".pt":
        raise UserError(f"--out: {out}: expected a .pt checkpoint path")
    check_trace_files(train_trace, val_trace)
    arch = arch or p.arch
    if arch not in ("paper", "shape"):
        raise UserError(f"--arch: {arch!r}: known: paper, shape")
    run = SLRun(name, len(train_trace) if train_trace else traces or p.sl_traces,
                len(val_trace) if val_trace else val_traces or p.sl_val_traces, epochs or p.sl_epochs,
                seed, p.sl_max_slots, tuple(str(f) for f in train_trace or ()),
                tuple(str(f) for f in val_trace or ()), arch, dagger, str(init) if init else None, lr)
    if dagger and arch != "shape":
        raise UserError("--dagger: only the shape architecture (--arch shape) has DAgger rounds")
    if lr is not None and not lr > 0:
        raise UserError(f"--lr: {lr}: must be positive")
    if init is not None:
        if arch != "shape":
            raise UserError("--init: only the shape architecture (--arch shape) continues from a checkpoint")
        if not init.is_file():
            raise UserError(f"--init: {init}: no such checkpoint")
        from dl2ray.policy.shape import ShapeEncoding
        from dl2ray.policy.shape_net import load_shape_checkpoint

        load_shape_checkpoint(init, ShapeEncoding.from_config(cfg))  # refuses another menu, catalogue, arch
    torch.set_num_threads(threads)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=_err, transient=True, disable=not _err.is_terminal,
    ) as bar:
        tasks = {
            "record": bar.add_task(f"recording {name}", total=run.traces + run.val_traces),
            "train": bar.add_task("training", total=run.epochs),
            "evaluate": bar.add_task("validation JCT", total=1),
        }
        _, _, result = run_sl(cfg, run, out, logdir or out.with_suffix(".tb"),
                              lambda stage, n: bar.advance(tasks[stage], n))
    doc = {"out": str(out), "teacher": name, "seed": seed, "samples": result.samples,
           "val_accuracy": result.val_accuracy, "policy_avg_jct": result.jct["policy_avg_jct"],
           "teacher_avg_jct": result.jct["teacher_avg_jct"], "jct_ratio": result.jct["ratio"]}
    emit(doc, json_out)


def check_trace_files(train_trace: list[Path] | None, val_trace: list[Path] | None) -> None:
    """UserError naming the option and the file for a ``--train-trace``/``--val-trace`` that is not a
    file."""
    for opt, files in (("--train-trace", train_trace), ("--val-trace", val_trace)):
        for f in files or []:
            if not f.is_file():
                raise UserError(f"{opt}: {f}: no such trace file")


def check_checkpoint_paths(out: Path, init: Path | None) -> None:
    """``--out`` must name a ``.pt`` file and ``--init``, if given, must exist (UserError otherwise)."""
    if out.suffix != ".pt":
        raise UserError(f"--out: {out}: expected a .pt checkpoint path")
    if init is not None and not init.is_file():
        raise UserError(f"--init: {init}: no such checkpoint")


class MultiAgentRL(Protocol):
    """What ``train rl --agents N`` (N ≥ 2) runs: a trainer a plugin registers (``clusters``: A3C on Ray).

    The contract of :func:`dl2ray.learn.train.train_rl` — ``updates`` in total,
    files ``OUT``, ``OUT.best.pt``, ``OUT.json`` and TensorBoard scalars in
    ``logdir``, ``resume`` from ``OUT`` — with ``agents`` learners;
    ``on_progress(updates_so_far, latest_validation)``. Returns the run's history
    and extra fields for the command's output. Options it cannot honour raise UserError.
    """

    def __call__(self, cfg: ExperimentConfig, init: Path | None, updates: int, seed: int, out: Path,
                 options: RLOptions, agents: int, logdir: Path, resume: bool,
                 on_progress: Callable[[int, ValidationRow | None], None]) -> tuple[RLResult, dict]: ...


def _multi_agent_trainer(ctx: typer.Context, agents: int) -> MultiAgentRL:
    """The plugin-registered trainer for ``--agents N`` (N ≥ 2), or a UserError saying what is missing."""
    plugins = ctx.obj
    trainer = getattr(plugins, "multi_agent_rl", None)
    if trainer is None:
        why = "; ".join(f"{k}: {v}" for k, v in getattr(plugins, "failed", {}).items())
        raise UserError(f"--agents {agents}: multi-agent training needs the `clusters` plugin (Ray A3C), "
                        f"which is not {'loadable (' + why + ')' if why else 'installed'}")
    return trainer


def _with_experience(cfg, experience: str | None):
    """``cfg`` with ``policy.experience`` set from ``--experience`` (unchanged without it)."""
    if experience is None:
        return cfg
    if experience not in ("cluster", "twin"):
        raise UserError(f"--experience: {experience!r}: known: cluster, twin")
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"experience": experience})})


def _check_shape_learning(cfg: ExperimentConfig, learner: Algorithm, credit: str, agents: int) -> None:
    """UserError for a ``policy.shape`` learning setting nothing in this run would read:
    ``credit_discount`` without a shape on-policy learner's ``--credit slot``, ``rollback`` outside a
    single-process shape learner."""
    s = cfg.policy.shape
    if s.credit_discount != 1.0 and not (credit == "slot" and learner.on_policy and learner.arch == "shape"):
        raise UserError(f"policy.shape.credit_discount: {s.credit_discount}: discounts the slot credit of "
                        f"--algo pg/mix only (here --algo {learner.name} --credit {credit})")
    if s.rollback is not None and (agents > 1 or learner.arch != "shape"):
        raise UserError(f"policy.shape.rollback: {s.rollback}: rolls back a single-process shape learner "
                        f"only (here --algo {learner.name}, --agents {agents})")


def _check_a3c_switches(algo: str, agents: int, share_baseline: bool | None, defer_validation: bool) -> None:
    """UserError for a switch of the A3C master used without A3C (or, the shared baseline, without pg)."""
    if share_baseline and (algo != "pg" or agents < 2):
        raise UserError(f"--share-baseline: the baseline of --algo pg shared by --agents N ≥ 2 "
                        f"(here --algo {algo} --agents {agents})")
    if defer_validation and agents < 2:
        raise UserError("--defer-validation: A3C (--agents N ≥ 2) only; one learner validates between its "
                        "updates")


def shared_baseline(share_baseline: bool | None, algo: str, agents: int, critic: bool) -> bool:
    """Whether the A3C master keeps the value baseline: as ``--share-baseline/--own-baseline`` says, and by
    default for ``--algo pg`` with ``--agents N ≥ 2`` and the critic (over six seeds of Fig. 18 the agents
    reached Optimus's level sooner with it on every seed: docs/notebook/2026-12-03.md)."""
    if share_baseline is not None:
        return share_baseline
    return algo == "pg" and agents >= 2 and critic


@app.command("rl")
def train_rl(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="checkpoint to write (OUT.best.pt, OUT.json, OUT.tb/ beside it)")],
    updates: Annotated[int, typer.Option(min=1, help="total updates (a resumed run counts its done ones)")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    init: Annotated[
        Path | None, typer.Option(help="start from this (SL) checkpoint; default: scratch")
    ] = None,
    seed: Annotated[int, typer.Option(help="init, sampling, exploration and replay seed")] = 0,
    critic: Annotated[bool, typer.Option("--critic/--no-critic",
                                         help="TD actor-critic, or REINFORCE with a mean baseline")] = True,
    exploration: Annotated[bool, typer.Option("--exploration/--no-exploration",
                                              help="job-aware exploration")] = True,
    replay: Annotated[bool | None, typer.Option("--replay/--no-replay",
                                                help="experience replay (default: on; A3C has none)")] = None,
    prioritized: Annotated[bool, typer.Option(help="prioritised replay (TD-error priorities)")] = False,
    traces: Annotated[int, typer.Option(min=1, help="training traces, cycled")] = 100,
    val_traces: Annotated[int, typer.Option(min=1, help="validation traces")] = 3,
    val_every: Annotated[int, typer.Option(min=1, help="updates between validations")] = 25,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="updates between checkpoints")] = 50,
    critic_warmup: Annotated[int, typer.Option(min=0, help="first updates training only the critic")] = 0,
    algo: Annotated[str, typer.Option(
        help="paper: TD actor-critic on slot rewards; improve: rollout policy improvement with per-step "
             "credit (policy.improve); counterfactual: per-job counterfactual policy optimisation of the "
             "shape policy (policy.shape); pg: on-policy per-job policy gradient of the shape policy with a "
             "learned value baseline (dl2ray.learn.shape.pg); mix: both in one update "
             "(dl2ray.learn.shape.mix)")] = "paper",
    credit: Annotated[str, typer.Option(
        help="pg, mix: a job choice's return: job (its own remaining JCT) or slot (every job's remaining "
             "JCT from that slot on)")] = "job",
    mix_weight: Annotated[float, typer.Option(
        help="mix: the on-policy surrogate's weight beside the counterfactual loss")] = 1.0,
    share_baseline: Annotated[bool | None, typer.Option(
        "--share-baseline/--own-baseline",
        help="pg with --agents N: the master keeps the value baseline and every agent fits it in turn, as "
             "the paper's A3C shares its critic (the default for pg with --agents N ≥ 2 and the critic; "
             "--own-baseline: each agent keeps its own)")] = None,
    defer_validation: Annotated[bool, typer.Option(
        help="with --agents N: validate the due weight snapshots after the last update, not beside the "
             "agents (where no core is spare the validator takes CPU from them); each point keeps the "
             "time its weights were taken")] = False,
    zero_advantage: Annotated[bool, typer.Option(
        help="the control run: advantages set to 0 (paper) / shuffled among the tried rows "
             "(counterfactual) / labels drawn without the outcomes (improve)")
    ] = False,
    twin: Annotated[str, typer.Option(
        help="counterfactual: where the tries are simulated: config (operator-world episodes of the "
             "config's workload) or observed (a twin fitted from episodes the learner's own cluster ran; "
             "dl2ray.learn.shape.twin)")] = "config",
    experience: Annotated[str | None, typer.Option(
        help="where the on-policy learners (paper, pg, mix's on-policy half) play: cluster (online, from "
             "the learner's own cluster through act/observe/reward; dl2ray.envs.cluster_env) or twin (in "
             "the model of it, policy.train_world); default: the config's policy.experience")] = None,
    train_trace: Annotated[list[Path] | None, typer.Option(
        help="online learners: replay this Parquet trace on the cluster instead of generated training "
             "traces (repeatable; stretch k: file k mod n with training seed k's noise)")] = None,
    val_trace: Annotated[list[Path] | None, typer.Option(
        help="validate on this Parquet trace instead of generated ones, with each of --val-traces "
             "validation seeds (repeatable)")] = None,
    resume: Annotated[bool, typer.Option(help="continue from OUT if it exists")] = False,
    logdir: Annotated[Path | None, typer.Option(help="TensorBoard logs (default: OUT.tb/)")] = None,
    agents: Annotated[int, typer.Option(help="learners: 1 = this process; N >= 2 = A3C with N Ray "
                                             "agents (the clusters plugin)")] = 1,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads (A3C actors use 1 each)")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Online actor-critic RL of the DL2 policy, from an SL checkpoint or scratch: single process, or
    asynchronous (A3C) with ``--agents N`` Ray agents on their own simulated clusters."""
    import torch

    from dl2ray.learn import records, train

    cfg = load_config(config)
    check_checkpoint_paths(out, init)
    if agents < 1:
        raise UserError(f"--agents: {agents}: need at least one learner")
    if algo not in records.ALGORITHMS:
        raise UserError(f"--algo: {algo!r}: known: {', '.join(records.ALGORITHMS)}")
    learner = records.ALGORITHMS[algo]
    if agents > 1 and not learner.a3c:
        a3c = " or ".join(a.name for a in records.ALGORITHMS.values() if a.a3c)
        raise UserError(f"--algo {algo}: single process only (A3C runs {a3c})")
    if twin not in ("config", "observed"):
        raise UserError(f"--twin: {twin!r}: known: config, observed")
    if twin != "config" and learner.arch != "shape":
        raise UserError(f"--twin {twin}: only --algo {', '.join(records.SHAPE_ALGOS)} learn in a twin")
    if credit not in ("job", "slot"):
        raise UserError(f"--credit: {credit!r}: known: job, slot")
    cfg = _with_experience(cfg, experience)
    _check_shape_learning(cfg, learner, credit, agents)
    if mix_weight < 0 or not math.isfinite(mix_weight):
        raise UserError(f"--mix-weight: {mix_weight}: need a finite weight ≥ 0")
    _check_a3c_switches(algo, agents, share_baseline, defer_validation)
    check_trace_files(train_trace, val_trace)
    if (train_trace or val_trace) and agents > 1:
        raise UserError(f"--train-trace/--val-trace: one learner only (here --agents {agents})")
    # a switch turned off that the algorithm does not have is refused (A3C's replay is off by default)
    records.check_switches(records.RLOptions(critic=critic, exploration=exploration,
                                             replay=True if replay is None else replay,
                                             algo=algo))  # type: ignore[arg-type]
    multi = _multi_agent_trainer(ctx, agents) if agents > 1 else None
    replay = multi is None if replay is None else replay  # default: on for one learner; A3C has none
    opts = records.RLOptions(critic=critic, exploration=exploration, replay=replay, prioritized=prioritized,
                        traces=traces, val_traces=val_traces, val_every=val_every,
                        checkpoint_every=checkpoint_every, critic_warmup=critic_warmup,
                        algo=algo, zero_advantage=zero_advantage, twin=twin,  # type: ignore[arg-type]
                        credit=credit, mix_weight=mix_weight,  # type: ignore[arg-type]
                        share_baseline=shared_baseline(share_baseline, algo, agents, critic),
                        defer_validation=defer_validation,
                        train_files=tuple(str(f) for f in train_trace or ()),
                        val_files=tuple(str(f) for f in val_trace or ()))
    logdir = logdir or out.with_suffix(".tb")
    torch.set_num_threads(threads)
    extra: dict = {}
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=_err, transient=True, disable=not _err.is_terminal,
    ) as bar:
        task = bar.add_task("RL updates", total=updates)

        def on_update(row, val) -> None:
            jct = f" val JCT {val.avg_jct:.2f}" if val is not None else ""
            bar.update(task, completed=row.update,
                       description=f"RL updates (loss {row.policy_loss:+.3f}, H {row.entropy:.2f}){jct}")

        def on_progress(done: int, val) -> None:
            jct = f", val JCT {val.avg_jct:.2f} at {val.update}" if val is not None else ""
            bar.update(task, completed=done, description=f"A3C updates ({agents} agents{jct})")

        if multi is None:
            _, result = train.train_rl(cfg, init, updates, seed, out, opts, logdir, resume, on_update)
        else:
            result, extra = multi(cfg, init, updates, seed, out, opts, agents, logdir, resume, on_progress)
    best = result.best
    doc = {"out": str(out), "best": str(out.with_suffix(".best.pt")), "seed": seed, "updates": result.updates,
           "init": result.init, "initial_val_avg_jct": result.validation[0].avg_jct,
           "final_val_avg_jct": result.validation[-1].avg_jct,
           "best_val_avg_jct": best.avg_jct if best else None, "best_update": best.update if best else None,
           "drf_val_avg_jct": result.baseline_avg_jct, **({"agents": agents, **extra} if multi else {})}
    emit(doc, json_out)


@app.command("ship")
def train_ship(
    run: Annotated[Path, typer.Option(
        help="the RL run's OUT.pt (OUT.best.pt, OUT.json beside it), or an SL checkpoint to ship as it is")],
    name: Annotated[str, typer.Option(help="model name: writes MODELS/NAME.pt, NAME.json, NAME.md")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    models: Annotated[Path, typer.Option(help="output directory")] = Path("models"),
    test_traces: Annotated[int, typer.Option(min=1, help="test traces (test seed set)")] = 10,
    processes: Annotated[int | None, typer.Option(min=1, help="processes (default: cores)")] = None,
    trace: Annotated[Path | None, typer.Option(
        help="test on this fixed Parquet trace (--test-traces noise seeds), not generated ones")] = None,
    placer: Annotated[str | None, typer.Option(
        help="the placement the shipped policy decides under as its own (meta.placer; choose it on "
        "validation: tests/bench/bench_placers.py): load_balancing, packing, optimus or tetris "
        "(default: the run's, load_balancing when it names none)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Ship a run's best checkpoint: slim NAME.pt, its run records and a model card with test-set JCTs."""
    from dl2ray.learn.ship import ship

    _check_name(name)
    cfg = load_config(config)
    if trace is not None and not trace.is_file():
        raise UserError(f"--trace: {trace}: no such trace file")
    if placer is not None:
        _check_placer(placer)
    shipped = ship(cfg, str(config or "configs/testbed.yaml"), run, name, models, test_traces, processes,
                   trace, placer)
    emit({"checkpoint": str(shipped.checkpoint), "record": str(shipped.record), "card": str(shipped.card),
          "results": shipped.results}, json_out)


@app.command("retest")
def train_retest(
    name: Annotated[str, typer.Option(help="the shipped model: MODELS/NAME.pt, NAME.json, NAME.md")],
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="experiment YAML (default: the one NAME.json names)")] = None,
    models: Annotated[Path, typer.Option(help="directory of the shipped model")] = Path("models"),
    placer: Annotated[str | None, typer.Option(
        help="first set the checkpoint's own placement (meta.placer, chosen on validation)")] = None,
    processes: Annotated[int | None, typer.Option(min=1, help="processes (default: cores)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Re-measure a shipped model's test table (same weights, test seeds or trace) as the simulator and
    the baselines are now; rewrites NAME.json's test results and the card's "Test traces" section."""
    from dl2ray.learn.ship import read_record, retest
    from dl2ray.policy.network import set_checkpoint_placer

    _check_name(name)
    pt = models / f"{name}.pt"
    if not pt.is_file():
        raise UserError(f"--name: {pt}: no such shipped checkpoint")
    if config is None:
        config = Path(str(read_record(pt).get("config_file") or "configs/testbed.yaml"))
    cfg = load_config(config)
    if placer is not None:
        _check_placer(placer)
        set_checkpoint_placer(pt, placer)
    shipped = retest(cfg, name, models, processes)
    emit({"checkpoint": str(shipped.checkpoint), "record": str(shipped.record), "card": str(shipped.card),
          "results": shipped.results}, json_out)


@app.command("shipped")
def train_shipped(
    models: Annotated[Path, typer.Option(help="directory of the shipped models")] = Path("models"),
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """The shipped policies' test rows, read from their run records (NAME.json): the Markdown table of
    docs/results.md ("The shipped policies"), or JSON."""
    from dl2ray.learn.ship import shipped_markdown, shipped_rows

    if not models.is_dir():
        raise UserError(f"--models: {models}: no such directory")
    rows = shipped_rows(models)
    if json_out:
        print(json.dumps({"shipped": rows}))
    else:
        print(shipped_markdown(rows), end="")


def _check_name(name: str) -> None:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise UserError(f"--name: {name!r}: use letters, digits, '.', '_' or '-'")


def _check_placer(placer: str) -> None:
    from dl2ray.cluster import PLACEMENTS

    if placer not in PLACEMENTS:
        raise UserError(f"--placer: {placer!r}: must be one of {', '.join(PLACEMENTS)}")
