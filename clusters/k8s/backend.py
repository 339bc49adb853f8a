"""The Kubernetes backend: the live view from nodes, pods and DL2Jobs; an Allocation as pods and scale calls.

The only module of the project that imports ``kubernetes``. It converts the
cluster into a :class:`~dl2ray.view.ClusterView` and an
:class:`~dl2ray.view.Allocation` into pods (objects: :mod:`clusters.k8s.objects`);
the scheduler never sees a Kubernetes object.

**Level-triggered.** Every slot reads the world again (nodes, pods, DL2Jobs,
Services, and each running job's coordinator) and converges it on what the
allocation asks; nothing the backend needs lives only in this object, so an
agent that restarts adopts whatever exists: the job's slot history and its
slot mark are in the DL2Job's ``status``, the members are pods, the progress
is the coordinator's.

* :meth:`KubernetesBackend.snapshot`: each node's allocatable cpu,
  ``nvidia.com/gpu`` and memory minus the requests of the non-terminal pods
  bound (or pinned) to it, every namespace's; every valid, unfinished,
  unsuspended DL2Job with its running members and their nodes; progress and
  deployment from the job's coordinator. It validates every DL2Job (an invalid
  one gets the condition ``Valid=False`` and a Warning event naming the
  field, and is never scheduled), closes each job's previous slot into its
  status history, marks finished/failed jobs, deletes pods of DL2Jobs that are
  gone, and drops member pods that failed or were evicted (the coordinator
  drops the dead member from its plan; the view then shows one member fewer
  and the scheduler may ask for a replacement).
* :meth:`KubernetesBackend.apply`: per job, deltas only. Scale-up: create the
  missing pods (lowest free index, pinned by node affinity to the
  allocation's node when it has room, else to the first node with room),
  wait until they are Ready, then ``ElasticJob.scale``. Scale-down (and
  pause = 1 PS, 0 workers; also ``suspend: true``): ``ElasticJob.scale``
  first, then wait for the released members to exit and delete their pods,
  so no training step is lost. A job's first allocation creates its
  coordinator pod and Service, then its members. Applying the same allocation
  twice changes nothing (no writes).

**API errors** (:class:`KubeApi`): 429, 5xx, timeouts and connection errors
are retried with capped exponential backoff (``Retry-After`` honoured); a 409
on create means the object exists (deterministic names: a create repeated
after a lost answer finds its own pod, never makes a second); a 404 on
delete means it is gone; other 4xx are given up and reported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes
import numpy as np
import urllib3
from kubernetes.client.exceptions import ApiException

from clusters.k8s import objects as ko
from clusters.k8s.config import ApiSettings, K8sSettings
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, check_spec, parse_jobspec
from dl2ray.view import Allocation, ClusterView, JobView, Observation, Tasks
from dl2ray.workload import JobCatalogue
from elastic_mxnet.job import ElasticJob, ScaleRefused

log = logging.getLogger(__name__)

HISTORY = 20
"""Per-slot observations kept in a DL2Job's status."""
TERMINAL_PODS = ("Succeeded", "Failed")
TERMINAL_JOBS = ("Succeeded", "Failed")


class ApiGiveUp(RuntimeError):
    """An API call the backend does not retry (4xx other than 404/409/429), or out of attempts."""

    def __init__(self, verb: str, what: str, status: int | None, reason: str) -> None:
        super().__init__(f"{verb} {what}: {status or 'no answer'} {reason}".strip())
        self.status = status


class Conflict(Exception):
    """409 from the API server."""


class NotFound(Exception):
    """404 from the API server."""


def _retryable(exc: Exception) -> tuple[bool, float | None]:
    """(retry?, server-suggested wait) for an exception of one API call."""
    if isinstance(exc, ApiException):
        if exc.status == 429 or (exc.status or 0) >= 500:
            after = (exc.headers or {}).get("Retry-After")
            try:
                return True, float(after) if after else None
            except ValueError:
                return True, None
        return False, None
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError), None


def kube_contexts(kubeconfig: str) -> list[str]:
    """The context names of a kubeconfig file; UserError naming the file when it cannot be read."""
    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
        raise UserError(f"kubeconfig {kubeconfig}: {exc}") from None
    return [c["name"] for c in contexts or []]


class KubeApi:
    """Every API call of the backend, each with retries; reads return plain dicts (JSON), not models.

    ``calls`` counts HTTP requests by verb (``list``, ``get``, ``create``, ``patch``, ``delete``),
    retries included: the benchmark's reads/writes per slot.
    """

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        settings: ApiSettings,
        namespace: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.settings, self.namespace, self.sleep = settings, namespace, sleep
        self.calls: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()

    @classmethod
    def connect(cls, settings: K8sSettings, kubeconfig: str | None) -> KubeApi:
        """From a kubeconfig file, or the in-cluster service account when ``kubeconfig`` is None."""
        conf = kubernetes.client.Configuration()
        try:
            if kubeconfig is None:
                kubernetes.config.load_incluster_config(client_configuration=conf)
            else:
                kubernetes.config.load_kube_config(
                    config_file=kubeconfig, context=settings.context, client_configuration=conf
                )
        except kubernetes.config.ConfigException as exc:
            raise UserError(f"kubernetes.kubeconfig: {exc}") from None
        conf.retries = False  # we retry, with backoff and classification (urllib3 would retry blindly)
        return cls(kubernetes.client.ApiClient(conf), settings.api, settings.namespace)

    def _call(self, verb: str, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        s = self.settings
        wait = s.backoff_s
        for attempt in range(1, s.attempts + 1):
            self.calls[verb] += 1
            try:
                return fn(*args, _request_timeout=s.timeout_s, **kw)
            except ApiException as exc:
                if exc.status == 409:
                    raise Conflict(what) from None
                if exc.status == 404:
                    raise NotFound(what) from None
                retry, after = _retryable(exc)
                if not retry:
                    raise ApiGiveUp(verb, what, exc.status, exc.reason or "") from None
                error: Exception = exc
            except Exception as exc:
                retry, after = _retryable(exc)
                if not retry:
                    raise
                after, error = None, exc
            if attempt == s.attempts:
                raise ApiGiveUp(
                    verb,
                    what,
                    getattr(error, "status", None),
                    f"after {attempt} tries: {type(error).__name__}",
                ) from None
            self.retries[verb] += 1
            delay = min(after if after is not None else wait, s.backoff_max_s)
            log.info("%s %s: %s; retry %d in %.2f s", verb, what, type(error).__name__, attempt, delay)
            self.sleep(delay)
            wait = min(wait * 2, s.backoff_max_s)
        raise AssertionError("unreachable")

    @staticmethod
    def _json(resp: Any) -> Any:
        return json.loads(resp.data)

    # ---- reads ----

    def nodes(self) -> list[dict]:
        return self._json(self._call("list", "nodes", self.core.list_node, _preload_content=False))["items"]

    def all_pods(self) -> list[dict]:
        """Every pod of every namespace (for the requests on each node)."""
        resp = self._call("list", "pods", self.core.list_pod_for_all_namespaces, _preload_content=False)
        return self._json(resp)["items"]

    def pods(self, job: str | None = None) -> list[dict]:
        """Pods of the namespace managed by dl2ray (of ``job`` when given); filtered here too (the
        label selector is a hint a mock API server may ignore)."""
        sel = f"{ko.LABEL_JOB}={job}" if job else ko.LABEL_JOB
        resp = self._call(
            "list",
            "pods",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=sel,
            _preload_content=False,
        )
        items = self._json(resp)["items"]
        return [
            p
            for p in items
            if (p["metadata"].get("labels") or {}).get(ko.LABEL_JOB)
            and (job is None or p["metadata"]["labels"][ko.LABEL_JOB] == job)
        ]

    def services(self) -> list[dict]:
        resp = self._call(
            "list",
            "services",
            self.core.list_namespaced_service,
            self.namespace,
            label_selector=ko.LABEL_JOB,
            _preload_content=False,
        )
        return [s for s in self._json(resp)["items"] if (s["metadata"].get("labels") or {}).get(ko.LABEL_JOB)]

    def jobs(self) -> list[dict]:
        return self._call(
            "list",
            "dl2jobs",
            self.custom.list_namespaced_custom_object,
            ko.GROUP,
            ko.VERSION,
            self.namespace,
            ko.PLURAL,
        )["items"]

    def job(self, name: str) -> dict | None:
        try:
            return self._call(
                "get",
                f"dl2job {name}",
                self.custom.get_namespaced_custom_object,
                ko.GROUP,
                ko.VERSION,
                self.namespace,
                ko.PLURAL,
                name,
            )
        except NotFound:
            return None

    # ---- writes ----

    def create(self, obj: dict) -> bool:
        """Create ``obj`` (a Pod, Service, Event or DL2Job); False if it existed already (409)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        fn: Callable[..., Any]
        args: tuple
        if kind == "Pod":
            fn, args = self.core.create_namespaced_pod, (self.namespace, obj)
        elif kind == "Service":
            fn, args = self.core.create_namespaced_service, (self.namespace, obj)
        elif kind == "Event":
            fn, args = self.core.create_namespaced_event, (self.namespace, obj)
        else:
            fn, args = (
                self.custom.create_namespaced_custom_object,
                (ko.GROUP, ko.VERSION, self.namespace, ko.PLURAL, obj),
            )
        try:
            self._call("create", f"{kind.lower()} {name}", fn, *args, _preload_content=False)
            return True
        except Conflict:
            return False

    def delete(self, kind: str, name: str) -> bool:
        """Delete a Pod, Service or DL2Job; False if it was gone already (404)."""
        body = kubernetes.client.V1DeleteOptions(propagation_policy="Background")
        try:
            if kind == "Pod":
                self._call(
                    "delete",
                    f"pod {name}",
                    self.core.delete_namespaced_pod,
                    name,
                    self.namespace,
                    body=body,
                    _preload_content=False,
                )
            elif kind == "Service":
                self._call(
                    "delete",
                    f"service {name}",
                    self.core.delete_namespaced_service,
                    name,
                    self.namespace,
                    _preload_content=False,
                )
            else:
                self._call(
                    "delete",
                    f"dl2job {name}",
                    self.custom.delete_namespaced_custom_object,
                    ko.GROUP,
                    ko.VERSION,
                    self.namespace,
                    ko.PLURAL,
                    name,
                )
            return True
        except NotFound:
            return False

    def patch_status(self, name: str, status: dict) -> None:
        """Merge ``status`` into the DL2Job's status subresource (idempotent: a retry writes the same)."""
        with contextlib.suppress(NotFound):  # deleted meanwhile: nothing to report on
            self._call(
                "patch",
                f"dl2job {name}/status",
                self.custom.patch_namespaced_custom_object_status,
                ko.GROUP,
                ko.VERSION,
                self.namespace,
                ko.PLURAL,
                name,
                {"status": status},
            )


class PodPoll:
    """The namespace's dl2ray pods, listed at most once per ``period_s`` however many jobs wait on them.

    The jobs of one apply wait in parallel (pods Ready, released pods ended); sharing one listing
    keeps that at one API call per period instead of one per job.
    """

    def __init__(self, api: KubeApi, period_s: float = 0.2) -> None:
        self.api, self.period_s = api, period_s
        self._lock = threading.Lock()
        self._at = -math.inf
        self._items: list[dict] = []

    def pods(self, job: str) -> list[dict]:
        with self._lock:
            if time.monotonic() - self._at >= self.period_s:
                self._items = self.api.pods()
                self._at = time.monotonic()
            items = self._items
        return [p for p in items if p["metadata"]["labels"][ko.LABEL_JOB] == job]


class Coordinators:
    """How the backend talks to each job's coordinator: :class:`~elastic_mxnet.job.ElasticJob` over ZeroMQ.
    (The API-server benchmark swaps in coordinators that answer in-process, to time the API side alone.)"""

    def status(self, address: str) -> Any:
        """The coordinator's ``StatusReply``, or None when it does not answer within 3 s."""
        try:
            with ElasticJob(address, timeout_s=3.0) as job:
                return job.status(timeout_s=3.0)
        except (TimeoutError, ScaleRefused):
            return None

    def scale(self, address: str, ps: int, workers: int, timeout_s: float) -> Any:
        """``ElasticJob.scale`` (absolute targets); its ``ScaleReply``; ScaleRefused or TimeoutError."""
        with ElasticJob(address, timeout_s=timeout_s) as job:
            return job.scale(ps=ps, workers=workers)


# ---- the world as read in one slot --------------------------------------------------------------------


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


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    coord: Any = None  # the coordinator's StatusReply, or None
    phase: str = "Pending"
    status: dict = field(default_factory=dict)

    @property
    def job_id(self) -> int:
        return ko.job_id_of(self.name)

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
class Nodes:
    """Schedulable nodes, sorted by name: ``capacity`` shape (N, 3) in (cpu, gpu, mem GB)."""

    names: list[str]
    capacity: np.ndarray

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}


@dataclass
class ScaleAction:
    """One job's change in one slot: from ``(ps, workers)`` to the target, and how it went."""

    job: str
    before: tuple[int, int]
    target: tuple[int, int]
    ok: bool | None = None
    reason: str = ""
    seconds: float = 0.0
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


@dataclass
class ApplyReport:
    slot: int
    actions: list[ScaleAction] = field(default_factory=list)
    skipped_busy: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class KubernetesBackend:
    """The live backend on Kubernetes (module docstring); a :class:`~clusters.agent.backend.LiveBackend`."""

    def __init__(
        self,
        api: KubeApi,
        settings: K8sSettings,
        catalogue: JobCatalogue,
        placement: str = "load_balancing",
        clock: Callable[[], float] = time.time,
        coordinators: Coordinators | None = None,
    ) -> None:
        self.api, self.cfg, self.catalogue, self.placement = api, settings, catalogue, placement
        self.clock = clock
        self.coordinators = coordinators or Coordinators()
        self._poll = PodPoll(api)
        self.jobs: dict[str, JobState] = {}
        self.nodes = Nodes([], np.zeros((0, 3)))
        self.usage = np.zeros((0, 3))
        self._pool = ThreadPoolExecutor(max_workers=settings.parallel_jobs, thread_name_prefix="k8s-job")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # ---- reading the world --------------------------------------------------------------------------

    def slot_now(self) -> int:
        """Slot ``k`` runs from ``k · slot_seconds`` Unix time on: the same slots after any restart."""
        return math.floor(self.clock() / self.cfg.slot_seconds)

    def read(self) -> None:
        """Nodes, pods, Services, DL2Jobs and each running job's coordinator (no writes)."""
        raw_nodes = sorted(
            (n for n in self.api.nodes() if not (n.get("spec") or {}).get("unschedulable")),
            key=lambda n: n["metadata"]["name"],
        )
        cap = np.array([ko.triple((n.get("status") or {}).get("allocatable")) for n in raw_nodes])
        self.nodes = Nodes([n["metadata"]["name"] for n in raw_nodes], cap.reshape(-1, 3))
        ours: list[dict] = []
        pods = self.api.all_pods()
        self.usage = self._usage(pods)
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("namespace", self.api.namespace) == self.api.namespace and (
                meta.get("labels") or {}
            ).get(ko.LABEL_JOB):
                ours.append(pod)
        services = {s["metadata"]["labels"][ko.LABEL_JOB] for s in self.api.services()}
        self.jobs = {}
        for obj in self.api.jobs():
            js = JobState(obj, obj["metadata"]["name"], status=dict(obj.get("status") or {}))
            self._validate(js)
            js.service = js.name in services
            self.jobs[js.name] = js
        self._orphans: list[dict] = []
        for pod in ours:
            labels = pod["metadata"]["labels"]
            js = self.jobs.get(labels[ko.LABEL_JOB])
            if js is None:
                self._orphans.append(pod)
            elif labels.get(ko.LABEL_ROLE) == "coordinator":
                js.coordinator = pod
            elif labels.get(ko.LABEL_ROLE) in ko.ROLES and labels.get(ko.LABEL_INDEX, "").isdigit():
                js.members[labels[ko.LABEL_ROLE]][int(labels[ko.LABEL_INDEX])] = pod
        self._orphan_services = sorted(services - set(self.jobs))
        running = [
            js
            for js in self.jobs.values()
            if js.coordinator is not None and pod_phase(js.coordinator) == "Running" and self.address(js)
        ]
        for js, st in zip(running, self._pool.map(self._coordinator_status, running), strict=True):
            js.coord = st

    def _usage(self, pods: list[dict]) -> np.ndarray:
        """Per-node requests of the non-terminal pods bound or pinned to each node, shape (N, 3)."""
        index = self.nodes.index()
        usage = np.zeros_like(self.nodes.capacity)
        for pod in pods:
            if pod_phase(pod) not in TERMINAL_PODS and (node := pod_node(pod)) in index:
                usage[index[node]] += pod_requests(pod)
        return usage

    def address(self, js: JobState) -> str | None:
        ip = ((js.coordinator or {}).get("status") or {}).get("podIP")
        return f"tcp://{ip}:{self.cfg.pods.coordinator_port}" if ip else None

    def _coordinator_status(self, js: JobState) -> Any:
        addr = self.address(js)
        if addr is None:
            return None
        return self.coordinators.status(addr)

    def _validate(self, js: JobState) -> None:
        """Parse and check the DL2Job's spec; ``js.error`` names the field (``spec.FIELD: problem``)."""
        try:
            raw, js.suspend = ko.spec_of(js.obj)
            if raw["name"] != js.name:
                raise UserError(f"name: {raw['name']!r} differs from metadata.name {js.name!r}")
            spec = parse_jobspec(raw, "spec")
            check_spec(spec, self.catalogue.names, self.nodes.capacity)
            for role in ko.ROLES:
                gpu = (spec.ps if role == "ps" else spec.worker).gpu
                if gpu != int(gpu):
                    raise UserError(f"{role}.gpu: {gpu:g}: Kubernetes schedules whole GPUs")
            js.spec = spec
        except UserError as exc:
            msg = str(exc).replace("Value error, ", "")
            msg = msg.removeprefix("spec: ")  # "spec: workers: problem" -> "spec.workers: problem"
            js.error = f"spec.{msg}"

    # ---- the slot -----------------------------------------------------------------------------------

    def snapshot(self) -> ClusterView:
        """Read the world, tidy it (statuses, failed pods, orphans), and return the view of this slot."""
        slot = self.slot_now()
        self.read()
        self._tidy()
        for js in self.jobs.values():
            self._update_status(js, slot)
        index = self.nodes.index()
        free = np.maximum(self.nodes.capacity - self.usage, 0.0)
        views = []
        for js in sorted(self.jobs.values(), key=lambda j: (j.status.get("submittedAt", 0.0), j.name)):
            if js.phase in ("Pending", "Running") and js.spec is not None and not js.suspend:
                views.append(self._job_view(js, index))
        return ClusterView(
            slot,
            self.cfg.slot_seconds,
            self.nodes.capacity,
            free,
            tuple(views),
            self.catalogue,
            self.placement,
        )

    def _tidy(self) -> None:
        """Delete what no job owns any more, and member pods that failed or were evicted."""
        for pod in self._orphans:
            self.api.delete("Pod", pod["metadata"]["name"])
        for name in self._orphan_services:
            self.api.delete("Service", ko.coordinator_name(name))
        for js in self.jobs.values():
            coord_phase = pod_phase(js.coordinator) if js.coordinator else None
            for role in ko.ROLES:
                for i, pod in list(js.members[role].items()):
                    # released members (Succeeded), failed or evicted ones, and all of a finished job
                    if pod_phase(pod) in TERMINAL_PODS or coord_phase in TERMINAL_PODS:
                        if pod_phase(pod) == "Failed" and coord_phase not in TERMINAL_PODS:
                            reason = (pod.get("status") or {}).get("reason") or "Failed"
                            js.status["replaced"] = int(js.status.get("replaced", 0)) + 1
                            self._event(
                                js,
                                "MemberFailed",
                                f"{pod['metadata']['name']}: {reason}; dropped from the job",
                                kind="Warning",
                                key=pod["metadata"]["name"],
                            )
                        self.api.delete("Pod", pod["metadata"]["name"])
                        del js.members[role][i]
            if coord_phase in TERMINAL_PODS and js.service:
                self.api.delete("Service", ko.coordinator_name(js.name))
                js.service = False

    def _update_status(self, js: JobState, slot: int) -> None:
        """Phase, progress, conditions and the slot history; written only where it changed."""
        old = json.dumps(js.obj.get("status") or {}, sort_keys=True)
        st = js.status
        now = self.clock()
        if "submittedAt" not in st:
            created = js.obj["metadata"].get("creationTimestamp")
            st["submittedAt"] = (
                datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
                if created
                else round(now, 3)
            )
        st["jobId"] = js.job_id
        if js.error is not None:
            js.phase = "Invalid"
            before = next((c for c in st.get("conditions") or [] if c.get("type") == "Valid"), {})
            self._condition(st, "Valid", "False", "InvalidSpec", js.error)
            if before.get("message") != js.error:  # reported once per distinct problem
                self._event(js, "InvalidSpec", js.error, kind="Warning", key=js.error)
        else:
            self._condition(st, "Valid", "True", "Validated", "the spec is valid")
            js.phase = self._phase(js)
        st["phase"] = js.phase
        if js.spec is not None:
            st["estEpochs"] = js.spec.epochs
            last = {
                r: st.get(r, {}).get("ready") or st.get(r, {}).get("desired", 0) for r in ("ps", "workers")
            }
            ps, workers = js.plan()
            st["ps"] = {"desired": st.get("ps", {}).get("desired", 0), "ready": ps}
            st["workers"] = {"desired": st.get("workers", {}).get("desired", 0), "ready": workers}
            if js.phase == "Succeeded":
                st["epochsDone"] = js.spec.epochs
            elif js.coord is not None:
                st["epochsDone"] = round(min(js.coord.epochs_done, js.spec.epochs), 6)
                st["scalingEvents"] = [
                    {
                        "planId": e.plan_id,
                        "change": e.change,
                        "clock": e.clock,
                        "durationMs": round(e.duration_ms, 1),
                        "lostIterations": e.lost_iterations,
                    }
                    for e in js.coord.events[-10:]
                ]
            if js.coordinator is not None and (addr := self.address(js)):
                st["coordinator"] = addr
            self._close_slot(js, slot, now, (last["ps"], last["workers"]))
        self._condition(
            st,
            "Suspended",
            "True" if js.suspend else "False",
            "Suspended" if js.suspend else "NotSuspended",
            "spec.suspend is " + str(js.suspend).lower(),
        )
        if json.dumps(st, sort_keys=True) != old:
            self.api.patch_status(js.name, st)
            js.obj["status"] = json.loads(json.dumps(st))

    def _phase(self, js: JobState) -> str:
        phase = pod_phase(js.coordinator) if js.coordinator is not None else None
        if phase in TERMINAL_PODS:
            return phase
        if js.suspend:
            return "Suspended"
        return "Pending" if phase is None else "Running"

    def _close_slot(self, js: JobState, slot: int, now: float, last: tuple[int, int]) -> None:
        """Append the observation of the slot before ``slot`` (once per slot) and move the mark. The first
        mark is the coordinator pod's start (0 epochs); a finished job gets one last observation with the
        deployment it last had (``last``: (ps, workers))."""
        st = js.status
        mark = st.get("mark")
        if mark is None and js.coordinator is not None:
            started = (js.coordinator.get("status") or {}).get("startTime")
            if started:
                t = datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
                mark = {"slot": math.floor(t / self.cfg.slot_seconds), "time": t, "epochs": 0.0}
        epochs = float(st.get("epochsDone", 0.0))
        if js.phase in TERMINAL_JOBS:  # one last observation up to the end, then none
            if mark is None or mark["epochs"] >= epochs - 1e-9:
                return
        elif js.coord is None or (mark is not None and mark["slot"] >= slot):
            return
        ps, workers = js.plan() if js.phase not in TERMINAL_JOBS else last
        if mark is not None:
            hist = list(st.get("history") or [])
            hist.append(
                {
                    "slot": slot - 1,
                    "ps": ps,
                    "workers": workers,
                    "epochs": round(max(epochs - mark["epochs"], 0.0), 6),
                    "seconds": round(now - mark["time"], 3),
                }
            )
            st["history"] = hist[-HISTORY:]
        st["mark"] = {"slot": slot, "time": round(now, 3), "epochs": epochs}

    @staticmethod
    def _condition(st: dict, type_: str, status: str, reason: str, message: str) -> None:
        conds = [c for c in st.get("conditions") or [] if c.get("type") != type_]
        old = next((c for c in st.get("conditions") or [] if c.get("type") == type_), None)
        when = old["lastTransitionTime"] if old and old.get("status") == status else _now_iso()
        if old and old.get("status") == status and old.get("message") == message:
            conds.append(old)
        else:
            conds.append(
                {
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": when,
                }
            )
        st["conditions"] = sorted(conds, key=lambda c: c["type"])

    def _event(self, js: JobState, reason: str, message: str, kind: str = "Normal", key: str = "") -> None:
        """A core/v1 Event on the DL2Job, named from its content: reported once, however often it is seen."""
        digest = f"{zlib.crc32((reason + key).encode()) & 0xFFFFFFFF:08x}"
        meta = js.obj["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{js.name}.{digest}", "namespace": self.api.namespace},
            "involvedObject": {
                "apiVersion": ko.API_VERSION,
                "kind": ko.KIND,
                "name": js.name,
                "namespace": self.api.namespace,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1000],
            "type": kind,
            "count": 1,
            "firstTimestamp": _now_iso(),
            "lastTimestamp": _now_iso(),
            "source": {"component": "dl2ray-agent"},
        }
        self.api.create(event)

    def _job_view(self, js: JobState, index: dict[str, int]) -> JobView:
        spec = js.spec
        assert spec is not None
        ps, workers = js.plan()
        nodes = {}
        for role, count in (("ps", ps), ("worker", workers)):
            live = [p for _, p in sorted(js.live(role).items())][:count]
            nodes[role] = tuple(index.get(pod_node(p) or "", 0) for p in live)
        hist = tuple(
            Observation(h["slot"], h["ps"], h["workers"], h["epochs"], h["seconds"], float("nan"))
            for h in js.status.get("history") or []
        )
        wd, pd = spec.worker.as_array(), spec.ps.as_array()
        wd.flags.writeable = False
        pd.flags.writeable = False
        return JobView(
            job_id=js.job_id,
            job_type=spec.job_type,
            type_index=self.catalogue.index(spec.job_type),
            arrival_slot=math.floor(js.status.get("submittedAt", self.clock()) / self.cfg.slot_seconds),
            slots_run=sum(1 for h in hist if h.workers > 0),
            est_epochs=spec.epochs,
            done_epochs=min(float(js.status.get("epochsDone", 0.0)), spec.epochs),
            workers=len(nodes["worker"]),
            ps=len(nodes["ps"]),
            worker_nodes=nodes["worker"],
            ps_nodes=nodes["ps"],
            worker_demand=wd,
            ps_demand=pd,
            max_workers=spec.workers.max,
            max_ps=spec.ps_count.max,
            history=hist,
        )

    # ---- applying an allocation ---------------------------------------------------------------------

    def apply(self, allocation: Allocation) -> ApplyReport:
        """Converge every job on ``allocation`` (module docstring); scale-downs before scale-ups."""
        report = ApplyReport(self.slot_now())
        self._poll = PodPoll(self.api)
        downs, ups = [], []
        for js in self.jobs.values():
            if js.spec is None or js.phase in TERMINAL_JOBS:
                continue
            target = self._target(js, allocation.tasks.get(js.job_id, Tasks(0, 0)))
            before = js.plan()
            self._desired(js, target)
            if target == before and js.coordinator is not None:
                self._trim(js, target, report)
                continue
            if target == (0, 0) and js.coordinator is None:
                continue
            if js.coord is not None and js.coord.operation is not None:
                report.skipped_busy.append(js.name)
                continue
            action = ScaleAction(js.name, before, target)
            grows = target[0] > before[0] or target[1] > before[1]
            (ups if grows else downs).append((js, action))
        self._run(downs, allocation, report)
        if downs and ups:  # what the scale-downs freed is room for the scale-ups
            self.usage = self._usage(self.api.all_pods())
        self._run(ups, allocation, report)
        return report

    def _target(self, js: JobState, t: Tasks) -> tuple[int, int]:
        """``(ps, workers)`` the job should run with: within its bounds; a job allocated nothing (or
        suspended) keeps one PS and no worker once it has started, and nothing before."""
        spec = js.spec
        assert spec is not None
        started = js.coordinator is not None
        if js.suspend or t.workers <= 0 or t.ps <= 0:
            return (1, 0) if started else (0, 0)
        ps = min(max(t.ps, spec.ps_count.min), spec.ps_count.max)
        workers = min(max(t.workers, spec.workers.min), spec.workers.max)
        return ps, workers

    def _desired(self, js: JobState, target: tuple[int, int]) -> None:
        st = js.status
        want = {
            "ps": {**st.get("ps", {}), "desired": target[0]},
            "workers": {**st.get("workers", {}), "desired": target[1]},
        }
        if want["ps"] != st.get("ps") or want["workers"] != st.get("workers"):
            st.update(want)
            self.api.patch_status(js.name, want)

    def _run(
        self, todo: list[tuple[JobState, ScaleAction]], allocation: Allocation, report: ApplyReport
    ) -> None:
        if not todo:
            return
        placed = []
        for js, action in todo:
            nodes = self._place(js, action, allocation)
            if nodes is not None:
                placed.append((js, action, nodes))
        results = self._pool.map(lambda item: self._converge(*item), placed)
        for (_js, action, _nodes), err in zip(placed, results, strict=True):
            report.actions.append(action)
            if err:
                report.errors.append(f"{action.job}: {err}")

    def _place(
        self, js: JobState, action: ScaleAction, allocation: Allocation
    ) -> dict[str, list[str]] | None:
        """Nodes for the new pods of one job (the allocation's when they have room, else the first node
        with room), charged to ``self.usage``; the target cut to what fits (None: nothing to start)."""
        spec = js.spec
        assert spec is not None
        have = {"ps": len(js.live("ps")), "worker": len(js.live("worker"))}
        want = {"ps": action.target[0], "worker": action.target[1]}
        pl = (allocation.placement or {}).get(js.job_id)
        prefer = {"ps": list(pl.ps_nodes) if pl else [], "worker": list(pl.worker_nodes) if pl else []}
        out: dict[str, list[str]] = {"ps": [], "worker": []}
        cap = self.nodes.capacity
        for role in ko.ROLES:
            demand = (spec.ps if role == "ps" else spec.worker).as_array()
            for k in range(max(want[role] - have[role], 0)):
                wish = prefer[role][have[role] + k] if have[role] + k < len(prefer[role]) else None
                order = ([wish] if wish is not None and wish < len(self.nodes.names) else []) + list(
                    range(len(self.nodes.names))
                )
                node = next((n for n in order if (self.usage[n] + demand <= cap[n] + 1e-9).all()), None)
                if node is None:
                    break
                self.usage[node] += demand
                out[role].append(self.nodes.names[node])
        final = tuple(want[r] if want[r] <= have[r] else have[r] + len(out[r]) for r in ko.ROLES)
        if js.coordinator is None:
            useless = final[0] < 1 or final[1] < 1  # a job starts with at least one PS and one worker
        else:
            useless = final == action.before or final[0] < 1
        if useless:
            index = self.nodes.index()
            for role in ko.ROLES:  # cannot start: give the room back
                for n in out[role]:
                    self.usage[index[n]] -= (spec.ps if role == "ps" else spec.worker).as_array()
            return None
        action.target = (final[0], final[1])
        return out

    def _converge(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str]]) -> str | None:
        """Bring one job to ``action.target``; an error string (also in ``action.reason``) or None."""
        t0 = time.monotonic()
        try:
            started = js.coord is not None and js.coord.state not in ("waiting", "starting")
            if js.coordinator is not None and js.coord is None and pod_ready(js.coordinator):
                raise TimeoutError(f"the coordinator of {js.name} does not answer")
            if started:
                self._scale(js, action, nodes)
            else:  # not started, or a start an earlier slot (or agent) left half done
                self._start(js, action, nodes)
        except (ApiGiveUp, TimeoutError, ScaleRefused, OSError) as exc:
            action.ok, action.reason = False, f"{type(exc).__name__}: {exc}"
        action.seconds = time.monotonic() - t0
        if action.ok is None:
            action.ok = True
        return None if action.ok else action.reason

    def _common(self) -> dict[str, Any]:
        p = self.cfg.pods
        return {"image": self.cfg.image, "pull": self.cfg.image_pull_policy, "python": p.python}

    def _start(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str]]) -> None:
        """First start: Service and coordinator pod; once it is Ready, the members; then wait until the
        coordinator's first plan runs."""
        spec = js.spec
        assert spec is not None
        if (
            js.coordinator is not None
        ):  # resume a start: the first plan's size is in the coordinator's command
            cmd = js.coordinator["spec"]["containers"][0]["command"]
            action.target = (int(cmd[cmd.index("--ps") + 1]), int(cmd[cmd.index("--workers") + 1]))
            for role, want in zip(ko.ROLES, action.target, strict=True):
                missing = max(want - len(js.live(role)), 0)
                nodes[role] = ([*nodes[role], *[None] * missing])[:missing]
        ps, workers = action.target
        p = self.cfg.pods
        pod, svc = ko.coordinator_objects(
            js.obj,
            spec,
            ps,
            workers,
            port=p.coordinator_port,
            heartbeat_timeout_s=p.heartbeat_timeout_s,
            register_timeout_s=p.register_timeout_s,
            node=nodes["ps"][0] if nodes["ps"] else None,  # beside the first PS
            **self._common(),
        )
        if not js.service:
            self.api.create(svc)
        if js.coordinator is None and self.api.create(pod):
            action.created.append(pod["metadata"]["name"])
        coord = self._wait_ready(js.name, [pod["metadata"]["name"]])[pod["metadata"]["name"]]
        js.coordinator = coord
        first = len(action.created)
        self._create_members(js, action, nodes)
        self._wait_ready(js.name, action.created[first:])
        deadline = time.monotonic() + p.register_timeout_s
        while time.monotonic() < deadline:
            st = self._coordinator_status(js)
            if st is not None and st.state == "running":
                action.reason = "started"
                return
            time.sleep(0.2)
        raise TimeoutError(f"the coordinator of {js.name} did not start its first plan")

    def _create_members(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str | None]]) -> None:
        spec = js.spec
        assert spec is not None
        for role in ko.ROLES:
            taken = set(js.members[role])
            index = 0
            for node in nodes[role]:
                while index in taken:
                    index += 1
                pod = ko.member_pod(js.obj, spec, role, index, node, **self._common())
                self.api.create(pod)  # False: it exists (a lost answer's retry); it is ours by name
                action.created.append(pod["metadata"]["name"])
                taken.add(index)
                js.members[role][index] = pod

    def _wait_ready(self, job: str, names: list[str]) -> dict[str, dict]:
        """Wait until every pod in ``names`` is Ready; TimeoutError if one failed or time ran out."""
        deadline = time.monotonic() + self.cfg.pods.ready_timeout_s
        while True:
            pods = {p["metadata"]["name"]: p for p in self._poll.pods(job)}
            failed = [n for n in names if n in pods and pod_phase(pods[n]) in TERMINAL_PODS]
            if failed:
                raise TimeoutError(f"pods ended before they were Ready: {failed}")
            if all(n in pods and pod_ready(pods[n]) for n in names):
                return {n: pods[n] for n in names}
            if time.monotonic() > deadline:
                missing = [n for n in names if n not in pods or not pod_ready(pods[n])]
                raise TimeoutError(f"pods not Ready within {self.cfg.pods.ready_timeout_s:g} s: {missing}")
            time.sleep(0.2)

    def _scale(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str]]) -> None:
        """Scale-up: create pods, wait Ready, then scale. Scale-down: scale, then delete released pods."""
        ps, workers = action.target
        self._create_members(js, action, nodes)
        if action.created:
            self._wait_ready(js.name, action.created)
        addr = self.address(js)
        assert addr is not None
        try:
            reply = self.coordinators.scale(addr, ps, workers, self.cfg.pods.register_timeout_s + 60)
        except ScaleRefused:
            for name in action.created:  # the coordinator took none of them: no spare pods left behind
                self.api.delete("Pod", name)
                action.deleted.append(name)
            raise
        action.reason = reply.reason or "scaled"
        self._release(js, action)

    def _release(self, js: JobState, action: ScaleAction) -> None:
        """After a scale-down the removed members exit on their own: delete their pods once they have."""
        target = {"ps": action.target[0], "worker": action.target[1]}
        deadline = time.monotonic() + self.cfg.pods.release_timeout_s
        while True:
            pods = self._poll.pods(js.name)
            live = Counter(
                p["metadata"]["labels"][ko.LABEL_ROLE] for p in pods if pod_phase(p) not in TERMINAL_PODS
            )
            done = [
                p
                for p in pods
                if pod_phase(p) in TERMINAL_PODS and p["metadata"]["labels"][ko.LABEL_ROLE] in ko.ROLES
            ]
            for p in done:
                if self.api.delete("Pod", p["metadata"]["name"]):
                    action.deleted.append(p["metadata"]["name"])
            if all(live[r] <= target[r] for r in ko.ROLES) or time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def _trim(self, js: JobState, target: tuple[int, int], report: ApplyReport) -> None:
        """At the target already: delete member pods beyond it that the coordinator left standby (spares of
        an operation that did not finish, e.g. before an agent restart). Reads only when there are none."""
        if js.coord is None or js.coord.operation is not None:
            return
        standby = Counter(m.role for m in js.coord.members if m.state == "standby")
        for role, want in zip(ko.ROLES, target, strict=True):
            ready = sorted(i for i, p in js.live(role).items() if pod_ready(p))
            extra = min(len(js.live(role)) - want, standby[role])
            for i in reversed(ready[-extra:] if extra > 0 else []):
                name = js.members[role][i]["metadata"]["name"]
                if self.api.delete("Pod", name):
                    report.actions.append(
                        ScaleAction(js.name, target, target, True, "spare deleted", deleted=[name])
                    )

    # ---- submit / cancel / status ---------------------------------------------------------------------

    def submit(self, spec: JobSpec, suspend: bool = False) -> dict[str, Any]:
        """Create the DL2Job (refused with :class:`UserError` naming the field)."""
        if not self.nodes.names:
            self.read()
        check_spec(spec, self.catalogue.names, self.nodes.capacity)
        if not self.api.create(ko.dl2job(spec, self.api.namespace, suspend)):
            raise UserError(f"name: a DL2Job named {spec.name!r} already exists in {self.api.namespace}")
        return {"name": spec.name, "job_id": ko.job_id_of(spec.name), "namespace": self.api.namespace}

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

    def poll_pending(self) -> None:
        """Nothing runs between slots here (every apply finishes or times out within its slot)."""
