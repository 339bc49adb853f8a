"""The warm pool: a few idle, already started member processes per node, MXNet imported, for scale-ups.

:class:`WarmPoolImpl` is a named, detached, restartable actor (``dl2ray-pool``
in the ``dl2ray`` namespace) that keeps ``per_node`` idle member actors
(:mod:`clusters.ray.member`, created ``warm``) on every alive Ray node. A job's
spawner :meth:`~WarmPoolImpl.take` s one on the node the scheduler chose and
tells it its job and role; a thread of the pool refills the node in the
background (every ``refill_interval_s``). A member is handed out only once it
is ready (its ``__init__``, which imports MXNet, returned).

**Accounting.** A pooled member reserves nothing in Ray (0 CPU, 0 GPU, no
memory), so idle pool members never make a node look full — to Ray or to the
agent, whose view counts a node's capacity and every *job's* members at the
job's per-task demand (:mod:`clusters.ray.backend`). Once taken, the member's
demand is the job's and is accounted there; Ray's own free resources are not
what the agent schedules by. The cost of a pooled member is its memory (one
Python process with MXNet imported) and nothing while it waits.

The pool holds no state the cluster cannot tell it again: after a restart it
re-adopts the idle warm members alive in the namespace. ``cluster down`` ends it
(:func:`end_pool`) and every member actor with it.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import ray

from clusters.ray.member import create_member, member_handles, member_infos
from clusters.ray.spawner import POOL_NAME
from clusters.runtime import NAMESPACE, actor_class

log = logging.getLogger(__name__)


@dataclass
class Pooled:
    """One idle member of the pool: its actor, the node it is pinned to, and the ref of its readiness."""

    name: str
    handle: Any
    node: str
    ready_ref: Any
    created: float
    ready: bool = False


class WarmPoolImpl:
    """The pool (module docstring). ``per_node``: idle members kept per node; ``refill_interval_s``: how
    often the refill thread looks (seconds); ``start=False``: tests call :meth:`refill` themselves."""

    def __init__(self, per_node: int, refill_interval_s: float = 0.5, start: bool = True) -> None:
        self.per_node, self.refill_interval_s = per_node, refill_interval_s
        self.idle: dict[str, Pooled] = {}
        self.taken = 0
        self.created = 0
        self.ready_s: list[float] = []  # seconds from creation to ready, per member made here
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._adopt()
        self._thread = threading.Thread(target=self._loop, name="pool-refill", daemon=True)
        if start:
            self._thread.start()

    def _adopt(self) -> None:
        """Idle warm members alive in the namespace (a restarted pool finds the ones it had)."""
        handles = member_handles()
        for name, info in member_infos(handles).items():
            if info.warm and info.job is None:
                self.idle[name] = Pooled(name, handles[name], info.node, None, time.time(), ready=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.refill_interval_s):
            try:
                self.refill()
            except Exception:  # a failing refill is logged; the pool goes on
                log.exception("pool refill failed")

    def refill(self) -> dict[str, int]:
        """Mark ready members, drop dead ones, start members up to ``per_node`` on every alive node."""
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        with self._lock:
            for p in list(self.idle.values()):
                if p.ready or not ray.wait([p.ready_ref], timeout=0)[0]:
                    continue
                try:
                    ray.get(p.ready_ref)
                    p.ready = True
                    self.ready_s.append(time.time() - p.created)
                except ray.exceptions.RayError:
                    del self.idle[p.name]
            for p in list(self.idle.values()):
                if p.node not in nodes:
                    del self.idle[p.name]
            for node in nodes:
                have = sum(p.node == node for p in self.idle.values())
                for _ in range(self.per_node - have):
                    name, handle = create_member(node, None, warm=True)
                    self.idle[name] = Pooled(name, handle, node, handle.info.remote(), time.time())
                    self.created += 1
            return self._counts()

    def take(self, node: str | None) -> tuple[str, Any] | None:
        """An idle, ready member on ``node`` (any node when None), removed from the pool; None if none is
        ready there. The caller starts it (``start(job, role, ...)``) and owns it from now on."""
        with self._lock:
            for p in sorted(self.idle.values(), key=lambda p: p.created):
                if not p.ready and ray.wait([p.ready_ref], timeout=0)[0]:
                    with suppress(ray.exceptions.RayError):
                        ray.get(p.ready_ref)
                        p.ready = True
                        self.ready_s.append(time.time() - p.created)
                if p.ready and (node is None or p.node == node):
                    del self.idle[p.name]
                    self.taken += 1
                    return p.name, p.handle
        return None

    def _counts(self) -> dict[str, int]:
        return {"idle_ready": sum(p.ready for p in self.idle.values()),
                "idle_starting": sum(not p.ready for p in self.idle.values())}

    def stats(self) -> dict[str, Any]:
        """Idle members (ready / starting) in all and per node, members taken and created, start-up times."""
        with self._lock:
            per_node: dict[str, dict[str, int]] = {}
            for p in self.idle.values():
                row = per_node.setdefault(p.node, {"ready": 0, "starting": 0})
                row["ready" if p.ready else "starting"] += 1
            return {"per_node_target": self.per_node, **self._counts(), "nodes": per_node,
                    "taken": self.taken, "created": self.created, "ready_s": list(self.ready_s)}

    def stop(self) -> int:
        """Stop refilling and end every idle member; how many were ended."""
        self._stop.set()
        with self._lock:
            for p in self.idle.values():
                with suppress(ray.exceptions.RayError):
                    ray.kill(p.handle)
            n = len(self.idle)
            self.idle.clear()
        return n


WarmPool = actor_class(WarmPoolImpl, num_cpus=0, max_restarts=-1, max_concurrency=4)
"""The pool actor class; started named and detached by :func:`ensure_pool`."""


def ensure_pool(per_node: int, refill_interval_s: float = 0.5, name: str = POOL_NAME) -> Any | None:
    """The running pool, or a new one keeping ``per_node`` idle members per node (None when 0: no pool).
    Needs a connected Ray driver."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    if per_node <= 0:
        return None
    pool = WarmPool.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(
        per_node, refill_interval_s)
    ray.get(pool.stats.remote())
    return pool


def end_pool(name: str = POOL_NAME) -> None:
    """Stop the pool (its idle members end with it); nothing when none runs."""
    with suppress(ValueError):
        pool = ray.get_actor(name, namespace=NAMESPACE)
        with suppress(ray.exceptions.RayError):
            ray.get(pool.stop.remote(), timeout=30)
        ray.kill(pool, no_restart=True)


def pool_stats(name: str = POOL_NAME) -> dict[str, Any] | None:
    """The pool's :meth:`~WarmPoolImpl.stats` without start-up times (None: no pool, or restarting)."""
    try:
        st: Any = ray.get(ray.get_actor(name, namespace=NAMESPACE).stats.remote(), timeout=10)
    except (ValueError, ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return None
    return {k: v for k, v in st.items() if k != "ready_s"}
