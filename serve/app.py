"""The Ray Serve application of the decision endpoint: the composition root (only here are config files,
checkpoints and Serve wired together; importing it starts nothing).

Four modules, each testable alone: :mod:`serve.service` (the logic, no HTTP), :mod:`serve.http` (routes,
errors, body limit, :func:`~serve.http.plain_app`), :mod:`serve.grpc.call` (the gRPC method) and this one:
:class:`DecisionService` — the service with its gRPC method (``Decide``) and Serve's ASGI hook, which
builds the replica's app with :func:`~serve.http.plain_app` — :func:`deployment` and the application
builder :func:`build` (``serve run serve/config.yaml``, ``dl2ray serve``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from serve.grpc.call import decide_call
from serve.http import plain_app
from serve.service import DecisionCore, ServeSettings

__all__ = ["DEPLOYMENT_DEFAULTS", "DecisionService", "ServeSettings", "build", "deployment", "plain_app",
           "validated"]


class DecisionService(DecisionCore):
    """:class:`~serve.service.DecisionCore` as Serve deploys it: the gRPC method and the ASGI hook."""

    async def Decide(self, request, grpc_context=None):  # the gRPC method's name
        """The gRPC ``Decider/Decide`` call (:func:`serve.grpc.call.decide_call`)."""
        return await decide_call(self, request, grpc_context)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve's hook, called on the replica after ``__init__``: this instance's HTTP app."""
        return plain_app(self)


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
