"""The ``dl2ray`` commands: simulate, compare, fit-speed, demo, and the sub-groups.

This module is the CLI's composition root: only here are config files, traces,
speed surfaces and output files wired together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from dl2ray.cli.options import ConfigOpt, JsonOpt, PlacementOpt, TraceOpt
from dl2ray.config import ExperimentConfig, load_config
from dl2ray.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from dl2ray.cli.train import MultiAgentRL


_err = Console(stderr=True)


def _config(path: Path | None, placement: str | None = None) -> ExperimentConfig:
    """The config at ``path``; ``placement`` (``--placement``) replaces its ``cluster.placement``."""
    cfg = load_config(path)
    if placement is None:
        return cfg
    from dl2ray.cluster import PLACEMENTS

    if placement != "own" and placement not in PLACEMENTS:
        raise UserError(f"--placement: unknown placement {placement!r}; known: own, {', '.join(PLACEMENTS)}")
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"placement": placement})})


def _trace(path: Path | None, cfg: ExperimentConfig):
    if path is None:
        return None
    from dl2ray.traces.parquet import read_trace

    return read_trace(path, cfg.catalogue)


def _check_surfaces(cfg: ExperimentConfig) -> None:
    if cfg.speed.model == "measured" and not (cfg.surfaces_dir / "surfaces.json").exists():
        raise UserError(
            f"speed.surfaces: {cfg.surfaces_dir}/surfaces.json missing; "
            "run `dl2ray fit-speed FILE --out <dir>`"
        )


def simulate(
    config: ConfigOpt = None,
    scheduler: Annotated[str, typer.Option(help="scheduler name, e.g. drf or dl2:models/x.pt")] = "drf",
    trace: TraceOpt = None,
    seed: Annotated[int, typer.Option(help="trace/noise seed")] = 0,
    json_out: JsonOpt = False,
    events: Annotated[Path | None, typer.Option(help="write the per-slot event log (Parquet)")] = None,
    placement: PlacementOpt = None,
) -> None:
    """Run one scheduler on one trace and print its metrics."""
    from dl2ray.evaluation.comparison import RunSpec, run_one
    from dl2ray.sim import write_events

    cfg = _config(config, placement)
    _check_surfaces(cfg)
    outcome = run_one(cfg, RunSpec(scheduler, seed), _trace(trace, cfg), keep_result=events is not None)
    if events is not None and outcome.result is not None:
        write_events(str(events), outcome.result)
    from dl2ray.evaluation.report import dumps

    for line in _unfinished(outcome.metrics, cfg, scheduler):
        typer.echo(line, err=True)
    if json_out:
        print(dumps({"config": cfg.name, "scheduler": scheduler, "placement": outcome.placement, "seed": seed,
                     **outcome.metrics}))
        return
    table = Table(title=f"{scheduler} on {cfg.name} (seed {seed}, {outcome.placement} placement)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in outcome.metrics.items():
        table.add_row(k, f"{v:.3f}")
    Console().print(table)


def compare(
    config: ConfigOpt = None,
    schedulers: Annotated[str, typer.Option(help="comma-separated scheduler names")] = (
        "fifo,srtf,drf,drf-static,tetris,optimus"
    ),
    traces: Annotated[int, typer.Option(min=1, help="number of traces (seeds seed..seed+N-1)")] = 5,
    seed: Annotated[int, typer.Option(help="first trace seed")] = 0,
    trace: TraceOpt = None,
    json_out: JsonOpt = False,
    plot: Annotated[Path | None, typer.Option(help="write the JCT CDF plot (PNG)")] = None,
    out: Annotated[Path | None, typer.Option(help="write results.json, jct.parquet and the plot")] = None,
    processes: Annotated[int | None, typer.Option(help="worker processes (default: cores)")] = None,
    references: Annotated[bool, typer.Option(
        "--references/--no-references",
        help="add the not-deployable references: optimus-truth (Optimus on the true surfaces) and the "
        "per-trace lower bound",
    )] = True,
    requested_bundles: Annotated[int | None, typer.Option(
        help="override workload.requested_bundles: the size (bundles, >= 1) of jobs whose trace names none",
    )] = None,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print the table as GitHub Markdown (for docs/), not a terminal table")] = False,
    paired: Annotated[str | None, typer.Option(
        help="comma-separated baselines: every row gets the per-trace ratio of its average JCT to each "
        "(same traces), mean ± 95% CI (JSON: results[].paired); default: drf when it runs")] = None,
    placement: PlacementOpt = None,
) -> None:
    """Run every scheduler on the same traces; table (or JSON) of mean ± 95% CI."""
    from dl2ray.evaluation import comparison, report

    cfg = _config(config, placement)
    if requested_bundles is not None:
        if requested_bundles < 1:
            raise UserError(f"--requested-bundles: {requested_bundles} must be >= 1")
        cfg = cfg.model_copy(update={
            "workload": cfg.workload.model_copy(update={"requested_bundles": requested_bundles})})
    _check_surfaces(cfg)
    names = [s.strip() for s in schedulers.split(",") if s.strip()]
    if not names:
        raise UserError("--schedulers: give at least one scheduler")
    if cfg.gang is not None:
        references = False  # optimus-truth and the lower bound model the DL2 simulator, not gang mode
    if references and not {"optimus-truth", "oracle"} & set(names):
        names.append("optimus-truth")
    baselines = _paired_baselines(paired, names)
    fixed = _trace(trace, cfg)
    seeds = list(range(seed, seed + traces))
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=_err, transient=True, disable=not _err.is_terminal,
    ) as bar:
        task = bar.add_task("simulating", total=len(names) * len(seeds))
        comp = comparison.compare(
            cfg, names, seeds, fixed, processes, on_done=lambda _: bar.advance(task),
            references=references, paired=baselines,
        )
    rows = comp.summary()
    doc = {"config": cfg.name, "traces": len(seeds), "seeds": seeds, "max_slots": cfg.sim.max_slots,
           "requested_bundles": cfg.workload.requested_bundles, "placement": cfg.cluster.placement,
           "results": rows}
    for line in report.unfinished_warnings(comp, cfg.sim.max_slots):
        typer.echo(line, err=True)
    if out is not None:
        _write_outputs(out, doc, comp)
        plot = plot or out / "jct_cdf.png"
    if plot is not None:
        report.plot_jct_cdf(comp, plot)
    if json_out:
        print(report.dumps(doc))
    elif markdown:
        print(report.markdown_table(rows, [b for b in baselines if b in comp.runs]))
    else:
        report.print_table(comp)
        if plot is not None:
            print(f"JCT CDF written to {plot}")


def _paired_baselines(paired: str | None, names: list[str]) -> list[str]:
    """``--paired``'s baselines (default: drf when it runs); UserError naming those that do not run."""
    if paired is None:
        return ["drf"] if "drf" in names else []
    baselines = [b.strip() for b in paired.split(",") if b.strip()]
    unknown = [b for b in baselines if b not in names]
    if unknown:
        raise UserError(f"--paired: {unknown} are not among --schedulers ({','.join(names)})")
    return baselines


def _unfinished(metrics: dict, cfg: ExperimentConfig, scheduler: str) -> list[str]:
    left = int(metrics["unfinished"])
    if not left:
        return []
    return [f"warning: {scheduler}: {left} of {int(metrics['jobs'])} jobs unfinished at "
            f"sim.max_slots={cfg.sim.max_slots}; censored_avg_jct counts them until the run stopped"]


def _write_outputs(out: Path, doc: dict, comp) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dl2ray.evaluation.report import dumps

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(dumps(doc, indent=1) + "\n", encoding="utf-8")
    rows = [(name, r.seed, j, v) for name, runs in comp.runs.items() for r in runs
            for j, v in sorted(r.jct.items())]
    table = pa.table({
        "scheduler": [r[0] for r in rows], "seed": [r[1] for r in rows],
        "job_id": [r[2] for r in rows], "jct_slots": [r[3] for r in rows],
    })
    pq.write_table(table, out / "jct.parquet")


def fit_speed(
    measurements: Annotated[Path, typer.Argument(help="the testbed measurement file")],
    out: Annotated[Path, typer.Option(help="output directory")] = Path("configs/speed"),
    json_out: JsonOpt = False,
) -> None:
    """Derive the speed surfaces (and Optimus's fitted form, for comparison)."""
    from dl2ray import measurements as measured

    try:
        ms = measured.parse_measurements(measurements)
    except FileNotFoundError:
        raise UserError(f"{measurements}: no such file") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    surfaces = measured.fit_surfaces(ms)
    measured.save_surfaces(surfaces, out, source=f"{measurements.name} ({len(ms)} usable records)")
    optimus = measured.fit_optimus_all(ms)
    rows = []
    for name, surf in sorted(surfaces.items()):
        pts = [m for m in ms if m.model == name]
        rows.append({
            "model": name, "points": len(pts),
            "surface_rel_error": measured.surface_rel_error(surf, pts),
            "optimus_rel_error": optimus[name]["mean_rel_error"],
            "optimus_theta": optimus[name]["theta"],
        })
    (out / measured.OPTIMUS_FILE).write_text(
        json.dumps({"schema_version": measured.SCHEMA_VERSION, "models": optimus}, indent=1) + "\n",
        encoding="utf-8",
    )
    if json_out:
        print(json.dumps({"out": str(out), "models": rows}))
        return
    table = Table(title=f"speed fit from {measurements.name}: mean relative error at measured points")
    for col in ("model", "points", "surface", "Optimus form"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        table.add_row(r["model"], str(r["points"]), f"{r['surface_rel_error']:.3f}",
                      f"{r['optimus_rel_error']:.3f}")
    Console().print(table)
    print(f"wrote {out / measured.SURFACES_FILE} and {out / measured.OPTIMUS_FILE}")


def demo(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("demo-out"),
    traces: Annotated[int, typer.Option(min=1, help="test traces (the test seed set)")] = 5,
    model: Annotated[Path, typer.Option(help="shipped DL2 policy")] = Path("models/dl2-testbed.pt"),
    live: Annotated[bool, typer.Option(
        "--live", help="instead: a local Ray cluster, four real elastic MXNet jobs scaled by the policy "
        "(a few minutes; needs the clusters plugin)")] = False,
) -> None:
    """The main job on the embedded default: the shipped DL2 policy and all heuristics, testbed config,
    on test traces (never used in training or model selection)."""
    from dl2ray.seeds import TEST

    if live:
        plugins = ctx.obj
        if plugins is None or getattr(plugins, "live_demo", None) is None:
            raise UserError("--live needs the clusters plugin (Ray): " + str(getattr(plugins, "failed", "")))
        plugins.live_demo(out=out, model=model)
        return
    if not model.is_file():
        raise UserError(f"--model: {model}: no such checkpoint (the repository ships models/dl2-testbed.pt)")
    compare(config=None, schedulers=f"fifo,srtf,drf,tetris,optimus,planner,dl2:{model}", traces=traces,
            seed=TEST[0], trace=None, json_out=False, plot=None, out=out, processes=None,
            paired="drf,planner", placement="own")


PLUGIN_GROUP = "dl2ray.plugins"
"""Entry-point group of CLI plugins: ``name = "package.module:register"``, ``register(plugins: Plugins)``."""


@dataclass
class Plugins:
    """The extension point handed to each plugin's ``register(plugins)``; then the commands' ``ctx.obj``.

    Layers above the core (``clusters``: A3C on Ray) add to the CLI without the
    core importing them (import-linter forbids that edge): they are found through
    the ``dl2ray.plugins`` entry points of the installed distributions.

    ``groups``: the command groups a plugin may add commands to (``"bench"``,
    ``"train"``, ``"trace"``); ``root``: the ``dl2ray`` app itself, for top-level
    commands (``serve``: ``dl2ray serve``). ``multi_agent_rl``: the trainer ``train rl --agents N``
    (N ≥ 2) hands its parsed options to (see :class:`dl2ray.cli.train.MultiAgentRL`). ``federated_rl``:
    Fig. 18's federation runner for ``experiment paper`` (:data:`dl2ray.studies.scaling.Federated`);
    ``ray_session``: a context manager ``(cpus)`` holding one local Ray instance for several such runs.
    ``live_demo``: ``dl2ray demo --live`` (the ``clusters`` plugin: real jobs on local Ray).
    ``live_profile``: ``dl2ray profile --live`` (the ``clusters`` plugin: real elastic MXNet jobs timed
    on this machine; :func:`clusters.cli.profile_live.run_cli`'s arguments, the window as its three options).
    ``loaded``: names of the plugins registered; ``failed``: name → why one did not load.
    """

    groups: dict[str, typer.Typer]
    root: typer.Typer | None = None
    multi_agent_rl: MultiAgentRL | None = None
    federated_rl: Callable[..., list] | None = None
    ray_session: Callable[[int], AbstractContextManager[None]] | None = None
    live_demo: Callable[..., None] | None = None
    live_profile: Callable[..., None] | None = None
    loaded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def load_plugins(plugins: Plugins) -> Plugins:
    """Call ``register(plugins)`` of every ``dl2ray.plugins`` entry point; a broken plugin is recorded in
    ``plugins.failed`` (and named by the command that needs it) instead of breaking the whole CLI."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            ep.load()(plugins)
        except Exception as exc:  # a plugin with a missing dependency must not take `dl2ray` down
            plugins.failed[ep.name] = f"{type(exc).__name__}: {exc}"
        else:
            plugins.loaded.append(ep.name)
    return plugins


def register_all(app: typer.Typer) -> Plugins:
    """Attach the core commands, then the plugins'; returns what the plugins registered."""
    from dl2ray.cli.bench import app as bench_app
    from dl2ray.cli.experiment import app as experiment_app
    from dl2ray.cli.trace import app as trace_app
    from dl2ray.cli.train import app as train_app

    app.command()(simulate)
    app.command()(compare)
    app.command("fit-speed")(fit_speed)
    from dl2ray.cli.profile import profile

    app.command()(profile)
    app.command()(demo)
    app.add_typer(trace_app, name="trace", help="Import, generate and describe traces.")
    app.add_typer(bench_app, name="bench", help="Benchmarks (print JSON).")
    app.add_typer(train_app, name="train", help="Train the DL2 policy (supervised warm-start, RL).")
    from dl2ray.cli.sched2 import train_sched2

    train_app.command("sched2")(train_sched2)
    from dl2ray.cli.harmony import train_harmony

    train_app.command("harmony")(train_harmony)
    from dl2ray.cli.robustness import robustness

    experiment_app.command("robustness")(robustness)
    app.add_typer(experiment_app, name="experiment",
                  help="The paper's learning experiments (training curve, ablation, OfflineRL); RLlib.")
    return load_plugins(Plugins({"bench": bench_app, "train": train_app, "trace": trace_app}, root=app))
