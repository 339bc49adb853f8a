"""Members of elastic MXNet jobs as Ray actors: :class:`RaySpawner` implements elastic_mxnet's ``Spawner``.

Each PS and each worker is one Ray actor (:class:`MemberImpl`) that runs the
member in its own process — ``elastic_mxnet.server`` for a PS, the
``elastic_mxnet.demo_train`` loop for a worker — with the job's per-task
demand as its Ray resources (``num_cpus``, ``num_gpus``, ``memory``) and, when
a node is given, pinned to that node (hard node affinity). The coordinator
calls :meth:`RaySpawner.spawn` for the members it needs (initial members,
scale-ups, PS replacements); the caller names the nodes of the next ones with
:meth:`RaySpawner.prefer`.

The spawner belongs to the job's host actor (:mod:`clusters.ray.job`), so the
member actors are owned by it: they live and die with the job, never with the
cluster agent (an agent restart leaves them running).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clusters.runtime import actor_class
from dl2ray.jobspec import TaskDemand

log = logging.getLogger(__name__)

GIB = 1 << 30
MEMBER_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
"""Thread settings of every member process: one core's worth of threads (tasks declare fractional cores)."""


class MemberImpl:
    """One PS or worker process of one job; :meth:`run` blocks until the member ends (its exit code)."""

    def __init__(self, role: str, coordinator: str, worker_args: list[str]) -> None:
        os.environ.update(MEMBER_ENV)  # before MXNet is imported (run() imports it)
        os.environ["ELASTIC_MXNET_COORDINATOR"] = coordinator
        self.role, self.coordinator, self.worker_args = role, coordinator, list(worker_args)

    def info(self) -> tuple[int, str]:
        """``(pid, Ray node id)`` of this member's process."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self) -> int:
        if self.role == "ps":
            from elastic_mxnet.server import main as ps_main

            return ps_main(["--coordinator", self.coordinator])
        from elastic_mxnet.demo_train import main as train_main

        return train_main(self.worker_args)


Member = actor_class(MemberImpl, max_restarts=0, max_concurrency=2)
"""The actor class: ``run`` blocks one thread; ``info`` answers on the other."""


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
    pid: int | None = None
    node: str | None = None
    exit_code: int | None = None


@dataclass
class RaySpawner:
    """Starts members of one job as Ray actors (the ``elastic_mxnet.spawner.Spawner`` protocol).

    ``worker_args``: the worker's ``demo_train`` arguments; ``worker``/``ps``: per-task demand.
    ``prefer(role, nodes)`` queues the Ray node ids the next ``spawn`` calls of ``role`` use.
    """

    job: str
    worker_args: list[str]
    worker: TaskDemand
    ps: TaskDemand
    members: dict[str, MemberRecord] = field(default_factory=dict)
    preferred: dict[str, deque[str]] = field(default_factory=lambda: {"ps": deque(), "worker": deque()})
    seq: int = 0

    def prefer(self, role: str, nodes: list[str]) -> None:
        self.preferred[role] = deque(nodes)

    def spawn(self, role: str, coordinator: str) -> None:
        node = self.preferred[role].popleft() if self.preferred[role] else None
        self.start(role, coordinator, node)

    def start(self, role: str, coordinator: str, node: str | None) -> MemberRecord:
        """Create one member actor of ``role`` (pinned to ``node`` when given) and start it."""
        demand = self.ps if role == "ps" else self.worker
        name = f"{self.job}-{role}-{self.seq}"
        self.seq += 1
        opts: dict[str, Any] = {"num_cpus": demand.cpu, "num_gpus": demand.gpu,
                                "memory": max(int(demand.mem * GIB), 0) or None, "name": None}
        if node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        handle = Member.options(**{k: v for k, v in opts.items() if v is not None}).remote(
            role, coordinator, self.worker_args)
        rec = MemberRecord(name, role, handle, handle.run.remote(), handle.info.remote(), node, time.time())
        self.members[name] = rec
        log.info("job %s: started %s on node %s", self.job, name, node or "any")
        return rec

    def reap(self) -> list[MemberRecord]:
        """Update every member: learn pid/node of started ones, end and forget those whose run ended.

        A member whose process died (killed, crashed) is forgotten too; the
        coordinator notices it by its missing heartbeats. Returns the ended ones.
        """
        ended = []
        for name, rec in list(self.members.items()):
            if rec.pid is None:
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
                ray.kill(rec.handle)
                del self.members[name]
                ended.append(rec)
        return ended

    def stop(self, names: list[str]) -> None:
        """Kill these member actors now (spares that are no longer needed)."""
        for name in names:
            rec = self.members.pop(name, None)
            if rec is not None:
                ray.kill(rec.handle)

    def close(self, grace_s: float = 15.0) -> None:
        """End every member: wait up to ``grace_s`` for their ``run`` to return (a finished worker may
        still be writing its output), then kill what is left (as ``ProcessSpawner.close`` does)."""
        refs = [r.run_ref for r in self.members.values()]
        if refs and grace_s > 0:
            ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        self.stop(list(self.members))
