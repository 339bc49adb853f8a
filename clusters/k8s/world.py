"""What the Kubernetes backend reads at the start of a slot, without writing anything: nodes, pods,
Services, DL2Jobs (validated) and each running job's coordinator, as one :class:`World`.

A node's capacity is its allocatable cpu, ``nvidia.com/gpu`` and memory; its
usage the requests of the non-terminal pods bound (or pinned) to it, every
namespace's. Each DL2Job becomes a :class:`JobState`: its spec (or the error
naming the field that makes it invalid), its coordinator pod and Service, its
member pods by role and index, and its coordinator's status. Pods and
Services of dl2ray whose DL2Job is gone are listed as orphans (the status
writer deletes them).
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clusters.agent.queues import check_job_queue
from clusters.agent.reports import Nodes
from clusters.agent.views import job_id_of
from clusters.k8s import objects as ko
from clusters.k8s.api import KubeApi
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, check_spec, parse_jobspec
from dl2ray.tenancy import TenancyConfig
from dl2ray.workload import JobCatalogue
from elastic_mxnet.job import ElasticJob, ScaleRefused
from elastic_mxnet.protocol.messages import ScaleReply, StatusReply

TERMINAL_PODS = ("Succeeded", "Failed")
TERMINAL_JOBS = ("Succeeded", "Failed")


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def pod_ready(pod: dict) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return pod_phase(pod) == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conds
    )


def pod_node(pod: dict) -> str | None:
    """The node a pod is bound to, else the node its required node affinity pins it to."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    try:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        return terms[0]["matchFields"][0]["values"][0]
    except (KeyError, IndexError, TypeError):
        return None


def pod_requests(pod: dict) -> np.ndarray:
    total = np.zeros(3)
    for c in (pod.get("spec") or {}).get("containers") or []:
        total += ko.triple((c.get("resources") or {}).get("requests"))
    return total


def node_usage(nodes: Nodes, pods: list[dict]) -> np.ndarray:
    """Per-node requests of the non-terminal pods bound or pinned to each node, shape (N, 3)."""
    index = nodes.index()
    usage = np.zeros_like(nodes.capacity)
    for pod in pods:
        if pod_phase(pod) not in TERMINAL_PODS and (node := pod_node(pod)) in index:
            usage[index[node]] += pod_requests(pod)
    return usage


class Coordinators:
    """How the backend talks to each job's coordinator: :class:`~elastic_mxnet.job.ElasticJob` over ZeroMQ.
    (The API-server benchmark swaps in coordinators that answer in-process, to time the API side alone.)"""

    def status(self, address: str) -> StatusReply | None:
        """The coordinator's ``StatusReply``, or None when it does not answer within 3 s."""
        try:
            with ElasticJob(address, timeout_s=3.0) as job:
                return job.status(timeout_s=3.0)
        except (TimeoutError, ScaleRefused):
            return None

    def scale(self, address: str, ps: int, workers: int, timeout_s: float) -> ScaleReply:
        """``ElasticJob.scale`` (absolute targets); its ``ScaleReply``; ScaleRefused or TimeoutError."""
        with ElasticJob(address, timeout_s=timeout_s) as job:
            return job.scale(ps=ps, workers=workers)


@dataclass
class JobState:
    """One DL2Job and what belongs to it, as read at the start of a slot."""

    obj: dict
    name: str
    spec: JobSpec | None = None
    error: str | None = None
    suspend: bool = False
    coordinator: dict | None = None
    service: bool = False
    members: dict[str, dict[int, dict]] = field(default_factory=lambda: {"ps": {}, "worker": {}})
    coord: StatusReply | None = None  # the coordinator's status, None when it did not answer (or none runs)
    phase: str = "Pending"
    status: dict = field(default_factory=dict)

    @property
    def job_id(self) -> int:
        return job_id_of(self.name)

    def live(self, role: str) -> dict[int, dict]:
        """Member pods of ``role`` that are not finished or failed."""
        return {i: p for i, p in self.members[role].items() if pod_phase(p) not in TERMINAL_PODS}

    def plan(self) -> tuple[int, int]:
        """``(ps, workers)`` in the coordinator's current plan (0, 0 before it started)."""
        if self.coord is None:
            return 0, 0
        plan = [m for m in self.coord.members if m.state == "member"]
        return sum(m.role == "ps" for m in plan), sum(m.role == "worker" for m in plan)


@dataclass
class World:
    """The cluster as read at the start of a slot (module docstring). ``port``: the coordinators'."""

    nodes: Nodes
    jobs: dict[str, JobState]
    usage: np.ndarray
    port: int
    orphans: list[dict] = field(default_factory=list)
    orphan_services: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, port: int) -> World:
        return cls(Nodes.empty(), {}, np.zeros((0, 3)), port)

    def address(self, js: JobState) -> str | None:
        """``tcp://POD_IP:PORT`` of the job's coordinator, once its pod has an IP."""
        ip = ((js.coordinator or {}).get("status") or {}).get("podIP")
        return f"tcp://{ip}:{self.port}" if ip else None


def read_world(api: KubeApi, catalogue: JobCatalogue, port: int, coordinators: Coordinators,
               pool: Executor, tenancy: TenancyConfig | None = None) -> World:
    """Nodes, pods, Services, DL2Jobs and each running job's coordinator (``pool``: the coordinators are
    asked in parallel); each DL2Job validated (against ``tenancy``'s queues on a shared cluster). No
    writes."""
    raw_nodes = sorted(
        (n for n in api.nodes() if not (n.get("spec") or {}).get("unschedulable")),
        key=lambda n: n["metadata"]["name"],
    )
    cap = np.array([ko.triple((n.get("status") or {}).get("allocatable")) for n in raw_nodes])
    nodes = Nodes([n["metadata"]["name"] for n in raw_nodes], cap.reshape(-1, 3))
    pods = api.all_pods()
    ours = [p for p in pods
            if p["metadata"].get("namespace", api.namespace) == api.namespace
            and (p["metadata"].get("labels") or {}).get(ko.LABEL_JOB)]
    services = {s["metadata"]["labels"][ko.LABEL_JOB] for s in api.services()}
    world = World(nodes, {}, node_usage(nodes, pods), port)
    for obj in api.jobs():
        js = JobState(obj, obj["metadata"]["name"], status=dict(obj.get("status") or {}))
        validate(js, catalogue, nodes.capacity, tenancy)
        js.service = js.name in services
        world.jobs[js.name] = js
    for pod in ours:
        labels = pod["metadata"]["labels"]
        owner = world.jobs.get(labels[ko.LABEL_JOB])
        if owner is None:
            world.orphans.append(pod)
        elif labels.get(ko.LABEL_ROLE) == "coordinator":
            owner.coordinator = pod
        elif labels.get(ko.LABEL_ROLE) in ko.ROLES and labels.get(ko.LABEL_INDEX, "").isdigit():
            owner.members[labels[ko.LABEL_ROLE]][int(labels[ko.LABEL_INDEX])] = pod
    world.orphan_services = sorted(services - set(world.jobs))
    running = [js for js in world.jobs.values()
               if js.coordinator is not None and pod_phase(js.coordinator) == "Running" and world.address(js)]

    def ask(js: JobState) -> Any:
        addr = world.address(js)
        return None if addr is None else coordinators.status(addr)

    for js, st in zip(running, pool.map(ask, running), strict=True):
        js.coord = st
    return world


def validate(js: JobState, catalogue: JobCatalogue, capacity: np.ndarray,
             tenancy: TenancyConfig | None = None) -> None:
    """Parse and check the DL2Job's spec (its queue and priority class against ``tenancy`` too);
    ``js.error`` names the field (``spec.FIELD: problem``)."""
    try:
        raw, js.suspend = ko.spec_of(js.obj)
        if raw["name"] != js.name:
            raise UserError(f"name: {raw['name']!r} differs from metadata.name {js.name!r}")
        spec = parse_jobspec(raw, "spec")
        check_spec(spec, catalogue.names, capacity)
        try:
            check_job_queue(tenancy, spec)
        except UserError as exc:  # the DL2Job's word for a priority class
            raise UserError(str(exc).replace("priority:", f"{ko.PRIORITY_FIELD}:", 1)) from None
        for role in ko.ROLES:
            gpu = (spec.ps if role == "ps" else spec.worker).gpu
            if gpu != int(gpu):
                raise UserError(f"{role}.gpu: {gpu:g}: Kubernetes schedules whole GPUs")
        js.spec = spec
    except UserError as exc:
        msg = str(exc).replace("Value error, ", "")
        msg = msg.removeprefix("spec: ")  # "spec: workers: problem" -> "spec.workers: problem"
        js.error = f"spec.{msg}"
