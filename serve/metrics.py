"""The decision endpoint's Prometheus metrics (``GET /metrics`` of the app; one registry per service).

* ``dl2ray_serve_request_seconds{route, code}``: each HTTP request's time in the app, arrival to the
  last byte of the answer (413s and 503s included), by route (an unknown path is ``other``) and status;
* ``dl2ray_serve_decisions_total{scheduler}`` and ``dl2ray_serve_decision_seconds``: decisions made and
  the scheduler's time for each (the response's ``decision_ms``);
* read when scraped: ``dl2ray_serve_overload_*`` (:mod:`serve.overload`: admitted, refused on arrival,
  refused late, held now), ``dl2ray_serve_policy_info{version, source}`` (1 for the weights served now),
  ``dl2ray_serve_policy_reloads_total`` and ``dl2ray_serve_policy_reload_failures_total``.

With several Serve replicas each has its own numbers; a scrape through Serve's proxy reaches one of
them (scrape the replicas, or run one, to see them all). :class:`RequestTimer` is pure ASGI (no
``BaseHTTPMiddleware`` and its extra task per request): the decision path's latency is what it measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds: a decision takes milliseconds; refusals come back at once."""
ROUTES = ("/v1/decide", "/v1/policy", "/healthz", "/metrics", "/docs", "/openapi.json")

METRIC_NAMES = (
    "dl2ray_serve_request_seconds", "dl2ray_serve_decisions_total", "dl2ray_serve_decision_seconds",
    "dl2ray_serve_overload_admitted_total", "dl2ray_serve_overload_refused_total",
    "dl2ray_serve_overload_held", "dl2ray_serve_policy_info", "dl2ray_serve_policy_reloads_total",
    "dl2ray_serve_policy_reload_failures_total",
)


class ServiceCollector(Collector):
    """Scrape-time numbers of a service: admission counts and the policy served (module docstring)."""

    def __init__(self, overload: Callable[[], dict[str, Any]],
                 policy: Callable[[], tuple[str, str, int, int]]) -> None:
        self.overload, self.policy = overload, policy

    def collect(self) -> Iterator[Any]:
        o = self.overload()
        yield CounterMetricFamily("dl2ray_serve_overload_admitted",
                                  "Requests admitted to the decision thread", value=o["admitted"])
        refused = CounterMetricFamily("dl2ray_serve_overload_refused",
                                      "Requests refused under overload (503, RESOURCE_EXHAUSTED), by when",
                                      labels=["when"])
        refused.add_metric(["arrival"], o["refused_arrival"])
        refused.add_metric(["late"], o["refused_late"])
        yield refused
        yield GaugeMetricFamily("dl2ray_serve_overload_held", "Requests the replica holds now",
                                value=o["held"])
        version, source, reloads, failures = self.policy()
        info = GaugeMetricFamily("dl2ray_serve_policy_info", "The weights served now (value 1)",
                                 labels=["version", "source"])
        info.add_metric([version, source], 1.0)
        yield info
        yield CounterMetricFamily("dl2ray_serve_policy_reloads", "Weights swapped in since start",
                                  value=reloads)
        yield CounterMetricFamily("dl2ray_serve_policy_reload_failures", "Weight reloads that failed",
                                  value=failures)


class ServeMetrics:
    """One service's registry: the request and decision instruments and the service's collector."""

    def __init__(self, overload: Callable[[], dict[str, Any]],
                 policy: Callable[[], tuple[str, str, int, int]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Histogram("dl2ray_serve_request_seconds",
                                  "HTTP request time in the app, by route and code", ["route", "code"],
                                  buckets=REQUEST_BUCKETS, registry=self.registry)
        self.decisions = Counter("dl2ray_serve_decisions", "Decisions made, by scheduler", ["scheduler"],
                                 registry=self.registry)
        self.decision_seconds = Histogram("dl2ray_serve_decision_seconds",
                                          "The scheduler's time per decision", buckets=REQUEST_BUCKETS,
                                          registry=self.registry)
        self.requests.labels("/v1/decide", "200")
        self.registry.register(ServiceCollector(overload, policy))

    def decided(self, scheduler: str, seconds: float) -> None:
        self.decisions.labels(scheduler).inc()
        self.decision_seconds.observe(seconds)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """ASGI middleware: every HTTP request's time and status into ``metrics.requests``."""

    def __init__(self, app, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, code = time.perf_counter(), ["500"]

        async def timed(message) -> None:
            if message["type"] == "http.response.start":
                code[0] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            path = scope.get("path", "")
            route = path if path in ROUTES else "other"
            self.metrics.requests.labels(route, code[0]).observe(time.perf_counter() - t0)
