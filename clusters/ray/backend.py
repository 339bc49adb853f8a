"""The live Ray backend: a :class:`~dl2ray.view.ClusterView` from live state, an Allocation as scale calls.

Every job is a host actor (:mod:`clusters.ray.job`) named ``dl2ray-job-<name>``
in the ``dl2ray`` namespace; its PS and workers are member actors with the
job's per-task demand as Ray resources. The backend keeps nothing the cluster
cannot tell it again:

* :meth:`RayBackend.snapshot` lists the alive Ray nodes (capacity: ``CPU``,
  ``GPU``, ``memory`` in GB) and the job hosts, closes each job's observation
  of the previous slot (epochs trained, seconds, deployment) and returns the
  view: every arrived, unfinished job with its current members and their
  nodes. A paused job holds one PS (its parameters and optimizer state): that
  PS is subtracted from ``free`` and the job shows 0 workers and 0 PS.
* :meth:`RayBackend.apply` turns the allocation into per-job
  :meth:`~clusters.ray.job.JobHostImpl.scale_to` calls, deltas only:
  scale-downs and pauses first (they free resources), then scale-ups and
  resumes, each new member placed on the allocation's node for it when that
  node has room, else on the first node with room (running members never
  move); a job's increase that fits nowhere is cut to what fits. A job busy
  with an earlier operation is left for the next slot.

Job ids in the view are ``crc32(name)``: stable across agent restarts without
any stored counter. Slot ``k`` starts at ``epoch + k · slot_seconds``.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from clusters.ray.job import JOB_PREFIX, NAMESPACE, TERMINAL, JobHost, host_name
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, check_spec
from dl2ray.view import Allocation, ClusterView, JobView, Observation, Tasks
from dl2ray.workload import JobCatalogue

GB = float(1 << 30)


def job_id_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@dataclass
class Nodes:
    """Alive Ray nodes, sorted by id: ``capacity`` shape (N, 3) in (cpu, gpu, mem GB)."""

    ids: list[str]
    capacity: np.ndarray

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.ids)}


def ray_nodes() -> Nodes:
    alive = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
    cap = np.array([[n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0),
                     n["Resources"].get("memory", 0.0) / GB] for n in alive], dtype=np.float64)
    return Nodes([n["NodeID"] for n in alive], cap.reshape(-1, 3))


def list_hosts() -> dict[str, Any]:
    """Job name → host actor handle, for every job host alive in the ``dl2ray`` namespace."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE and a["name"].startswith(JOB_PREFIX)]
    out = {}
    for n in names:
        try:
            out[n[len(JOB_PREFIX):]] = ray.get_actor(n, namespace=NAMESPACE)
        except ValueError:
            continue  # killed between the listing and the lookup
    return out


@dataclass
class ScaleAction:
    """One job's change in one slot: from ``(ps, workers)`` to the target, and how it went."""

    job: str
    before: tuple[int, int]
    target: tuple[int, int]
    ok: bool | None = None
    reason: str = ""
    seconds: float = 0.0


@dataclass
class ApplyReport:
    slot: int
    actions: list[ScaleAction] = field(default_factory=list)
    skipped_busy: list[str] = field(default_factory=list)


class RayBackend:
    """The live backend (module docstring). Needs a connected Ray driver (or runs inside an actor)."""

    def __init__(self, catalogue: JobCatalogue, slot_seconds: float, epoch: float,
                 placement: str = "load_balancing", heartbeat_timeout_s: float = 5.0,
                 register_timeout_s: float = 60.0, apply_wait_s: float | None = None) -> None:
        self.catalogue, self.slot_seconds, self.epoch = catalogue, slot_seconds, epoch
        self.placement = placement
        self.heartbeat_timeout_s, self.register_timeout_s = heartbeat_timeout_s, register_timeout_s
        self.apply_wait_s = apply_wait_s if apply_wait_s is not None else max(slot_seconds, 1.0)
        self.last_status: dict[str, dict[str, Any]] = {}
        self._nodes: Nodes | None = None
        self._pending: dict[str, Any] = {}  # job → ref of a scale call still running

    # ---- the world ------------------------------------------------------------

    def slot_now(self) -> int:
        return max(math.floor((time.time() - self.epoch) / self.slot_seconds), 0)

    def hosts(self) -> dict[str, Any]:
        return list_hosts()

    def statuses(self, hosts: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        hosts = self.hosts() if hosts is None else hosts
        refs = {name: h.status.remote() for name, h in hosts.items()}
        out = {}
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=30)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                continue  # a host that died is no job any more
        return out

    # ---- submit / cancel -------------------------------------------------------

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """Register a job (refused with :class:`UserError` naming the field); returns its first status."""
        nodes = ray_nodes()
        check_spec(spec, self.catalogue.names, nodes.capacity)
        existing = self.hosts()
        if spec.name in existing:
            raise UserError(f"name: a job named {spec.name!r} already exists "
                            f"(dl2ray jobs status {spec.name})")
        host = JobHost.options(name=host_name(spec.name), namespace=NAMESPACE, lifetime="detached").remote(
            spec.model_dump_json(), job_id_of(spec.name), time.time(), self.heartbeat_timeout_s,
            self.register_timeout_s)
        return ray.get(host.status.remote())

    def cancel(self, name: str) -> dict[str, Any]:
        host = self.hosts().get(name)
        if host is None:
            raise UserError(f"no job named {name!r}")
        return ray.get(host.cancel.remote())

    def remove(self, name: str) -> None:
        """End a job's host actor (after cancel or finish): the job disappears from the cluster."""
        host = self.hosts().get(name)
        if host is not None:
            ray.get(host.cancel.remote())
            ray.kill(host)

    # ---- the slot ---------------------------------------------------------------

    def snapshot(self) -> ClusterView:
        slot = self.slot_now()
        nodes = ray_nodes()
        self._nodes = nodes
        hosts = self.hosts()
        refs = {name: h.slot_status.remote(slot) for name, h in hosts.items()}
        self.last_status = {}
        for name, ref in refs.items():
            try:
                self.last_status[name] = ray.get(ref, timeout=30)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                continue  # a host that died is no job any more
        index = nodes.index()
        free = nodes.capacity.copy()
        jobs = []
        for st in sorted(self.last_status.values(), key=lambda s: s["submitted_at"]):
            if st["state"] in TERMINAL:
                continue
            spec = JobSpec.model_validate(st["spec"])
            if st["state"] == "paused":
                for m in st["members"]:
                    if m["node"] in index:
                        free[index[m["node"]]] -= spec.ps.as_array() if m["role"] == "ps" else 0.0
            jobs.append(self._job_view(st, spec, index))
        np.maximum(free, 0.0, out=free)
        return ClusterView(slot, self.slot_seconds, nodes.capacity, free, tuple(jobs), self.catalogue,
                           self.placement)

    def _job_view(self, st: dict[str, Any], spec: JobSpec, index: dict[str, int]) -> JobView:
        running = st["state"] == "running"
        plan = [m for m in st["members"] if m["state"] == "member"] if running else []
        nodes_of = {r: tuple(index.get(m["node"], 0) for m in plan if m["role"] == r)
                    for r in ("ps", "worker")}
        hist = tuple(Observation(h["slot"], h["ps"], h["workers"], h["epochs"], h["seconds"], h["loss"])
                     for h in st["history"])
        wd, pd = spec.worker.as_array(), spec.ps.as_array()
        wd.flags.writeable = False
        pd.flags.writeable = False
        return JobView(
            job_id=st["job_id"], job_type=spec.job_type, type_index=self.catalogue.index(spec.job_type),
            arrival_slot=max(int((st["submitted_at"] - self.epoch) // self.slot_seconds), 0),
            slots_run=sum(1 for h in st["history"] if h["workers"] > 0),
            est_epochs=spec.epochs, done_epochs=min(float(st["epochs_done"]), spec.epochs),
            workers=len(nodes_of["worker"]), ps=len(nodes_of["ps"]),
            worker_nodes=nodes_of["worker"], ps_nodes=nodes_of["ps"],
            worker_demand=wd, ps_demand=pd, max_workers=spec.workers.max, max_ps=spec.ps_count.max,
            history=hist)

    def apply(self, allocation: Allocation) -> ApplyReport:
        """Deltas of ``allocation`` against the last snapshot, as scale calls (module docstring)."""
        nodes = self._nodes or ray_nodes()
        index = nodes.index()
        report = ApplyReport(self.slot_now())
        downs, ups = [], []
        for name, st in self.last_status.items():
            if st["state"] in TERMINAL or (st["state"] == "pending" and st["job_id"] not in allocation.tasks):
                continue
            t = allocation.tasks.get(st["job_id"], Tasks(0, 0))
            target = (t.ps, t.workers) if t.ps > 0 and t.workers > 0 else (0, 0)
            before = (st["ps"], st["workers"]) if st["state"] == "running" else (0, 0)
            if target == before:
                continue
            if st["busy"] or name in self._pending:
                report.skipped_busy.append(name)
                continue
            action = ScaleAction(name, before, target)
            grows = target[0] > before[0] or target[1] > before[1]
            (ups if grows and target != (0, 0) else downs).append((action, st))
        self._run([(a, st, [], []) for a, st in downs], report)
        if not ups:
            return report
        usage = self._usage(nodes, index)
        placed = []
        for action, st in ups:
            ps_nodes, worker_nodes, action.target = self._place(action, st, allocation, nodes, index, usage)
            if action.target == action.before or 0 in action.target:
                continue
            placed.append((action, st, ps_nodes, worker_nodes))
        self._run(placed, report)
        return report

    def _run(self, todo: list, report: ApplyReport) -> None:
        """Issue the scale calls together, wait up to ``apply_wait_s``; late ones finish in the background."""
        if not todo:
            return
        refs = {}
        hosts = self.hosts()
        for action, _st, ps_nodes, worker_nodes in todo:
            host = hosts.get(action.job)
            if host is None:
                continue
            ps, workers = action.target
            refs[action.job] = (action, host.scale_to.remote(ps, workers, ps_nodes, worker_nodes))
            report.actions.append(action)
        if not refs:
            return
        ray.wait([r for _, r in refs.values()], num_returns=len(refs), timeout=self.apply_wait_s)
        for name, (action, ref) in refs.items():
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                self._pending[name] = ref
                action.reason = "in progress"
                continue
            self._finish(action, ref)

    def _finish(self, action: ScaleAction, ref: Any) -> None:
        try:
            res = ray.get(ref)
        except ray.exceptions.RayError as exc:
            action.ok, action.reason = False, type(exc).__name__
            return
        action.ok, action.reason = bool(res["ok"]), res.get("reason", "")
        action.seconds = res.get("seconds", 0.0)

    def poll_pending(self) -> None:
        """Forget scale calls of earlier slots that have returned (their result is in the job's actions)."""
        for name, ref in list(self._pending.items()):
            if ray.wait([ref], timeout=0)[0]:
                del self._pending[name]

    def _usage(self, nodes: Nodes, index: dict[str, int]) -> np.ndarray:
        """Per-node resources held now by every live member actor (after the scale-downs)."""
        self.last_status = self.statuses()
        usage = np.zeros_like(nodes.capacity)
        for st in self.last_status.values():
            spec = JobSpec.model_validate(st["spec"])
            for m in st["members"]:
                if m["node"] in index:
                    usage[index[m["node"]]] += (spec.ps if m["role"] == "ps" else spec.worker).as_array()
        return usage

    def _place(self, action: ScaleAction, st: dict[str, Any], allocation: Allocation, nodes: Nodes,
               index: dict[str, int], usage: np.ndarray) -> tuple[list[str], list[str], tuple[int, int]]:
        """Nodes for the new members of one job (preferring the allocation's), updating ``usage``;
        and the target ``(ps, workers)`` cut to what fits."""
        spec = JobSpec.model_validate(st["spec"])
        running = st["state"] == "running"
        have = {"ps": st["ps"] if running else 0, "worker": st["workers"] if running else 0}
        if not running and st["state"] == "paused":
            have["ps"] = 1  # the PS that kept the job's state
        want = {"ps": action.target[0], "worker": action.target[1]}
        pl = (allocation.placement or {}).get(st["job_id"])
        prefer = {"ps": list(pl.ps_nodes) if pl else [], "worker": list(pl.worker_nodes) if pl else []}
        out: dict[str, list[str]] = {"ps": [], "worker": []}
        for role in ("ps", "worker"):
            demand = (spec.ps if role == "ps" else spec.worker).as_array()
            for k in range(max(want[role] - have[role], 0)):
                wish = prefer[role][have[role] + k] if have[role] + k < len(prefer[role]) else None
                order = [wish] if wish is not None and wish < len(nodes.ids) else []
                order += list(range(len(nodes.ids)))
                node = next((n for n in order if (usage[n] + demand <= nodes.capacity[n] + 1e-9).all()),
                            None)
                if node is None:
                    break
                usage[node] += demand
                out[role].append(nodes.ids[node])
        if have["ps"] + len(out["ps"]) == 0 or have["worker"] + len(out["worker"]) == 0:
            for role in ("ps", "worker"):  # cannot run without both: give the room back
                for nid in out[role]:
                    usage[index[nid]] -= (spec.ps if role == "ps" else spec.worker).as_array()
            return [], [], action.before
        final = tuple(want[r] if want[r] <= have[r] else have[r] + len(out[r]) for r in ("ps", "worker"))
        return out["ps"], out["worker"], (final[0], final[1])
