"""One member process of an elastic MXNet job as a Ray actor: idle (warm) until started, then PS or worker.

Every member actor is **named and detached** (``dl2ray-member-<12 hex>`` in the
``dl2ray`` namespace): it belongs to no other actor, so it outlives the job host
that started it (a restarted host re-adopts it, :meth:`clusters.ray.spawner.RaySpawner.adopt`)
and the warm pool that created it (:mod:`clusters.ray.pool`). Whoever ends a
member kills it by handle; ``cluster down`` kills every actor with the prefix
(:func:`end_members`).

A member is created either *cold* for a job (with the task's demand as its Ray
resources) and started at once, or *warm* by the pool (0 CPU, 0 GPU, no memory
reservation, MXNet imported in ``__init__``) and started later by the job that
takes it. :meth:`MemberImpl.start` runs the PS or worker loop in a thread of
the actor and returns; :meth:`MemberImpl.wait` blocks until it ended (its exit
code), so a host that restarts can wait on a member it did not start.
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import threading
from contextlib import suppress
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clusters.ray.messages import MemberActorInfo
from clusters.runtime import NAMESPACE, actor_class
from dl2ray.jobspec import TaskDemand

log = logging.getLogger(__name__)

GIB = 1 << 30
MEMBER_PREFIX = "dl2ray-member-"
MEMBER_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
"""Thread settings of every member process: one core's worth of threads (tasks declare fractional cores)."""


class MemberImpl:
    """One member process (module docstring). ``warm``: import MXNet and the member loops now."""

    def __init__(self, warm: bool = False) -> None:
        os.environ.update(MEMBER_ENV)  # before MXNet is imported
        self.warm = warm
        self.job: str | None = None
        self.role: str | None = None
        self.coordinator: str | None = None
        self.exit_code: int | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        if warm:
            for module in ("elastic_mxnet.server", "elastic_mxnet.demo_train"):
                importlib.import_module(module)  # imports MXNet: the cost a warm member saves its job

    def info(self) -> MemberActorInfo:
        """pid, Ray node id, the job and role it serves (None while idle), its coordinator, exit code."""
        return MemberActorInfo(pid=os.getpid(), node=ray.get_runtime_context().get_node_id(), job=self.job,
                               role=self.role, coordinator=self.coordinator, exit_code=self.exit_code,
                               warm=self.warm)

    def start(self, job: str, role: str, coordinator: str, worker_args: list[str]) -> tuple[int, str]:
        """Become ``role`` of ``job`` and run it in a thread (idempotent for the same job and role).

        Returns ``(pid, node id)``. Raises if the member already serves another job or role.
        """
        with self._lock:
            if self.job is not None:
                if (self.job, self.role) != (job, role):
                    raise RuntimeError(f"member already serves {self.job}/{self.role}")
                return os.getpid(), ray.get_runtime_context().get_node_id()
            self.job, self.role, self.coordinator = job, role, coordinator
            os.environ["ELASTIC_MXNET_COORDINATOR"] = coordinator
            args = list(worker_args)
            threading.Thread(target=self._run, args=(role, coordinator, args), name=f"member-{role}",
                             daemon=True).start()
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def _run(self, role: str, coordinator: str, worker_args: list[str]) -> None:
        code = 1
        try:
            if role == "ps":
                from elastic_mxnet.server import main as ps_main

                code = ps_main(["--coordinator", coordinator])
            else:
                from elastic_mxnet.demo_train import main as train_main

                code = train_main(worker_args)
        except SystemExit as exc:  # argparse errors
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            log.exception("member %s of %s failed", role, self.job)
            code = 1
        finally:
            self.exit_code = code
            self._done.set()

    def wait(self) -> int:
        """Block until the member's loop ended; its exit code."""
        self._done.wait()
        assert self.exit_code is not None
        return self.exit_code


Member = actor_class(MemberImpl, max_restarts=0, max_concurrency=4)
"""The actor class: ``wait`` blocks one thread; ``start`` and ``info`` answer on the others."""


def new_member_name() -> str:
    return MEMBER_PREFIX + secrets.token_hex(6)


def create_member(node: str | None, demand: TaskDemand | None, warm: bool) -> tuple[str, Any]:
    """Create a named, detached member actor; ``(name, handle)``.

    ``demand``: the task's (cpu, gpu, mem) as its Ray resources (None: a warm pool member, which reserves
    nothing). ``node``: a Ray node id it is pinned to (hard affinity), or None for anywhere.
    """
    name = new_member_name()
    opts: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "lifetime": "detached", "num_cpus": 0}
    if demand is not None:
        opts.update(num_cpus=demand.cpu, num_gpus=demand.gpu)
        if int(demand.mem * GIB) > 0:
            opts["memory"] = int(demand.mem * GIB)
    if node is not None:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return name, Member.options(**opts).remote(warm)


def member_handles() -> dict[str, Any]:
    """Name → handle of every member actor alive in the ``dl2ray`` namespace (working, idle or starting)."""
    out = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") == NAMESPACE and a["name"].startswith(MEMBER_PREFIX):
            with suppress(ValueError):  # ended between the listing and the lookup
                out[a["name"]] = ray.get_actor(a["name"], namespace=NAMESPACE)
    return out


def member_infos(handles: dict[str, Any], timeout_s: float = 30.0) -> dict[str, MemberActorInfo]:
    """``info()`` of these members, asked together; members that did not answer are left out."""
    refs = {name: h.info.remote() for name, h in handles.items()}
    if not refs:
        return {}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    out = {}
    for name, ref in refs.items():
        if ref in done:
            with suppress(ray.exceptions.RayError):
                out[name] = ray.get(ref)
    return out


def end_members() -> int:
    """Kill every member actor of the namespace (``cluster down``); how many were alive."""
    handles = member_handles()
    for h in handles.values():
        with suppress(ray.exceptions.RayError):
            ray.kill(h)
    return len(handles)
