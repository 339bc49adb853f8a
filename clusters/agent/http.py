"""The agent's HTTP server: the operator's dashboard, its JSON, and Prometheus metrics.

Routes (read-only; the server binds ``dashboard.host``, loopback by default):

- ``GET /``            the dashboard page (``dashboard.html``: plain HTML and JavaScript, no build step)
  that polls ``/api/state`` every ``refresh`` seconds (``?refresh=S``, default 2);
- ``GET /api/state``   :class:`~clusters.agent.dashboard.DashboardState` as JSON;
- ``GET /metrics``     Prometheus text (:mod:`clusters.agent.metrics`);
- ``GET /healthz``     ``{"status": "ok"}``.

A state that cannot be built now (the cluster did not answer) is a 503 with ``detail``; the server
stays up. The state and the scrape are each built at most once per ``max_age_s`` (1 s) and shared by
every request meanwhile: any number of open pages costs the agent one build per second, no more.
:class:`AgentHttp` runs uvicorn in a daemon thread of the agent's process (the Ray agent actor), so it
lives and restarts with the agent.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from importlib.resources import files
from typing import Generic, TypeVar

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

log = logging.getLogger(__name__)
T = TypeVar("T")


class Latest(Generic[T]):
    """``fn()``, computed again only when the last result is older than ``max_age_s`` seconds (thread-safe;
    a failure is not kept)."""

    def __init__(self, fn: Callable[[], T], max_age_s: float) -> None:
        self.fn, self.max_age_s = fn, max_age_s
        self._lock = threading.Lock()
        self._last: tuple[float, T] | None = None

    def __call__(self) -> T:
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._last[0] >= self.max_age_s:
                self._last = (now, self.fn())
            return self._last[1]


def dashboard_html() -> str:
    """The page, shipped beside this module."""
    return files("clusters.agent").joinpath("dashboard.html").read_text(encoding="utf-8")


def make_app(state: Callable[[], BaseModel], metrics: Callable[[], bytes],
             title: str = "dl2ray agent", max_age_s: float = 1.0) -> FastAPI:
    """The routes (module docstring) over ``state`` (the dashboard's state now) and ``metrics``
    (the Prometheus exposition now), each called in a worker thread, at most once per ``max_age_s``."""
    import anyio

    state, metrics = Latest(state, max_age_s), Latest(metrics, max_age_s)

    app = FastAPI(title=title, docs_url=None, redoc_url=None)
    page = dashboard_html()

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/api/state")
    async def api_state() -> Response:
        try:
            doc = await anyio.to_thread.run_sync(state)
        except Exception as exc:  # the cluster did not answer: say so, keep serving
            log.warning("dashboard state failed: %r", exc)
            return JSONResponse({"detail": f"state unavailable: {type(exc).__name__}: {exc}"},
                                status_code=503)
        return Response(doc.model_dump_json(), media_type="application/json")

    @app.get("/metrics")
    async def prometheus() -> Response:
        try:
            body = await anyio.to_thread.run_sync(metrics)
        except Exception as exc:
            log.warning("metrics scrape failed: %r", exc)
            return Response(f"# scrape failed: {type(exc).__name__}: {exc}\n", status_code=503,
                            media_type="text/plain")
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or on a free port of ``host`` when ``port`` is taken (or 0)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        log.warning("port %d on %s is taken: the agent's HTTP server takes a free one", port, host)
        sock.bind((host, 0))
    return sock


class AgentHttp:
    """uvicorn serving ``app`` in a daemon thread; :attr:`url` once it listens; :meth:`stop` ends it."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 start_timeout_s: float = 30.0) -> None:
        import uvicorn

        sock = bind(host, port)
        self.host, self.port = host, sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="agent-http")
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError(f"the agent's HTTP server did not start on {host}:{self.port}")

    @property
    def url(self) -> str:
        host = socket.gethostname() if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
