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
  ``max_body_bytes`` → 413. ``POST /v1/decide`` reads its body itself
  (:func:`decide_route`): pydantic parses and validates the raw JSON bytes in
  one pass and the answer is serialised once, instead of FastAPI's
  ``json.loads`` + validation of Python objects + ``response_model``
  re-validation (≈ 1 ms of a 4 ms handler here); OpenAPI still documents
  the body's schema. An overloaded replica refuses early
  (:mod:`serve.overload`): 503 with ``Retry-After``.
- :meth:`DecisionService.Decide` is the gRPC method (``serve/proto/decide.proto``,
  Serve's gRPC proxy or the replica's own gRPC server): the same checks, errors as
  status codes (INVALID_ARGUMENT, RESOURCE_EXHAUSTED).
- :func:`plain_app` puts an instance's routes on a FastAPI app: plain uvicorn
  runs it (the benchmark's reference), and so does every Serve replica
  (``__serve_build_asgi_app__``). :func:`build` is the Ray Serve application
  builder (``serve run serve/config.yaml``, ``dl2ray serve``).

This module is the Serve composition root: only here are config files,
checkpoints and Serve wired together. Importing it starts nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.schedulers.base import Scheduler, make_scheduler, scheduler_names
from dl2ray.schedulers.placed import own_placement, with_placement
from serve.convert import ViewError, from_allocation, to_view
from serve.metrics import RequestTimer, ServeMetrics
from serve.overload import Admission
from serve.schemas import DecideRequest, DecideResponse, Health, OverloadInfo, PolicyInfo
from serve.weights import CheckpointFile, GlobalPolicyPull, PolicyStore

log = logging.getLogger("dl2ray.serve")
T = TypeVar("T")

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
    overload_bound_ms: float = Field(
        default=25.0, ge=0,
        description="a request the replica cannot answer within this many ms of its arrival is refused at "
                    "once (HTTP 503 + Retry-After, gRPC RESOURCE_EXHAUSTED); 0: never refuse")
    retry_after_s: int = Field(default=1, ge=0, le=3600, description="Retry-After of a refusal, seconds")


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
        self._own_placements = {h: own_placement(make_scheduler(h, self.cfg, "own")) for h in self.heuristics}
        self.store = _store(self.cfg, s)
        self.admission = Admission(s.overload_bound_ms / 1e3, s.retry_after_s)
        self.metrics = ServeMetrics(self.admission.stats, self._policy_numbers)
        # one decision at a time, off the event loop (admitted); more threads would only share the GIL
        self._decider = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decide")

    # -- the endpoints (routes attached by ENDPOINTS) -------------------------------------------

    async def decide(self, request: DecideRequest) -> DecideResponse:
        """One slot's allocation for the request's view (a deployment handle's call; no admission)."""
        return self.decide_now(request)

    def decide_now(self, request: DecideRequest) -> DecideResponse:
        """One slot's allocation for the request's view (see :class:`~serve.schemas.DecideRequest`)."""
        view = to_view(request.view, self.cfg.catalogue, self.cfg.cluster.default_placement, self.max_jobs)
        placement = request.view.placement or "own"  # the request's placer, or the scheduler's own
        name = request.scheduler
        if name == "dl2":
            loaded = self.store.current  # read once: a swap during this decision does not touch it
            scheduler: Scheduler = loaded.scheduler
            version = loaded.version
        elif name in self.heuristics:
            # A fresh instance per request: the decision depends on this view (and its histories) only.
            scheduler, version = make_scheduler(name, self.cfg), f"heuristic:{name}"
        else:
            served = ["dl2", *self.heuristics]
            raise ViewError(("scheduler",), f"unknown scheduler {name!r}; served: {served}", name)
        scheduler = with_placement(scheduler, placement)
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
        self.metrics.decided(name, ms / 1e3)
        return DecideResponse(allocation=from_allocation(alloc), scheduler=name, policy_version=version,
                              decision_ms=ms)

    async def policy(self) -> PolicyInfo:
        """What is served now: version, where it came from, the config it fits."""
        cur = self.store.current
        return PolicyInfo(version=cur.version, source=cur.source, checkpoint=self.settings.checkpoint,
                          loaded_at=cur.loaded_at, reloads=self.store.reloads, failures=self.store.failures,
                          last_error=self.store.last_error, config=self.cfg.name,
                          arch=cur.scheduler.arch, window=self.cfg.policy.window, max_jobs=self.max_jobs,
                          job_types=list(self.cfg.catalogue.names), schedulers=["dl2", *self.heuristics],
                          placements={"dl2": own_placement(cur.scheduler), **self._own_placements},
                          overload=OverloadInfo.model_validate(self.admission.stats()))

    async def healthz(self) -> Health:
        return Health(status="ok", policy_version=self.store.current.version)

    async def prometheus(self) -> Response:
        """``GET /metrics``: the Prometheus text of this replica (:mod:`serve.metrics`)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    def _policy_numbers(self) -> tuple[str, str, int, int]:
        """The weights served now: version, source, reloads, failed reloads (for the metrics)."""
        cur = self.store.current
        return cur.version, cur.source, self.store.reloads, self.store.failures

    async def Decide(self, request, grpc_context=None):  # the gRPC method's name
        """The gRPC ``Decider/Decide`` call: a ``decide_pb2.DecideRequest`` → ``decide_pb2.DecideResponse``.

        Errors set the call's status code (Serve passes ``grpc_context``): INVALID_ARGUMENT with the
        field's path for a request the HTTP endpoint answers with 422, RESOURCE_EXHAUSTED when refused
        under overload (:mod:`serve.overload`). Without a context (a plain handle call) they raise.
        """
        from serve.grpc_messages import request_from_proto, response_to_proto
        from serve.proto import decide_pb2

        def work() -> tuple[str, str] | decide_pb2.DecideResponse:
            try:
                return response_to_proto(self.decide_now(request_from_proto(request)))
            except ValidationError as exc:
                return "INVALID_ARGUMENT", _first_error(exc)
            except ViewError as exc:
                return "INVALID_ARGUMENT", str(exc)

        out = await self.admitted(work)
        if out is None:
            return _grpc_status(grpc_context, decide_pb2.DecideResponse(), "RESOURCE_EXHAUSTED",
                                f"overloaded: no answer within {self.admission.bound_s * 1e3:g} ms; "
                                f"decide locally, retry after {self.admission.retry_after_s} s")
        if isinstance(out, tuple):
            return _grpc_status(grpc_context, decide_pb2.DecideResponse(), *out)
        return out

    async def admitted(self, work: Callable[[], T]) -> T | None:
        """``work()`` (the CPU part of a request: parse, convert, decide, serialise) on the decision thread,
        under admission control (:mod:`serve.overload`); None if refused (counted). The event loop waits
        without blocking, so it keeps reading and counting the requests that arrive meanwhile."""
        ticket = self.admission.arrive()
        if ticket is None:
            return None
        started = [0.0]

        def run() -> T | _Late:
            if ticket.late():
                return _LATE
            started[0] = time.perf_counter()
            return work()

        try:
            out = await asyncio.get_running_loop().run_in_executor(self._decider, run)
        except BaseException:
            ticket.done()
            raise
        if isinstance(out, _Late):
            self.admission.refuse_late(ticket)
            return None
        ticket.done(time.perf_counter() - started[0])
        return out

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
        self._decider.shutdown(wait=False)

    def __del__(self) -> None:  # Serve calls it when it stops the replica
        store = getattr(self, "store", None)
        if store is not None:
            store.close()


class _Late:
    """The marker a request found late on the decision thread returns."""


_LATE = _Late()


def _first_error(exc: ValidationError) -> str:
    """``view.jobs.3.job_type: Input should be …`` (the gRPC details of a schema error)."""
    e = exc.errors(include_url=False)[0]
    return f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}"


def _grpc_status(context, empty, code: str, details: str):
    """Set ``code`` (a ``grpc.StatusCode`` name) and ``details`` on Serve's gRPC context; ``empty``."""
    if context is None:
        raise (ViewError(("request",), details) if code == "INVALID_ARGUMENT" else RuntimeError(details))
    import grpc

    context.set_code(getattr(grpc.StatusCode, code))
    context.set_details(details)
    return empty


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
    422: {"description": "the body breaks the schema or is inconsistent; `detail[].loc` names the field"},
    503: {"description": "refused early: the replica is overloaded (decide locally; see Retry-After)",
          "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}},
}
_REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/DecideRequest"}}}}}


def _json_body(content_type: str | None) -> bool:
    """FastAPI's rule: no content type, ``application/json`` or ``application/*+json``."""
    if not content_type:
        return True
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def _schema_error(exc: ValidationError) -> JSONResponse:
    """A pydantic error of the body as FastAPI's 422 (``loc`` starts with ``"body"``)."""
    detail = [{"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"],
               # the raw body of a json_invalid error may not even be UTF-8: not echoed
               "input": None if isinstance(e.get("input"), bytes | bytearray) else e.get("input"),
               **({"ctx": {k: v if isinstance(v, int | float | str) else str(v) for k, v in e["ctx"].items()}}
                  if "ctx" in e else {})} for e in exc.errors(include_url=False)]
    return JSONResponse(status_code=422, content=jsonable_encoder({"detail": detail}))


def _busy(admission: Admission) -> JSONResponse:
    return JSONResponse(status_code=503, headers={"Retry-After": str(admission.retry_after_s)}, content={
        "detail": f"overloaded: no answer within {admission.bound_s * 1e3:g} ms; decide locally, "
                  f"retry after {admission.retry_after_s} s"})


def decide_route(service: DecisionService) -> Callable:
    """``POST /v1/decide`` of ``service``: admission, then the raw body parsed once, decided, answered."""

    async def decide(request: Request) -> Response:
        if not _json_body(request.headers.get("content-type")):
            return _validation_error((), "request body must be application/json", None)
        body = await request.body()

        def work() -> Response:
            try:
                req = DecideRequest.model_validate_json(body)
            except ValidationError as exc:
                return _schema_error(exc)
            return Response(service.decide_now(req).model_dump_json(), media_type="application/json")

        out = await service.admitted(work)
        return _busy(service.admission) if out is None else out

    decide.__doc__ = DecisionService.decide_now.__doc__
    return decide


def _attach_decide(app: FastAPI) -> Callable:
    return app.post("/v1/decide", response_model=DecideResponse, responses=_ERRORS,
                    openapi_extra=_REQUEST_BODY, summary="Allocate workers and PS for one slot")


ENDPOINTS: dict[str, Callable[[FastAPI], Callable]] = {
    "decide": _attach_decide,
    "policy": lambda app: app.get("/v1/policy", response_model=PolicyInfo, summary="The served policy"),
    "healthz": lambda app: app.get("/healthz", response_model=Health, summary="Liveness and policy version"),
    "prometheus": lambda app: app.get("/metrics", include_in_schema=False),
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


def _with_request_schemas(app: FastAPI) -> FastAPI:
    """Put :class:`DecideRequest` and the models it nests into the OpenAPI components (the decide route
    reads its body itself, so FastAPI does not see them)."""
    build_doc = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build_doc()  # FastAPI keeps it as app.openapi_schema: the components added below stay
        schema = DecideRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, sub in {**schema.pop("$defs", {}), "DecideRequest": schema}.items():
            components.setdefault(name, sub)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def plain_app(service: DecisionService) -> FastAPI:
    """``service``'s routes on a FastAPI app for plain uvicorn (or an in-process test client)."""
    app = fastapi_app(service.settings.max_body_bytes)
    for name, route in ENDPOINTS.items():
        route(app)(decide_route(service) if name == "decide" else getattr(service, name))
    app.add_middleware(RequestTimer, metrics=service.metrics)  # outermost: 413s and 503s are timed too
    return _with_request_schemas(app)


# -- Ray Serve ----------------------------------------------------------------------------------------

DEPLOYMENT_DEFAULTS: dict[str, Any] = {
    "name": "DL2Decider",
    "num_replicas": 1,
    # The decision is CPU-bound: one at a time on the replica's decision thread. Two requests in the
    # replica (one deciding, one parsed and ready), two more waiting in Serve; beyond that Serve answers
    # 503 + Retry-After (gRPC: RESOURCE_EXHAUSTED) at once, on its cheapest path (before user code), and
    # the replica's admission control (serve.overload) refuses what would still wait past its bound.
    # Measured at 300 req/s offered (docs/BENCHMARKS.md): 100/20 answered 509 requests 200 in 10 s with
    # the latest answer at 235 ms; 4/4: 921, 140 ms; 2/2: 1023, 131 ms.
    "max_ongoing_requests": 2,
    "max_queued_requests": 2,
    "backpressure_config": {"status_code": 503, "retry_after_s": 1},
    # One BLAS thread: a replica decides one request at a time on one core; numpy's OpenBLAS would
    # otherwise start a thread per core and spin them against the replica's own event loop (measured:
    # 220 of 1000 requests refused at 100 req/s with the pool, 24 without; docs/BENCHMARKS.md).
    "ray_actor_options": {"num_cpus": 1,
                          "runtime_env": {"env_vars": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}}},
    "health_check_period_s": 10,
    # No access-log line per request (a logging call on the replica's path at every request; /metrics
    # counts the requests, their status and latency instead).
    "logging_config": {"enable_access_log": False},
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


def validated(settings: ServeSettings | dict[str, Any] | None) -> dict[str, Any]:
    """``settings`` checked against :class:`ServeSettings`, as the plain dict a replica is built from."""
    if isinstance(settings, ServeSettings):
        return settings.model_dump()
    return ServeSettings.model_validate(settings or {}).model_dump()


def build(args: dict[str, Any]):
    """Serve application builder (``import_path: serve.app:build``); ``args`` are :class:`ServeSettings`."""
    return deployment().bind(validated(args))
