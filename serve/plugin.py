"""The ``serve`` plugin of the ``dl2ray`` CLI: ``dl2ray serve`` and ``dl2ray bench serve``.

The core may not import ``serve`` (import-linter), so these commands reach the
CLI through the ``dl2ray.plugins`` entry point (``pyproject.toml``), which the
core calls with its :class:`~dl2ray.commands.Plugins` registry. (The
``serve:URL`` scheduler comes through the ``dl2ray.schedulers`` entry point.)
Importing this module imports neither Ray nor FastAPI.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dl2ray.errors import UserError
from dl2ray.report import emit

if TYPE_CHECKING:
    from dl2ray.commands import Plugins


def register(plugins: Plugins) -> None:
    """The ``dl2ray.plugins`` entry point."""
    if plugins.root is not None:
        plugins.root.command("serve")(serve_command)
    plugins.groups["bench"].command("serve")(bench_serve)


def start_ray() -> bool:
    """Join the Ray cluster at ``RAY_ADDRESS`` if set, else start a local one on loopback; True if started."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep the node on 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or "local"
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


def run_app(settings, host: str, port: int, name: str = "dl2ray", blocking: bool = True) -> str:
    """Start Serve's proxy on ``host:port``, deploy the app (``settings``: ``ServeSettings``); its URL."""
    from ray import serve as ray_serve

    from serve.app import build

    ray_serve.start(http_options={"host": host, "port": port})
    ray_serve.run(build(settings.model_dump()), name=name, route_prefix="/", blocking=blocking)
    return f"http://{host}:{port}"


def serve_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="experiment YAML the policy fits")] = Path(
        "configs/testbed.yaml"),
    checkpoint: Annotated[Path | None, typer.Option(
        help="policy checkpoint (default models/dl2-CONFIG.pt); watched and hot-reloaded on change")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port")] = 8000,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    reload_every: Annotated[float, typer.Option(
        min=0.0, help="seconds between weight polls; 0: never")] = 2.0,
    global_policy: Annotated[str | None, typer.Option(
        help="pull weights from this GlobalPolicy Ray actor instead of watching the file")] = None,
    namespace: Annotated[str | None, typer.Option(help="Ray namespace of --global-policy")] = None,
) -> None:
    """Serve the DL2 policy (and the heuristics) over HTTP with Ray Serve until Ctrl-C (see docs/serve.md)."""
    from dl2ray.config import load_config
    from serve.app import ServeSettings

    cfg = load_config(config)
    if checkpoint is None and global_policy is None:
        checkpoint = Path(f"models/dl2-{cfg.name}.pt")
    if checkpoint is not None and not checkpoint.is_file():
        raise UserError(f"--checkpoint: {checkpoint}: no such file")
    settings = ServeSettings(config=str(config.resolve()),
                             checkpoint=str(checkpoint.resolve()) if checkpoint else None,
                             reload_every_s=reload_every, global_policy=global_policy,
                             global_namespace=namespace)
    _check_weights(settings)
    started = start_ray()
    import ray
    from ray import serve as ray_serve

    url = run_app(settings, host, port, blocking=False)
    print(f"dl2ray decision endpoint at {url} (POST /v1/decide, GET /v1/policy, /docs); Ctrl-C stops it",
          flush=True)
    try:
        import time

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
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """HTTP latency of the decision endpoint at a fixed rate: Ray Serve, plain uvicorn, in-process decide."""
    from dl2ray.config import load_config
    from serve.bench import run

    cfg = load_config(config)
    ckpt = checkpoint or Path(f"models/dl2-{cfg.name}.pt")
    if not ckpt.is_file():
        raise UserError(f"--checkpoint: {ckpt}: no such file")
    # Ray prints its shutdown notices on stdout; --json promises one JSON object there and nothing else.
    with contextlib.redirect_stdout(sys.stderr):
        doc = run(config, ckpt, rps, seconds, jobs, probe_seconds, seed)
    emit(doc, json_out)
