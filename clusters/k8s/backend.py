"""The Kubernetes backend: the live view from nodes, pods and DL2Jobs; an Allocation as pods and scale calls.

A :class:`~clusters.agent.backend.LiveBackend` made of three parts, each in its
own module: the API wrapper with retries (:mod:`clusters.k8s.api`, the one
module that imports ``kubernetes``), the view builder (:mod:`clusters.k8s.world`
reads, :mod:`clusters.k8s.status` writes each DL2Job's status and tidies,
:meth:`KubernetesBackend.snapshot` builds the view) and the reconciler
(:mod:`clusters.k8s.reconciler`). What the objects look like is
:mod:`clusters.k8s.objects`; the scheduler never sees a Kubernetes object.

**Level-triggered.** Every slot reads the world again (nodes, pods, DL2Jobs,
Services, and each running job's coordinator) and converges it on what the
allocation asks; nothing the backend needs lives only in this object, so an
agent that restarts adopts whatever exists: the job's slot history and its
slot mark are in the DL2Job's ``status``, the members are pods, the progress
is the coordinator's.

* :meth:`KubernetesBackend.snapshot`: the free capacity of each node (its
  allocatable minus the requests of the pods on it), every valid, unfinished,
  unsuspended DL2Job with its running members and their nodes; progress and
  deployment from the job's coordinator. It validates every DL2Job (an invalid
  one gets the condition ``Valid=False`` and a Warning event naming the
  field, and is never scheduled), closes each job's previous slot into its
  status history, marks finished/failed jobs, deletes pods of DL2Jobs that are
  gone, and drops member pods that failed or were evicted (the coordinator
  drops the dead member from its plan; the view then shows one member fewer
  and the scheduler may ask for a replacement).
* :meth:`KubernetesBackend.apply`: :class:`~clusters.k8s.reconciler.Reconciler`; on a shared cluster
  (``tenancy``: the experiment's queues) it then writes each queue's use after the decision to its
  DL2Queue (:mod:`clusters.k8s.queues`), and :meth:`snapshot` refuses a DL2Job naming an unknown queue.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from clusters.agent.queues import QueueRow, queue_rows
from clusters.agent.reports import ApplyReport, Nodes
from clusters.agent.views import job_id_of, live_job_view
from clusters.k8s import objects as ko
from clusters.k8s.api import ApiGiveUp, KubeApi, NotFound
from clusters.k8s.config import K8sConfig, K8sSettings
from clusters.k8s.queues import check_names, publish
from clusters.k8s.reconciler import Reconciler
from clusters.k8s.status import StatusWriter
from clusters.k8s.world import Coordinators, JobState, World, pod_node, read_world
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, check_spec
from dl2ray.tenancy import TenancyConfig
from dl2ray.view import Allocation, ClusterView, JobView, Observation
from dl2ray.workload import JobCatalogue

log = logging.getLogger(__name__)

class KubernetesBackend:
    """The live backend on Kubernetes (module docstring). ``clock``: Unix time (s); ``coordinators``: how
    the coordinators are reached (ZeroMQ; the API benchmark swaps in its own)."""

    def __init__(
        self,
        api: KubeApi,
        settings: K8sSettings,
        catalogue: JobCatalogue,
        placement: str = "load_balancing",
        clock: Callable[[], float] = time.time,
        coordinators: Coordinators | None = None,
        tenancy: TenancyConfig | None = None,
    ) -> None:
        self.api, self.cfg, self.catalogue, self.placement = api, settings, catalogue, placement
        if tenancy is not None:
            check_names(tenancy)
        self.tenancy = tenancy
        self._view: ClusterView | None = None  # the latest snapshot's, for the queues' use after apply
        self.clock = clock
        self.coordinators = coordinators or Coordinators()
        self._pool = ThreadPoolExecutor(max_workers=settings.parallel_jobs, thread_name_prefix="k8s-job")
        self.world = World.empty(settings.pods.coordinator_port)
        self.status_writer = StatusWriter(api, settings, clock)
        self.reconciler = Reconciler(api, settings, catalogue, placement, self.coordinators, self._pool,
                                     self.status_writer)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # ---- reading the world --------------------------------------------------------------------------

    @property
    def jobs(self) -> dict[str, JobState]:
        return self.world.jobs

    @property
    def nodes(self) -> Nodes:
        return self.world.nodes

    @property
    def usage(self) -> np.ndarray:
        return self.world.usage

    def slot_now(self) -> int:
        """Slot ``k`` runs from ``k · slot_seconds`` Unix time on: the same slots after any restart."""
        return math.floor(self.clock() / self.cfg.slot_seconds)

    def slot_start(self, slot: int) -> float:
        return slot * self.cfg.slot_seconds

    def read(self) -> None:
        """Nodes, pods, Services, DL2Jobs and each running job's coordinator (no writes)."""
        self.world = read_world(self.api, self.catalogue, self.cfg.pods.coordinator_port, self.coordinators,
                                self._pool, self.tenancy)

    def adopt(self) -> int:
        self.read()
        return sum(1 for js in self.jobs.values() if js.coordinator is not None)

    def address(self, js: JobState) -> str | None:
        return self.world.address(js)

    # ---- the slot -----------------------------------------------------------------------------------

    def snapshot(self) -> ClusterView:
        """Read the world, tidy it (statuses, failed pods, orphans), and return the view of this slot."""
        slot = self.slot_now()
        self.read()
        self.status_writer.tidy(self.world)
        for js in self.jobs.values():
            self.status_writer.update(self.world, js, slot)
        index = self.nodes.index()
        free = np.maximum(self.nodes.capacity - self.usage, 0.0)
        views = []
        for js in sorted(self.jobs.values(), key=lambda j: (j.status.get("submittedAt", 0.0), j.name)):
            if js.phase in ("Pending", "Running") and js.spec is not None and not js.suspend:
                views.append(self._job_view(js, index))
        self._view = ClusterView(slot, self.cfg.slot_seconds, self.nodes.capacity, free, tuple(views),
                                 self.catalogue, self.placement)
        return self._view

    def view_parts(self) -> dict[str, float]:
        """None measured: the snapshot is one read of the world (:meth:`read`)."""
        return {}

    def _job_view(self, js: JobState, index: dict[str, int]) -> JobView:
        spec = js.spec
        assert spec is not None
        ps, workers = js.plan()
        nodes = {}
        for role, count in (("ps", ps), ("worker", workers)):
            live = [p for _, p in sorted(js.live(role).items())][:count]
            nodes[role] = [index.get(pod_node(p) or "", 0) for p in live]
        hist = (Observation(h["slot"], h["ps"], h["workers"], h["epochs"], h["seconds"], float("nan"))
                for h in js.status.get("history") or [])
        arrival = math.floor(js.status.get("submittedAt", self.clock()) / self.cfg.slot_seconds)
        return live_job_view(js.name, spec, self.catalogue, arrival, float(js.status.get("epochsDone", 0.0)),
                             nodes["ps"], nodes["worker"], hist)

    def apply(self, allocation: Allocation) -> ApplyReport:
        """Converge every job on ``allocation`` (:mod:`clusters.k8s.reconciler`); scale-downs first. Then, on
        a shared cluster, the DL2Queues' status (a failure there is logged, never the slot's)."""
        report = self.reconciler.apply(self.world, allocation, self.slot_now())
        if self.tenancy is not None:
            try:
                publish(self.api, self.tenancy, self.queue_rows(allocation))
            except (ApiGiveUp, NotFound) as exc:
                log.warning("DL2Queue status not written (is the DL2Queue CRD installed?): %s", exc)
        return report

    def queue_rows(self, allocation: Allocation | None = None) -> list[QueueRow]:
        """Each queue after ``allocation`` on the latest snapshot (None: nothing used); [] without queues."""
        if self.tenancy is None:
            return []
        jobs = [(js.spec.queue, js.plan()[1] == 0) for js in self.jobs.values()
                if js.spec is not None and js.phase in ("Pending", "Running")]
        return queue_rows(self.tenancy, self._view if allocation is not None else None, allocation, jobs)

    # ---- submit / cancel / status ---------------------------------------------------------------------

    def submit(self, spec: JobSpec, suspend: bool = False) -> dict[str, Any]:
        """Create the DL2Job (refused with :class:`UserError` naming the field)."""
        if not self.nodes.names:
            self.read()
        check_spec(spec, self.catalogue.names, self.nodes.capacity)
        if not self.api.create(ko.dl2job(spec, self.api.namespace, suspend)):
            raise UserError(f"name: a DL2Job named {spec.name!r} already exists in {self.api.namespace}")
        return {"name": spec.name, "job_id": job_id_of(spec.name), "namespace": self.api.namespace}

    def cancel(self, name: str) -> dict[str, Any]:
        """Delete the DL2Job and its pods now."""
        if not self.api.delete("DL2Job", name):
            raise UserError(f"no DL2Job named {name!r} in {self.api.namespace}")
        for pod in self.api.pods(name):
            self.api.delete("Pod", pod["metadata"]["name"])
        self.api.delete("Service", ko.coordinator_name(name))
        return {"ok": True, "reason": "cancelled"}

    def statuses(self) -> dict[str, dict[str, Any]]:
        return {
            obj["metadata"]["name"]: {"name": obj["metadata"]["name"], **(obj.get("status") or {})}
            for obj in self.api.jobs()
        }


def connect(cfg: K8sConfig) -> KubernetesBackend:
    """The backend on the configured API server (read once); UserError when it cannot be reached or
    configured."""
    k = cfg.kubernetes
    path = cfg.kubeconfig_path()
    if path is not None and not path.is_file():
        raise UserError(f"kubernetes.kubeconfig: {path}: no such file")
    api = KubeApi.connect(k, None if path is None else str(path))
    exp = cfg.experiment()
    backend = KubernetesBackend(api, k, exp.catalogue, exp.cluster.default_placement, tenancy=exp.tenancy)
    try:
        backend.read()
    except (ApiGiveUp, OSError) as exc:
        backend.close()
        raise UserError(f"cannot reach the Kubernetes API server: {exc}") from None
    return backend
