"""The Ray process a ``clusters`` command or actor runs in: starting, joining and recognising it.

Nothing here knows a backend, a job or a policy; every layer of ``clusters``
may use it. Ray is imported inside the functions (importing this module
imports no Ray), and the environment Ray reads at its own import is set first
(:func:`ray_env`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dl2ray.errors import UserError

NAMESPACE = "dl2ray"
"""The Ray namespace of every named actor of the project: agents, job hosts, GlobalPolicies, federations."""

INLINE_BYTES = 4 << 20
"""Objects up to this size travel inside the actor call itself, not through the shared-memory object store.

A push carries one flat gradient and its reply the weights (0.8 MB each for the
testbed networks); through the object store each costs a few IPC round trips
with the raylet, which on a busy 2-core machine waits for a core (see
docs/BENCHMARKS.md, A3C).
"""


def ray_env() -> None:
    """Environment a Ray driver here needs, set before Ray is first imported (it reads it at import):
    the node on loopback, no usage stats."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def start_ray(cpus: int) -> bool:
    """A local Ray instance with ``cpus`` CPUs on loopback, unless one is running; True if started here."""
    ray_env()
    import ray

    if ray.is_initialized():
        return False
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             _system_config={"max_direct_call_object_size": INLINE_BYTES})
    return True


@contextmanager
def ray_session(cpus: int) -> Iterator[None]:
    """A local Ray instance with ``cpus`` CPUs (at least the machine's) for the block, so that several runs
    in a row (Fig. 18's A3C and federation runs) do not each start and stop their own; one already running
    is kept and left running."""
    started = start_ray(max(cpus, os.cpu_count() or 1))
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()


def connect(address: str | None, namespace: str | None = None) -> Any:
    """A driver on the Ray cluster at ``address`` (None: ``RAY_ADDRESS``); this process's own when it is
    connected already (tests, scripts). UserError when nothing answers there. Returns the ``ray`` module."""
    ray_env()
    import ray

    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError) as exc:
        raise UserError(
            f"cannot connect to Ray at {address or os.environ.get('RAY_ADDRESS')}: {exc}") from None
    return ray


@contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """A Ray driver connected to the cluster for the duration of a command (left connected if it was)."""
    ray_env()
    import ray

    owned = not ray.is_initialized()
    driver = connect(address)
    try:
        yield driver
    finally:
        if owned:
            ray.shutdown()


def incarnation() -> int:
    """1 if the current actor is a Ray restart, else 0 (also 0 outside an actor)."""
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return 0  # outside an actor (unit use of the plain classes)
    return int(bool(ray.get_runtime_context().was_current_actor_reconstructed))


def actor_class(cls: type, **options: Any) -> Any:
    """``ray.remote(**options)(cls)``: the Ray actor class of ``cls``, typed ``Any`` on purpose.

    Ray's type stubs give an actor handle the methods of ``cls`` itself, which
    have no ``.remote``, and their ``ray.remote`` overloads miss options such
    as ``max_concurrency``; every handle of the project is therefore ``Any``,
    and what a call returns is typed where it is ``ray.get``-ed.
    """
    import ray

    return ray.remote(**options)(cls)
