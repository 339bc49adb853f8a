"""``ServeScheduler``: a scheduler whose ``decide(view)`` asks a running decision endpoint.

``serve:URL`` wherever a scheduler is named (``dl2ray compare --schedulers
drf,serve:http://127.0.0.1:8000``, the cluster agents): the simulator and the
agents use the endpoint exactly like an in-process scheduler. ``URL`` is
``http://HOST:PORT`` (``POST /v1/decide`` with a JSON body) or
``grpc://HOST:PORT`` (the ``Decider/Decide`` call of ``serve/proto/decide.proto``).
The query string picks the scheduler the server runs (``?scheduler=drf``,
default ``dl2``) and the local fallback (``?fallback=NAME``, default ``drf``;
``none`` for no fallback). The core finds this module through the
``dl2ray.schedulers`` entry point (``pyproject.toml``), never by importing it.

**Overload.** An endpoint that is too busy to answer in time refuses at once
(HTTP 503 with ``Retry-After``, gRPC RESOURCE_EXHAUSTED). A refusal is not an
error: :meth:`ServeScheduler.decide` decides that view locally with the
fallback heuristic and counts it (``refusals``), and until ``Retry-After``
has passed it decides locally without asking. :meth:`ServeScheduler.decide_or_refuse`
raises :class:`~dl2ray.errors.Refused` instead, for a caller with its own
fallback (the live agent's guardrail counts it there).

The messages are :mod:`serve.schemas`, converted by :mod:`serve.convert` (and
:mod:`serve.grpc.messages` for gRPC). Observations (job histories) are sent
unless the server's scheduler is ``dl2``, whose state does not read them.
"""

from __future__ import annotations

import time
from typing import Protocol
from urllib.parse import parse_qs, urlsplit, urlunsplit

from dl2ray.errors import Refused, UserError
from dl2ray.view import Allocation, ClusterView
from serve.convert import from_view, to_allocation
from serve.schemas import DecideRequest, DecideResponse

DEFAULT_FALLBACK = "drf"


class ServeError(RuntimeError):
    """The endpoint refused a view as invalid or could not be reached; the message is the server's."""


class Transport(Protocol):
    url: str

    def decide(self, req: DecideRequest) -> DecideResponse:
        """The endpoint's answer; :class:`Refused` when overloaded, :class:`ServeError` otherwise."""
        ...

    def policy(self) -> dict | None:
        """``GET /v1/policy`` (None where the protocol has none); :class:`UserError` if unreachable."""
        ...

    def close(self) -> None: ...


class HTTPTransport:
    """``POST URL/v1/decide`` on one kept-alive connection (``requests``)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        import requests

        self.url, self.timeout_s = url, timeout_s
        self._session = requests.Session()

    def decide(self, req: DecideRequest) -> DecideResponse:
        import requests

        try:
            r = self._session.post(f"{self.url}/v1/decide", data=req.model_dump_json(exclude_none=True),
                                   timeout=self.timeout_s, headers={"content-type": "application/json"})
        except requests.RequestException as exc:
            raise ServeError(f"{self.url}/v1/decide: {type(exc).__name__}: {exc}") from None
        if r.status_code == 503:
            raise Refused(f"{self.url}/v1/decide answered 503: {r.text[:200]}",
                          _seconds(r.headers.get("retry-after")))
        if r.status_code != 200:
            raise ServeError(f"{self.url}/v1/decide answered {r.status_code}: {r.text[:500]}")
        return DecideResponse.model_validate_json(r.content)

    def policy(self) -> dict | None:
        import requests

        try:
            r = self._session.get(f"{self.url}/v1/policy", timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise UserError(f"serve:{self.url}: cannot reach the endpoint ({type(exc).__name__})") from None
        if r.status_code != 200:
            raise UserError(f"serve:{self.url}/v1/policy answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def close(self) -> None:
        self._session.close()


class GRPCTransport:
    """The ``Decider/Decide`` call on one channel to ``HOST:PORT``."""

    def __init__(self, url: str, timeout_s: float, application: str | None = None) -> None:
        import grpc

        from serve.proto import decide_pb2_grpc

        self.url, self.timeout_s = url, timeout_s
        self._grpc = grpc
        self._channel = grpc.insecure_channel(urlsplit(url).netloc)
        self._stub = decide_pb2_grpc.DeciderStub(self._channel)
        self._metadata = (("application", application),) if application else ()

    def decide(self, req: DecideRequest) -> DecideResponse:
        from serve.grpc.messages import request_to_proto, response_from_proto

        try:
            out = self._stub.Decide(request_to_proto(req), timeout=self.timeout_s, metadata=self._metadata)
        except self._grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
            if code == self._grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise Refused(f"{self.url}: RESOURCE_EXHAUSTED: {details}", 1.0) from None
            raise ServeError(f"{self.url} Decide: {code.name}: {details}") from None
        return response_from_proto(out)

    def policy(self) -> dict | None:
        try:
            self._grpc.channel_ready_future(self._channel).result(timeout=self.timeout_s)
        except self._grpc.FutureTimeoutError:
            raise UserError(f"serve:{self.url}: cannot reach the endpoint") from None
        return None

    def close(self) -> None:
        self._channel.close()


def _seconds(value: str | None) -> float:
    """A ``Retry-After`` in seconds (the HTTP-date form, or none, counts as 1 s)."""
    try:
        return max(float(value), 0.0) if value is not None else 1.0
    except ValueError:
        return 1.0


class ServeScheduler:
    """``decide(view)`` by the endpoint at ``url`` (module docstring).

    ``last_version`` is the policy version that decided the latest view (None when it was decided
    locally); ``refusals`` counts the views the fallback decided because the endpoint refused them.
    ``placement``: its own placement, the served scheduler's (``PolicyInfo.placements``; None over gRPC,
    where the registry's fallback applies); the view's placement goes with every request and the
    endpoint decides under it.
    """

    name = "serve"
    placement: str | None = None

    def __init__(self, url: str, scheduler: str = "dl2", timeout_s: float = 30.0, fallback=None,
                 clock=time.monotonic) -> None:
        self.url, self.scheduler, self.timeout_s = url.rstrip("/"), scheduler, timeout_s
        self.fallback = fallback
        self._transport: Transport | None = None
        self.last_version: str | None = None
        self.refusals = 0
        self._clock, self._refused_until = clock, float("-inf")

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            grpc = urlsplit(self.url).scheme == "grpc"
            self._transport = (GRPCTransport(self.url, self.timeout_s) if grpc
                               else HTTPTransport(self.url, self.timeout_s))
        return self._transport

    @classmethod
    def from_spec(cls, arg: str | None) -> tuple[ServeScheduler, str | None]:
        """From the part after ``serve:`` (``http|grpc://HOST:PORT[?scheduler=NAME&fallback=NAME]``): the
        scheduler and the fallback's name (None: no fallback)."""
        if not arg:
            raise UserError("serve needs the endpoint's URL: serve:http://127.0.0.1:8000")
        parts = urlsplit(arg)
        if parts.scheme not in ("http", "https", "grpc") or not parts.netloc:
            raise UserError(f"serve:{arg}: not an http(s):// or grpc:// URL (e.g. serve:http://127.0.0.1:8000)")
        query = parse_qs(parts.query)
        unknown = sorted(set(query) - {"scheduler", "fallback"})
        if unknown:
            raise UserError(f"serve:{arg}: unknown query parameter(s) {unknown}; "
                            "only ?scheduler=NAME&fallback=NAME")
        scheduler = query.get("scheduler", ["dl2"])[-1]
        fallback = query.get("fallback", [DEFAULT_FALLBACK])[-1]
        url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return cls(url, scheduler), None if fallback == "none" else fallback

    def reset(self, seed: int) -> None:
        """Nothing to reset: the server decides each view from the view alone."""

    def check(self) -> dict | None:
        """What the endpoint serves (``GET /v1/policy``; None over gRPC); :class:`UserError` if unreachable"""
        return self.transport.policy()

    def request(self, view: ClusterView) -> DecideRequest:
        # the DL2 policies read only the last observation that trained; heuristics may read them all
        return DecideRequest(view=from_view(view, history="recent" if self.scheduler == "dl2" else True),
                             scheduler=self.scheduler)

    def body(self, view: ClusterView) -> bytes:
        """The JSON request body for ``view``."""
        return self.request(view).model_dump_json(exclude_none=True).encode()

    def decide_or_refuse(self, view: ClusterView) -> Allocation:
        """The endpoint's allocation; :class:`Refused` if it refused (now, or less than Retry-After ago)."""
        if self._clock() < self._refused_until:
            raise Refused(f"{self.url} refused recently; not asking again before Retry-After",
                          self._refused_until - self._clock())
        try:
            resp = self.transport.decide(self.request(view))
        except Refused as exc:
            self._refused_until = self._clock() + exc.retry_after_s
            raise
        self.last_version = resp.policy_version
        return to_allocation(resp.allocation)

    def decide(self, view: ClusterView) -> Allocation:
        try:
            return self.decide_or_refuse(view)
        except Refused:
            if self.fallback is None:
                raise
            self.refusals += 1
            self.last_version = None
            return self.fallback.decide(view)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def serve_scheduler(arg: str | None, cfg: object) -> ServeScheduler:
    """The ``dl2ray.schedulers`` entry point ``serve``: ``serve:URL`` → a checked :class:`ServeScheduler`."""
    from dl2ray.schedulers.base import make_scheduler

    sched, fallback = ServeScheduler.from_spec(arg)
    if fallback is not None:
        if fallback.startswith("serve:"):
            raise UserError(f"serve:{arg}: the fallback decides locally; {fallback!r} is another endpoint")
        sched.fallback = make_scheduler(fallback, cfg)
    info = sched.check()
    if info is None:  # gRPC: reachable; what it serves is checked on the first answer
        return sched
    # its own placement is the one the served scheduler decides under (the server's PolicyInfo)
    sched.placement = (info.get("placements") or {}).get(sched.scheduler)
    name = getattr(cfg, "name", None)
    if name is not None and info.get("config") not in (None, name):
        raise UserError(f"serve:{sched.url} serves config {info.get('config')!r}, not {name!r}: "
                        "its catalogue and cluster may differ from this run's")
    if sched.scheduler not in info.get("schedulers", [sched.scheduler]):
        raise UserError(f"serve:{arg}: the endpoint does not serve {sched.scheduler!r}; "
                        f"it serves {info.get('schedulers')}")
    return sched
