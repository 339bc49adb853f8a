"""The decision endpoint's logic, with no HTTP, gRPC or Serve: :class:`DecisionCore`.

``decide(request)``, ``policy()``, ``healthz()`` on pydantic messages (:mod:`serve.schemas`). It owns the
config, the :class:`~serve.weights.PolicyStore` and the conversion calls (:mod:`serve.convert`). The
decision is ``decide(view)`` of a scheduler built by the core
(:class:`~dl2ray.schedulers.dl2.DL2Scheduler` for ``dl2``, :func:`~dl2ray.schedulers.base.make_scheduler`
for a heuristic): the same compiled loop ``dl2ray compare`` runs. :meth:`DecisionCore.admitted` runs a
request's CPU work on the one decision thread under admission control (:mod:`serve.overload`).
:class:`ServeSettings` are the endpoint's settings (``serve/config.yaml``'s ``args``). With ``noop``
the core answers every decide request with the first one's allocation: the request is read, admitted,
parsed and validated and the answer serialised as always, only the conversion and the decision are
skipped — Serve's own floor, which ``dl2ray bench serve`` measures beside the endpoint.
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

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.schedulers.base import Scheduler, make_scheduler, scheduler_names
from dl2ray.schedulers.placed import own_placement, with_placement
from serve.convert import ViewError, from_allocation, to_view
from serve.metrics import ServeMetrics
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
    noop: bool = Field(
        default=False,
        description="benchmark floor: answer every decide request, parsed and validated as usual, with the "
                    "first one's allocation, without converting or deciding (Serve's own cost; bench serve)")


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


class DecisionCore:
    """The endpoint's logic on pydantic messages (module docstring); ``close()`` stops the weight watcher.
    :class:`serve.app.DecisionService` adds the gRPC method and Serve's ASGI hook."""

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
        self._fixed: DecideResponse | None = None  # the no-op floor's one answer (settings.noop)

    # -- the endpoints (routes attached by serve.http.ENDPOINTS) -------------------------------------------

    async def decide(self, request: DecideRequest) -> DecideResponse:
        """One slot's allocation for the request's view (a deployment handle's call; no admission)."""
        return self.decide_now(request)

    def decide_now(self, request: DecideRequest) -> DecideResponse:
        """One slot's allocation for the request's view (see :class:`~serve.schemas.DecideRequest`); with
        ``noop`` settings, the first request's allocation for every request (module docstring)."""
        if self.settings.noop:
            if self._fixed is None:
                self._fixed = self._decide(request)
            return self._fixed
        return self._decide(request)

    def _decide(self, request: DecideRequest) -> DecideResponse:
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


def _store(cfg, s: ServeSettings) -> PolicyStore:
    ckpt = CheckpointFile(resolve(s.checkpoint)) if s.checkpoint else None
    if s.global_policy:
        pull = GlobalPolicyPull(s.global_policy, s.global_namespace)
        return PolicyStore(cfg, ckpt or pull, pull, s.reload_every_s)
    if ckpt is None:
        raise UserError("serve: give a policy checkpoint (checkpoint: / --checkpoint) "
                        "or a global_policy actor")
    return PolicyStore(cfg, ckpt, ckpt, s.reload_every_s)
