"""``dl2ray trace``: import, generate and describe traces.

The composition root of the trace commands: only here are config files,
speed surfaces and trace files wired together. Every user error raises
:class:`~dl2ray.errors.UserError`, which ``dl2ray.cli.app.main`` prints before
exiting with code 2.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from dl2ray.config import ConfigError, ExperimentConfig, load_config
from dl2ray.errors import UserError
from dl2ray.measurements import load_surfaces
from dl2ray.speed import SpeedModel, config_placement

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Import, generate and describe traces (Parquet, see docs/traces.md).",
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="experiment config (default: configs/testbed.yaml)"),
]
OutOpt = Annotated[Path, typer.Option("--out", help="trace file to write (.parquet)")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, help="seed of every random draw")]


def measured_speed(cfg: ExperimentConfig) -> SpeedModel:
    """The measured-speed model of ``cfg``'s catalogue and shipped surfaces."""
    try:
        return SpeedModel(cfg.catalogue, load_surfaces(cfg.surfaces_dir), placement=config_placement(cfg))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"speed.surfaces: {exc}") from None


def _total(cfg: ExperimentConfig) -> tuple[float, float, float]:
    """The config's whole cluster as (cpu, gpu, mem)."""
    cpu, gpu, mem = (float(x) for x in cfg.cluster.capacity.sum(axis=0))
    return cpu, gpu, mem


def _source(fmt: str, file: Path, opts: dict[str, Any]) -> str:
    given = " ".join(f"{k}={v}" for k, v in opts.items() if v is not None)
    return f"{fmt}:{file.name} {given}".strip()


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="the trace CSV")],
    out: OutOpt,
    fmt: Annotated[
        str, typer.Option("--format", help="philly | alibaba-gpu-2023 | helios")
    ],
    max_jobs: Annotated[int | None, typer.Option(help="keep the first N jobs")] = None,
    skip: Annotated[int, typer.Option(help="drop the first N jobs first (a later segment)")] = 0,
    time_scale: Annotated[float, typer.Option(help="multiplies every time")] = 1.0,
    cluster: Annotated[str | None, typer.Option(help="virtual cluster to keep")] = None,
    seed: SeedOpt = 0,
    slot_seconds: Annotated[
        float | None, typer.Option(help="slot length, s (default: the config's)")
    ] = None,
    epoch_error: Annotated[float | None, typer.Option(
        help="estimate = true × (1 + U(-e, e)) (default: the config's workload.epoch_error)")] = None,
    target_load: Annotated[
        float | None,
        typer.Option(help="compress (or stretch) arrivals so the offered load on the config's "
                     "cluster is this (durations untouched; docs/traces.md)"),
    ] = None,
    queues: Annotated[bool, typer.Option(
        "--queues", help="each job in the queue of its virtual cluster (Philly cluster, Helios vc)")] = False,
    tenancy_out: Annotated[Path | None, typer.Option(
        help="with --queues: write a `tenancy:` block (YAML) with a queue per virtual cluster, its quota "
             "the config's cluster × its share of the GPU time (docs/tenancy.md)")] = None,
    config: ConfigOpt = None,
) -> None:
    """Map a real cluster trace to DL jobs (rule: docs/traces.md) and write it as Parquet."""
    from dl2ray.traces.importers import FORMATS, ImportOptions, import_trace, vc_tenancy
    from dl2ray.traces.parquet import write_trace

    cfg = load_config(config)
    slot = slot_seconds if slot_seconds is not None else cfg.sim.slot_seconds
    options = ImportOptions(
        slot_seconds=slot,
        time_scale=time_scale,
        max_jobs=max_jobs,
        skip=skip,
        cluster=cluster,
        seed=seed,
        epoch_error=cfg.workload.epoch_error if epoch_error is None else epoch_error,
        types=cfg.workload.types,
        target_load=target_load,
        cluster_total=_total(cfg),
        queues=queues,
    )
    if tenancy_out is not None and not queues:
        raise UserError("--tenancy-out: needs --queues")
    trace = import_trace(fmt, file, measured_speed(cfg), options)
    if tenancy_out is not None:
        kept = {j.queue for j in trace}
        records = [r for r in FORMATS[fmt](file, cluster) if r.group in kept]
        block = vc_tenancy(records, cfg.cluster.capacity.sum(axis=0)).model_dump(exclude_defaults=True)
        tenancy_out.write_text(yaml.safe_dump({"tenancy": block}, sort_keys=False), encoding="utf-8")
        typer.echo(f"wrote {len(block['queues'])} queues to {tenancy_out}")
    given = {
        "cluster": cluster, "skip": skip or None, "max_jobs": max_jobs, "time_scale": time_scale,
        "seed": seed, "epoch_error": options.epoch_error, "target_load": target_load,
        "load_cluster": cfg.name if target_load is not None else None, "queues": queues or None,
    }  # fmt: skip
    write_trace(out, trace, source=_source(fmt, file, given), slot_seconds=slot)
    typer.echo(f"wrote {len(trace)} jobs to {out}")


@app.command("generate")
def generate_cmd(out: OutOpt, config: ConfigOpt = None, seed: SeedOpt = 0) -> None:
    """Draw a synthetic trace from the config's workload group and write it as Parquet."""
    from dl2ray.traces.generate import generate_trace
    from dl2ray.traces.parquet import write_trace

    cfg = load_config(config)
    trace = generate_trace(cfg, seed)
    source = f"generate:{cfg.name} seed={seed}"
    write_trace(out, trace, source=source, slot_seconds=cfg.sim.slot_seconds)
    typer.echo(f"wrote {len(trace)} jobs to {out}")


@app.command("merge")
def merge_cmd(
    out: OutOpt,
    queue: Annotated[list[str], typer.Option(
        "--queue", metavar="QUEUE=FILE",
        help="a trace whose jobs go to queue QUEUE (repeat: one per queue of the config's tenancy)")],
    config: ConfigOpt = None,
) -> None:
    """Merge traces into one shared cluster's trace, each file's jobs in its queue (docs/tenancy.md)."""
    from dl2ray.traces.merge import merge_queues
    from dl2ray.traces.parquet import read_trace, write_trace

    cfg = load_config(config)
    if cfg.tenancy is None:
        raise UserError(f"--config: {cfg.name} has no tenancy: group, so it has no queues (docs/tenancy.md)")
    files: dict[str, Path] = {}
    for item in queue:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--queue {item!r}: expected QUEUE=FILE")
        if name not in cfg.tenancy.names:
            raise UserError(f"--queue {item!r}: {name!r} is not a queue of {cfg.name} "
                            f"(known: {', '.join(cfg.tenancy.names)})")
        if name in files:
            raise UserError(f"--queue {item!r}: queue {name!r} given twice")
        files[name] = Path(path)
    trace = merge_queues({q: read_trace(f, cfg.catalogue) for q, f in files.items()})
    source = "merge:" + ",".join(f"{q}={f}" for q, f in files.items())
    write_trace(out, trace, source=source, slot_seconds=cfg.sim.slot_seconds)
    typer.echo(f"wrote {len(trace)} jobs in {len(files)} queue(s) to {out}")


@app.command("describe")
def describe_cmd(
    trace_file: Annotated[Path, typer.Argument(help="a trace written by import/generate")],
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Summarise a trace: size, span, arrival rate, length quantiles, type mix."""
    from dl2ray.traces.describe import describe_trace
    from dl2ray.traces.importers import trace_offered_load
    from dl2ray.traces.parquet import read_trace, read_trace_meta

    cfg = load_config(config)
    meta = read_trace_meta(trace_file)
    trace = read_trace(trace_file, cfg.catalogue)
    summary = describe_trace(trace, meta.slot_seconds)
    sized = [j.requested_bundles for j in trace if j.requested_bundles is not None]
    load = trace_offered_load(trace, measured_speed(cfg), cfg.cluster.capacity.sum(axis=0),
                              meta.slot_seconds, cfg.workload.requested_bundles)
    summary = {"file": str(trace_file), "source": meta.source, **summary,
               "requested_bundles": dict(sorted(Counter(sized).items())) if sized else None,
               "offered_load": load, "offered_load_cluster": cfg.name}
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_table(summary)


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"trace {summary['file']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in summary.items():
        if key == "file":
            continue
        if isinstance(value, dict):
            text = "  ".join(f"{k} {_fmt(v)}" for k, v in value.items())
        else:
            text = _fmt(value)
        table.add_row(key, text)
    Console().print(table)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
