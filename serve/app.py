"""The decision endpoint: a plain service class, its HTTP routes, and the Ray Serve application.

Three layers, each testable alone:

- :class:`DecisionService`: ``decide(request)``, ``policy()``, ``healthz()`` on
  pydantic messages (:mod:`serve.schemas`); no FastAPI, no Serve. It owns the
  config, the :class:`~serve.weights.PolicyStore` and the conversion calls
  (:mod:`serve.convert`). The decision is ``decide(view)`` of a scheduler built
  by the core (:class:`~dl2ray.schedulers.dl2.DL2Scheduler` for ``dl2``,
  :func:`~dl2ray.schedulers.base.make_scheduler` for a heuristic): the same
  compiled loop ``dl2ray compare`` runs.
- :data:`ENDPOINTS` attaches the routes to a FastAPI app apart from the class
  (as Ray's LLM ingress does), and :func:`install_errors` turns every refusal
  into an HTTP response in one place: an inconsistent view → 422 in FastAPI's
  validation-error format with the field's path, a body over
  ``max_body_bytes`` → 413.
- :func:`plain_app` puts an instance's routes on a FastAPI app: plain uvicorn
  runs it (the benchmark's reference), and so does every Serve replica
  (``__serve_build_asgi_app__``). :func:`build` is the Ray Serve application
  builder (``serve run serve/config.yaml``, ``dl2ray serve``).

This module is the Serve composition root: only here are config files,
checkpoints and Serve wired together. Importing it starts nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.schedulers.base import make_scheduler, scheduler_names
from serve.convert import ViewError, from_allocation, to_view
from serve.schemas import DecideRequest, DecideResponse, Health, PolicyInfo
from serve.weights import CheckpointFile, GlobalPolicyPull, PolicyStore

log = logging.getLogger("dl2ray.serve")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCHEDULER_PLUGINS = "dl2ray.schedulers"  # entry points of schedulers from other packages (serve: itself)


class ServeSettings(BaseModel):
    """The app's settings: ``args`` of ``serve/config.yaml``, options of ``dl2ray serve``.

    Relative paths are tried against the current directory, then the project
    root (Serve may build the app in another working directory).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str = Field(default="configs/testbed.yaml", description="experiment YAML: cluster, catalogue, J")
    checkpoint: str | None = Field(
        default=None, description="policy checkpoint served at start and watched for changes")
    reload_every_s: float = Field(default=2.0, ge=0,
                                  description="seconds between polls of the weights; 0: never")
    global_policy: str | None = Field(
        default=None,
        description="name of a GlobalPolicy Ray actor to pull weights from (instead of the file)")
    global_namespace: str | None = Field(default=None, description="Ray namespace of that actor")
    max_jobs: int | None = Field(default=None, ge=1, description="largest view accepted; default 10 windows")
    max_body_bytes: int = Field(default=8 << 20, ge=1024, description="larger request bodies get a 413")


def resolve(path: str) -> Path:
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return PROJECT_ROOT / p


def plugin_schedulers() -> set[str]:
    """Schedulers other packages register (``serve:URL`` among them): never run on a client's request."""
    return {ep.name for ep in entry_points(group=SCHEDULER_PLUGINS)}


def servable_heuristics(cfg) -> list[str]:
    """The registered heuristics that can decide views of ``cfg``: each is built once to find out.

    A scheduler made for another simulator mode refuses the config with a :class:`UserError` (the
    SCHED² baselines need a ``gang:`` config, the elastic ones do not run in gang mode); it is left
    out of what this endpoint serves rather than failing on a client's request.
    """
    names = []
    for name in sorted(set(scheduler_names()) - {"dl2"} - plugin_schedulers()):
        try:
            make_scheduler(name, cfg)
        except UserError as exc:
            log.info("not serving %s on config %s: %s", name, cfg.name, exc)
            continue
        names.append(name)
    return names


class DecisionService:
    """The endpoint's logic on pydantic messages (module docstring). ``close()`` stops the weight watcher."""

    def __init__(self, settings: ServeSettings | dict[str, Any] | None = None) -> None:
        s = settings if isinstance(settings, ServeSettings) else ServeSettings.model_validate(settings or {})
        self.settings = s
        self.cfg = load_config(resolve(s.config))
        self.max_jobs = s.max_jobs or 10 * self.cfg.policy.window
        self.heuristics = servable_heuristics(self.cfg)
        self.store = _store(self.cfg, s)

    # -- the endpoints (routes attached by ENDPOINTS) -------------------------------------------

    async def decide(self, request: DecideRequest) -> DecideResponse:
        """One slot's allocation for the request's view (see :class:`~serve.schemas.DecideRequest`)."""
        view = to_view(request.view, self.cfg.catalogue, self.cfg.cluster.placement, self.max_jobs)
        name = request.scheduler
        if name == "dl2":
            loaded = self.store.current  # read once: a swap during this decision does not touch it
            scheduler, version = loaded.scheduler, loaded.version
        elif name in self.heuristics:
            # A fresh instance per request: the decision depends on this view (and its histories) only.
            scheduler, version = make_scheduler(name, self.cfg), f"heuristic:{name}"
        else:
            served = ["dl2", *self.heuristics]
            raise ViewError(("scheduler",), f"unknown scheduler {name!r}; served: {served}", name)
        t0 = time.perf_counter()
        try:
            alloc = scheduler.decide(view)
        except ArithmeticError as exc:
            # A view inside the schema's bounds that a heuristic's arithmetic cannot handle (e.g. a
            # speed that underflows to 0): refuse it, say why, keep serving; logged as the bug it may be.
            log.warning("%s could not decide a view: %r", name, exc, exc_info=True)
            why = f"{name} cannot decide this view: {type(exc).__name__}: {exc}"
            raise ViewError(("view",), why) from None
        ms = (time.perf_counter() - t0) * 1e3
        return DecideResponse(allocation=from_allocation(alloc), scheduler=name, policy_version=version,
                              decision_ms=ms)

    async def policy(self) -> PolicyInfo:
        """What is served now: version, where it came from, the config it fits."""
        cur = self.store.current
        return PolicyInfo(version=cur.version, source=cur.source, checkpoint=self.settings.checkpoint,
                          loaded_at=cur.loaded_at, reloads=self.store.reloads, failures=self.store.failures,
                          last_error=self.store.last_error, config=self.cfg.name,
                          arch=cur.scheduler.arch, window=self.cfg.policy.window, max_jobs=self.max_jobs,
                          job_types=list(self.cfg.catalogue.names), schedulers=["dl2", *self.heuristics])

    async def healthz(self) -> Health:
        return Health(status="ok", policy_version=self.store.current.version)

    # -- Serve hooks -------------------------------------------------------------------------------

    def check_health(self) -> None:
        """Serve's periodic health check: the replica is unhealthy when its weight watcher died."""
        if not self.store.watching:
            raise RuntimeError("the weight watcher thread stopped")

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve's hook, called on the replica after ``__init__``: this instance's HTTP app."""
        return plain_app(self)

    def close(self) -> None:
        self.store.close()

    def __del__(self) -> None:  # Serve calls it when it stops the replica
        store = getattr(self, "store", None)
        if store is not None:
            store.close()


def _store(cfg, s: ServeSettings) -> PolicyStore:
    ckpt = CheckpointFile(resolve(s.checkpoint)) if s.checkpoint else None
    if s.global_policy:
        pull = GlobalPolicyPull(s.global_policy, s.global_namespace)
        return PolicyStore(cfg, ckpt or pull, pull, s.reload_every_s)
    if ckpt is None:
        raise UserError("serve: give a policy checkpoint (checkpoint: / --checkpoint) "
                        "or a global_policy actor")
    return PolicyStore(cfg, ckpt, ckpt, s.reload_every_s)


# -- HTTP ------------------------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"description": "request body larger than the server's max_body_bytes"},
}

ENDPOINTS: dict[str, Callable[[FastAPI], Callable]] = {
    "decide": lambda app: app.post("/v1/decide", response_model=DecideResponse, responses=_ERRORS,
                                   summary="Allocate workers and PS for one slot"),
    "policy": lambda app: app.get("/v1/policy", response_model=PolicyInfo, summary="The served policy"),
    "healthz": lambda app: app.get("/healthz", response_model=Health, summary="Liveness and policy version"),
}


def _validation_error(loc: tuple, msg: str, value: object) -> JSONResponse:
    detail = [{"type": "json_invalid" if not loc else "value_error", "loc": ["body", *loc], "msg": msg,
               "input": value}]
    return JSONResponse(status_code=422, content=jsonable_encoder({"detail": detail}))


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` (declared or streamed) gets a 413, unread."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._reject(send)
            return
        seen, started, refused = 0, False, False

        async def counted():
            # Over the limit: answer 413 here and tell the app the client left (an exception raised into
            # the app would become FastAPI's 400 "error parsing the body").
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not refused:
                    refused = True
                    if not started:
                        await self._reject(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message):
            nonlocal started
            if refused:
                return  # the 413 went out; whatever the app answers to the "disconnect" is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, tracked)

    async def _reject(self, send) -> None:
        body = JSONResponse(status_code=413, content={
            "detail": f"request body larger than {self.max_bytes} bytes"}).body
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install_errors(app: FastAPI, max_body_bytes: int) -> FastAPI:
    """Every refusal becomes an HTTP response here (413, 422); FastAPI's own 422s keep their format."""

    @app.exception_handler(ViewError)
    async def _view_error(request: Request, exc: ViewError) -> JSONResponse:
        return _validation_error(exc.loc, exc.msg, exc.value)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI answers a body it cannot even decode (not UTF-8, not JSON) with a bare 400; make it the
        # same 422 as any other malformed JSON, so a client handles one format.
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return _validation_error((), "request body is not valid JSON", None)
        return await http_exception_handler(request, exc)

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


def fastapi_app(max_body_bytes: int) -> FastAPI:
    """An empty FastAPI app with the endpoint's metadata and error handling (no routes)."""
    app = FastAPI(title="dl2ray decision endpoint", version="1",
                  description="One slot's worker/PS allocation for a cluster view, by the DL2 policy "
                              "or a heuristic. See docs/serve.md.")
    return install_errors(app, max_body_bytes)


def plain_app(service: DecisionService) -> FastAPI:
    """``service``'s routes on a FastAPI app for plain uvicorn (or an in-process test client)."""
    app = fastapi_app(service.settings.max_body_bytes)
    for name, route in ENDPOINTS.items():
        route(app)(getattr(service, name))
    return app


# -- Ray Serve ----------------------------------------------------------------------------------------

DEPLOYMENT_DEFAULTS: dict[str, Any] = {
    "name": "DL2Decider",
    "num_replicas": 1,
    # The decision is CPU-bound and runs inline on the replica's event loop, one at a time; Serve's
    # default of 5 ongoing requests made the proxy queue collapse under floods of calls here. 32 keeps
    # the replica fed without letting a burst build an unbounded in-replica queue.
    "max_ongoing_requests": 32,
    # Beyond this many requests waiting at the proxy, Serve answers 503 at once instead of queueing.
    "max_queued_requests": 1000,
    "ray_actor_options": {"num_cpus": 1},
    "health_check_period_s": 10,
}


def deployment(**options):
    """The Serve deployment: :class:`DecisionService` behind a FastAPI ingress built on each replica.

    The replica builds its app with :func:`plain_app` on its own service instance
    (``__serve_build_asgi_app__``), so Serve runs exactly the routes and error
    handling plain uvicorn runs. (Routes on the class, rewritten by Serve's
    class-based view, lost their rewriting on the way to the replica: the methods
    are importable, so they travel by reference, and ``self`` came back as a query
    parameter.)
    """
    from ray import serve as ray_serve

    return ray_serve.deployment(**{**DEPLOYMENT_DEFAULTS, **options})(ray_serve.ingress()(DecisionService))


def build(args: dict[str, Any]):
    """Serve application builder (``import_path: serve.app:build``); ``args`` are :class:`ServeSettings`."""
    settings = ServeSettings.model_validate(args or {})
    return deployment().bind(settings.model_dump())
