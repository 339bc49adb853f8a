"""``dl2ray-a3c``: the A3C composition root (Ray + config + files), outside the dl2ray core.

Why a second entry point: import-linter forbids ``dl2ray`` from importing
``clusters`` (the core sits below the Ray layer), so ``dl2ray train rl`` cannot
reach the A3C driver without a hidden import. This CLI sits on top of both
layers instead: ``dl2ray-a3c train --agents N ...`` (the multi-agent ``train rl``)
and ``dl2ray-a3c bench --agents 1 2 --seconds 30 --json`` (``bench a3c``).
``python -m clusters ...`` runs the same app without reinstalling the package.
Ray is started here, never at import time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.learn.cli import check_checkpoint_paths
from dl2ray.report import emit

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Federated A3C of the DL2 policy on Ray actors.")


def _start_ray(cpus: int) -> None:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)


@app.command("train")
def train(
    out: Annotated[Path, typer.Option(help="checkpoint to write (also the periodic, resumable one)")],
    updates: Annotated[int, typer.Option(min=1, help="total global updates (a resumed run counts its own)")],
    agents: Annotated[int, typer.Option(min=1, help="cluster-agent actors (one CPU each)")] = 2,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    init: Annotated[Path | None, typer.Option(help="start from this (SL) checkpoint")] = None,
    seed: Annotated[int, typer.Option(help="init and per-agent sampling/exploration seed")] = 0,
    traces: Annotated[int, typer.Option(min=1, help="training traces per agent (disjoint per agent)")] = 100,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="global updates between checkpoints")] = 50,
    cpus: Annotated[int | None, typer.Option(min=1, help="Ray CPUs (default: agents)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """``train rl --agents N``: asynchronous actor-critic with N agents on their own simulated clusters."""
    from clusters.a3c import A3COptions, train_a3c

    cfg = load_config(config)
    check_checkpoint_paths(out, init)
    _start_ray(cpus or agents)
    opts = A3COptions(traces=traces, checkpoint_every=checkpoint_every)
    res = train_a3c(cfg, init, agents, updates, out, seed, opts)
    doc = {"out": str(out), "agents": agents, "seed": seed, "updates": res.updates,
           "per_agent": {str(k): v for k, v in sorted(res.per_agent.items())}, "slots": res.slots,
           "steps": res.steps, "restarted_calls": res.restarts}
    record = {"kind": "a3c", **doc, "config": cfg.model_dump(mode="json")}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    emit(doc, json_out)


@app.command("bench")
def bench(
    agents: Annotated[list[int] | None, typer.Option(help="agent counts to measure (default: 1 2)")] = None,
    seconds: Annotated[float, typer.Option(min=0.1, help="measured seconds per agent count")] = 30.0,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    seed: Annotated[int, typer.Option(help="network and sampling seed")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """``bench a3c``: slots of experience per second, all agents together, for each agent count."""
    from clusters.bench import bench_a3c

    counts = agents or [1, 2]
    cfg = load_config(config)
    _start_ray(max(counts))
    doc = bench_a3c(cfg, counts, seconds, seed)
    emit(doc, json_out)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``dl2ray-a3c``); user errors exit 2 with one line on stderr."""
    argv = _expand_multi(list(sys.argv[1:] if argv is None else argv))
    try:
        app(args=argv, standalone_mode=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _expand_multi(argv: list[str]) -> list[str]:
    """``--agents 1 2`` → ``--agents 1 --agents 2`` (click takes one value per repeated option)."""
    out: list[str] = []
    flag = None
    for a in argv:
        if a == "--agents":
            flag = a
            continue
        if flag and a.isdigit():
            out += [flag, a]
            continue
        flag = None
        out.append(a)
    return out
