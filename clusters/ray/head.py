"""The Ray head a ``dl2ray`` command starts for a cluster of its own (``cluster up``, ``federation up``, the
live demo): ``ray start --head --block`` in a session of its own, stopped by its pid, never ``ray stop``.

With a token file (:mod:`clusters.ray.auth`) the head runs with Ray's token authentication on; its
processes, job drivers included, inherit the token's path. The directory of this Python's executables
(the project's virtual environment) goes first on the head's ``PATH``, so that a ``ray job submit``
entrypoint ``dl2ray submit ...`` finds the project's ``dl2ray`` in a shell that never activated it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from clusters.ray.auth import child_env
from dl2ray.errors import UserError


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise UserError("no free port")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_head(num_cpus: int | None, dashboard_port: int, log: Path,
               token_path: Path | None = None) -> dict[str, Any]:
    """``ray start --head --block`` in a session of its own (stopped by pid in :func:`stop_head`);
    ``token_path``: the cluster's token file (token authentication on), None: authentication disabled.
    Returns ``address`` (GCS, ``host:port``), ``dashboard`` (the Jobs API's URL) and ``pid``."""
    port, dash = _free_port(0), _free_port(dashboard_port)
    bin_dir = str(Path(sys.executable).parent)
    env = child_env(token_path)
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        PATH=os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p)]),
    )
    # On a loaded machine: longer waits than Ray's defaults for the raylet and the agents' registration
    # (the user's settings win). The raylet's wait for the dashboard agent's port files did not follow
    # RAY_agent_register_timeout_ms in our runs: at load 47 a head still aborted (docs/live.md, Limits).
    for var, value in (("RAY_raylet_start_wait_time_s", "180"), ("RAY_agent_register_timeout_ms", "180000")):
        env.setdefault(var, value)
    ray_bin = str(Path(sys.executable).with_name("ray"))
    cmd = [
        ray_bin,
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dash),
        "--include-dashboard",
        "true",
        "--dashboard-agent-listen-port",  # Ray's default (52365) is taken when another head runs here
        str(_free_port(0)),
        "--num-cpus",
        str(num_cpus or os.cpu_count() or 1),
        "--disable-usage-stats",
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"ray start failed (exit {proc.returncode}); see {log}")
        if all(_listening(p) for p in (port, dash)):  # the GCS and the dashboard (Jobs API) answer
            return {"address": address, "dashboard": f"http://127.0.0.1:{dash}", "pid": proc.pid}
        time.sleep(0.5)
    stop_head(proc.pid)
    raise UserError(f"the Ray head did not come up within 90 s; see {log}")


def stop_head(pid: int, grace_s: float = 20.0) -> None:
    """End the ``ray start --block`` process we started and its process group (by id, never ``ray stop``)."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:  # not our child (started by an earlier command): poll for it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
        time.sleep(0.2)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
