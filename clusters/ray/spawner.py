"""Members of elastic MXNet jobs as Ray actors: :class:`RaySpawner` implements elastic_mxnet's ``Spawner``.

Each PS and each worker is one member actor (:mod:`clusters.ray.member`) that
runs the member in its own process — ``elastic_mxnet.server`` for a PS, the
``elastic_mxnet.demo_train`` loop for a worker. The coordinator calls
:meth:`RaySpawner.spawn` for the members it needs (initial members, scale-ups,
PS replacements); the caller names the nodes of the next ones with
:meth:`RaySpawner.prefer`.

Where a member comes from:

* **warm** (the default for CPU-only tasks when the cluster runs a warm pool,
  :mod:`clusters.ray.pool`): an idle member already started on the wanted node
  with MXNet imported is taken from the pool and told its job, so a scale-up
  costs the coordinator's protocol, not a process start. A pooled actor
  reserves no Ray resources; the task's demand is accounted by the job (the
  backend counts every member of a job at the job's per-task demand in the view
  and in placement), never by Ray's free resources;
* **cold** (no pool, a GPU task, or no idle member on that node): a new actor
  with the job's per-task demand as its Ray resources (``num_cpus``,
  ``num_gpus``, ``memory``), pinned to the node by hard node affinity.

Members are named, detached actors: they outlive a restart of the job's host,
which re-adopts them with :meth:`RaySpawner.adopt`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import ray

from clusters.ray.member import create_member, member_handles, member_infos
from clusters.runtime import NAMESPACE
from dl2ray.jobspec import TaskDemand

log = logging.getLogger(__name__)

POOL_NAME = "dl2ray-pool"
"""The warm pool actor of the cluster (:mod:`clusters.ray.pool`), found by name."""


@dataclass
class MemberRecord:
    """One member actor as its job knows it. ``pid``/``node`` are None until the actor started."""

    name: str
    role: str
    handle: Any
    run_ref: Any
    info_ref: Any
    wanted_node: str | None
    started_at: float
    warm: bool = False
    pid: int | None = None
    node: str | None = None
    exit_code: int | None = None


@dataclass
class RaySpawner:
    """Starts members of one job as Ray actors (the ``elastic_mxnet.coordination.spawner.Spawner`` protocol).

    ``worker_args``: the worker's ``demo_train`` arguments; ``worker``/``ps``: per-task demand;
    ``pool``: name of the warm pool actor to take members from (None: always cold).
    ``prefer(role, nodes)`` queues the Ray node ids the next ``spawn`` calls of ``role`` use.
    """

    job: str
    worker_args: list[str]
    worker: TaskDemand
    ps: TaskDemand
    pool: str | None = POOL_NAME
    members: dict[str, MemberRecord] = field(default_factory=dict)
    preferred: dict[str, deque[str]] = field(default_factory=lambda: {"ps": deque(), "worker": deque()})
    seq: int = 0
    warm_taken: int = 0

    def prefer(self, role: str, nodes: list[str]) -> None:
        self.preferred[role] = deque(nodes)

    def spawn(self, role: str, coordinator: str) -> None:
        node = self.preferred[role].popleft() if self.preferred[role] else None
        self.start(role, coordinator, node)

    def start(self, role: str, coordinator: str, node: str | None) -> MemberRecord:
        """One member of ``role`` on ``node`` (any node when None), warm from the pool when it has one."""
        demand = self.ps if role == "ps" else self.worker
        taken = self._take_warm(node) if demand.gpu == 0 else None
        warm = taken is not None
        name, handle = taken if taken is not None else create_member(node, demand, warm=False)
        self.seq += 1
        self.warm_taken += warm
        info_ref = handle.start.remote(self.job, role, coordinator, self.worker_args)
        rec = MemberRecord(name, role, handle, handle.wait.remote(), info_ref, node, time.time(), warm)
        self.members[name] = rec
        log.info("job %s: %s %s (%s) on node %s", self.job, role, name, "warm" if warm else "cold",
                 node or "any")
        return rec

    def _take_warm(self, node: str | None) -> tuple[str, Any] | None:
        """An idle pooled member on ``node`` (any node when None), or None (no pool, none idle there)."""
        if self.pool is None:
            return None
        try:
            pool = ray.get_actor(self.pool, namespace=NAMESPACE)
            taken: Any = ray.get(pool.take.remote(node), timeout=10)
        except (ValueError, ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return None
        return None if taken is None else (str(taken[0]), taken[1])

    def adopt(self) -> str | None:
        """Take back the members of this job that are alive (after a restart of the host); the coordinator
        address they serve (None: none alive). Members whose loop already ended are adopted too (their
        exit code is read by the next :meth:`reap`)."""
        infos = member_infos(handles := member_handles())
        address = None
        for name, info in sorted(infos.items()):
            if info.job != self.job:
                continue
            handle = handles[name]
            assert info.role is not None  # it serves this job
            rec = MemberRecord(name, info.role, handle, handle.wait.remote(), None, info.node, time.time(),
                               info.warm, info.pid, info.node)
            self.members[name] = rec
            address = address or info.coordinator
        self.seq = len(self.members)
        return address

    def reap(self) -> list[MemberRecord]:
        """Update every member: learn pid/node of started ones, end and forget those whose run ended.

        A member whose process died (killed, crashed) is forgotten too; the
        coordinator notices it by its missing heartbeats. Returns the ended ones.
        """
        ended = []
        for name, rec in list(self.members.items()):
            if rec.pid is None and rec.info_ref is not None:
                ready, _ = ray.wait([rec.info_ref], timeout=0)
                if ready:
                    try:
                        rec.pid, rec.node = ray.get(rec.info_ref)
                    except ray.exceptions.RayError:
                        rec.exit_code = -1
            ready, _ = ray.wait([rec.run_ref], timeout=0)
            if ready or rec.exit_code is not None:
                try:
                    rec.exit_code = ray.get(rec.run_ref) if ready else rec.exit_code
                except ray.exceptions.RayError as exc:
                    log.warning("job %s: member %s died: %s", self.job, name, type(exc).__name__)
                    rec.exit_code = -1
                _kill(rec.handle)
                del self.members[name]
                ended.append(rec)
        return ended

    def stop(self, names: list[str]) -> None:
        """Kill these member actors now (spares that are no longer needed)."""
        for name in names:
            rec = self.members.pop(name, None)
            if rec is not None:
                _kill(rec.handle)

    def await_runs(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for every member's ``run`` to return (a finished worker may still be
        writing its output); changes nothing, so a caller may do it without its lock."""
        refs = [r.run_ref for r in list(self.members.values())]
        if refs and grace_s > 0:
            ray.wait(refs, num_returns=len(refs), timeout=grace_s)

    def close(self, grace_s: float = 15.0) -> None:
        """End every member: :meth:`await_runs` for ``grace_s``, then kill what is left (as
        ``ProcessSpawner.close`` does)."""
        self.await_runs(grace_s)
        self.stop(list(self.members))


def _kill(handle: Any) -> None:
    with suppress(ray.exceptions.RayError):
        ray.kill(handle)
