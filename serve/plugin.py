"""The ``serve`` plugin of the ``dl2ray`` CLI: ``dl2ray serve`` and ``dl2ray bench serve``.

The core may not import ``serve`` (import-linter), so these commands reach the
CLI through the ``dl2ray.plugins`` entry point (``pyproject.toml``), which the
core calls with its :class:`~dl2ray.cli.commands.Plugins` registry. (The
``serve:URL`` scheduler comes through the ``dl2ray.schedulers`` entry point.)
Importing this module imports neither Ray nor FastAPI.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dl2ray.errors import UserError
from dl2ray.evaluation.report import emit

if TYPE_CHECKING:
    from dl2ray.cli.commands import Plugins


def register(plugins: Plugins) -> None:
    """The ``dl2ray.plugins`` entry point."""
    if plugins.root is not None:
        plugins.root.command("serve")(serve_command)
    plugins.groups["bench"].command("serve")(bench_serve)


def serve_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="experiment YAML the policy fits")] = Path(
        "configs/testbed.yaml"),
    checkpoint: Annotated[Path | None, typer.Option(
        help="policy checkpoint (default models/dl2-CONFIG.pt); watched and hot-reloaded on change")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port of Serve's proxy")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(
        min=1, max=65535, help="gRPC port of Serve's proxy (decide.proto); default: no gRPC")] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    mode: Annotated[str, typer.Option(
        help="Serve's request path: direct (replicas answer HTTP/gRPC themselves), throughput, inline, "
             "proxy (see docs/serve.md)")] = "direct",
    replicas: Annotated[int, typer.Option(min=1, help="replicas of the decider, one core each")] = 1,
    overload_bound_ms: Annotated[float, typer.Option(
        min=0.0, help="refuse (503) what the replica cannot answer within this many ms; 0: never")] = 25.0,
    reload_every: Annotated[float, typer.Option(
        min=0.0, help="seconds between weight polls; 0: never")] = 2.0,
    global_policy: Annotated[str | None, typer.Option(
        help="pull weights from this GlobalPolicy Ray actor instead of watching the file")] = None,
    namespace: Annotated[str | None, typer.Option(help="Ray namespace of --global-policy")] = None,
    noop: Annotated[bool, typer.Option(
        "--noop", hidden=True, help="benchmark floor: answer every request with the first one's allocation "
                                    "(ServeSettings.noop)")] = False,
) -> None:
    """Serve the DL2 policy (and the heuristics) over HTTP with Ray Serve until Ctrl-C (see docs/serve.md)."""
    from dl2ray.config import load_config
    from serve.app import ServeSettings

    cfg = load_config(config)
    if checkpoint is None and global_policy is None:
        checkpoint = Path(f"models/dl2-{cfg.name}.pt")
    if checkpoint is not None and not checkpoint.is_file():
        raise UserError(f"--checkpoint: {checkpoint}: no such file")
    from serve.launch import SERVE_MODES, app_urls, run_app, start_ray

    if mode not in SERVE_MODES:
        raise UserError(f"--mode {mode}: one of {', '.join(SERVE_MODES)}")
    settings = ServeSettings(config=str(config.resolve()),
                             checkpoint=str(checkpoint.resolve()) if checkpoint else None,
                             reload_every_s=reload_every, global_policy=global_policy,
                             global_namespace=namespace, overload_bound_ms=overload_bound_ms, noop=noop)
    _check_weights(settings)
    started = start_ray(mode, port, grpc_port)
    import ray
    from ray import serve as ray_serve

    url = run_app(settings, host, port, blocking=False, grpc_port=grpc_port, num_replicas=replicas)
    urls = app_urls(host=host)
    print(f"dl2ray decision endpoint at {url} (POST /v1/decide, GET /v1/policy, /docs); Ctrl-C stops it",
          flush=True)
    print(f"the application answers at {json.dumps(urls)}", flush=True)
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # terminate = Ctrl-C: shut Serve and Ray down
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ray_serve.shutdown()
        if started:
            ray.shutdown()


def _check_weights(settings) -> None:
    """Refuse a checkpoint that does not fit the config here, in one line, before Serve starts a replica."""
    if settings.checkpoint is None:
        return
    from dl2ray.config import load_config
    from dl2ray.schedulers.dl2 import DL2Scheduler

    DL2Scheduler(settings.checkpoint, load_config(settings.config))


def bench_serve(
    config: Annotated[Path, typer.Option("--config", "-c")] = Path("configs/large.yaml"),
    checkpoint: Annotated[Path | None, typer.Option(help="policy (default models/dl2-CONFIG.pt)")] = None,
    rps: Annotated[float, typer.Option(min=1.0, help="fixed request rate of the main measurement")] = 100.0,
    seconds: Annotated[float, typer.Option(
        min=1.0, help="seconds of the main measurement, per server")] = 30.0,
    jobs: Annotated[int, typer.Option(min=1, help="jobs in the view")] = 40,
    probe_seconds: Annotated[float, typer.Option(
        min=0.5, help="seconds per rate while searching the highest rate with p99 < 50 ms")] = 5.0,
    seed: int = 0,
    modes: Annotated[str, typer.Option(
        help="Serve modes measured over HTTP, comma-separated (serve.launch.SERVE_MODES); MODE:R runs R "
             "replicas")] = "proxy,direct",
    grpc_modes: Annotated[str, typer.Option(help="of those, the ones also measured over gRPC")] = "direct",
    overload_factor: Annotated[float, typer.Option(
        min=1.0, help="the overload run offers this many times the highest good rate")] = 3.0,
    overload_bound_ms: Annotated[float, typer.Option(min=0.0, help="the servers' admission bound")] = 25.0,
    plot: Annotated[Path | None, typer.Option(help="write the latency-vs-rate plot (PNG) here")] = None,
    noop: Annotated[bool, typer.Option(
        "--noop/--no-noop", help="measure each mode's no-op floor too (serve-MODE-noop)")] = True,
    uvicorn: Annotated[bool, typer.Option("--uvicorn/--no-uvicorn", help="measure plain uvicorn too")] = True,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Latency of the decision endpoint (open loop, own-process load generator): in-process, plain uvicorn,
    Ray Serve per mode over HTTP and gRPC, and each mode's no-op floor (the same app answering a fixed
    allocation); fixed rate, highest rate with p99 < 50 ms, overload."""
    from dl2ray.config import load_config
    from serve.bench import run
    from serve.launch import SERVE_MODES

    cfg = load_config(config)
    ckpt = checkpoint or Path(f"models/dl2-{cfg.name}.pt")
    if not ckpt.is_file():
        raise UserError(f"--checkpoint: {ckpt}: no such file")
    mode_list = [_mode_replicas(m) for m in modes.split(",") if m]
    grpc_list = [m for m in grpc_modes.split(",") if m]
    for m in (*(m for m, _ in mode_list), *grpc_list):
        if m not in SERVE_MODES:
            raise UserError(f"--modes/--grpc-modes: unknown mode {m!r}; one of {', '.join(SERVE_MODES)}")
    # Ray prints its shutdown notices on stdout; --json promises one JSON object there and nothing else.
    with contextlib.redirect_stdout(sys.stderr):
        doc = run(config, ckpt, rps, seconds, jobs, probe_seconds, seed, mode_list, grpc_list,
                  overload_factor, overload_bound_ms, plot, noop=noop, uvicorn=uvicorn)
    emit(doc, json_out)


def _mode_replicas(item: str) -> tuple[str, int]:
    """``MODE`` or ``MODE:R`` of ``--modes`` as ``(mode, replicas)``; :class:`UserError` naming a bad R."""
    mode, _, count = item.partition(":")
    if not count:
        return mode, 1
    if not count.isdigit() or int(count) < 1:
        raise UserError(f"--modes: {item!r}: the replicas after ':' must be a whole number ≥ 1")
    return mode, int(count)
