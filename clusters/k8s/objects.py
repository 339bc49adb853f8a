"""What a DL2Job becomes on Kubernetes, as plain dicts: the CRD, the job's pods and Service, RBAC, the agent.

Nothing here talks to an API server (that is :mod:`clusters.k8s.api`, the
one module that imports ``kubernetes``); everything is a pure function of the
job spec and the config, so ``dl2ray k8s render`` prints exactly the objects
the backend creates, and the tests validate them offline.

**The custom resource** ``DL2Job`` (``dl2ray.io/v1alpha1``, namespaced): its
``spec`` is :class:`~dl2ray.jobspec.JobSpec` (one source of truth: the CRD's
OpenAPI schema is generated from the pydantic model by :func:`openapi_schema`)
plus ``suspend`` (as a ``batch/v1`` Job's: a suspended job runs no workers;
Kueue admits a job by setting it to false). ``spec.name`` may be left out: the
object's ``metadata.name`` is the job name.

**A job's objects** (names are deterministic, so a create repeated after a
lost answer gets 409 instead of a duplicate):

* ``<job>-coordinator``: the elastic MXNet coordinator pod
  (``python -m clusters.k8s.coordinator``) and a Service of the same name in
  front of its port;
* ``<job>-ps-<i>`` and ``<job>-worker-<i>``: one pod per PS
  (``python -m elastic_mxnet.server``) and per worker
  (``python -m elastic_mxnet.demo_train`` with the spec's arguments), each
  requesting the spec's per-task demand and pinned to its node by required
  node affinity. New members take the lowest free index.

Every pod carries the labels ``dl2ray.io/job``, ``dl2ray.io/role``,
``dl2ray.io/index`` and an owner reference to its DL2Job (``controller:
true``), so deleting the DL2Job lets the garbage collector delete the pods.
Members reach the coordinator through the Service's environment variables
(``<JOB>_COORDINATOR_SERVICE_HOST``/``_PORT``, expanded by the kubelet in
``$(VAR)`` references) and bind their data port on the pod IP (downward API).
"""

from __future__ import annotations

import copy
import zlib
from typing import Any

from clusters.k8s.schema import custom_resource_definition, model_openapi
from dl2ray.jobspec import JobSpec, TaskDemand

GROUP = "dl2ray.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DL2Job"
PLURAL = "dl2jobs"
SINGULAR = "dl2job"
SHORT_NAMES = ["dl2j"]

LABEL_JOB = "dl2ray.io/job"
LABEL_ROLE = "dl2ray.io/role"
LABEL_INDEX = "dl2ray.io/index"
MANAGED_BY = {"app.kubernetes.io/managed-by": "dl2ray"}
ROLES = ("ps", "worker")
GPU = "nvidia.com/gpu"
MEMBER_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
"""One core's worth of threads per member process (tasks declare fractional cores)."""

Obj = dict[str, Any]


def coordinator_name(job: str) -> str:
    return f"{job}-coordinator"


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def service_env_prefix(job: str) -> str:
    """The kubelet's service-link variable prefix for the job's coordinator Service."""
    return coordinator_name(job).upper().replace("-", "_")


# ---- the CRD -------------------------------------------------------------------------------------

PRIORITY_FIELD = "priorityClassName"
"""The DL2Job spec's name of :attr:`JobSpec.priority` (Kubernetes' word for a pod's priority class)."""


def openapi_schema() -> Obj:
    """The DL2Job ``spec`` schema: :class:`JobSpec`'s, with ``name`` optional, ``priority`` named
    ``priorityClassName`` and ``suspend`` added."""
    spec = model_openapi(JobSpec)
    spec["required"] = [r for r in spec.get("required", []) if r != "name"]
    props = spec["properties"]
    spec["properties"] = {(PRIORITY_FIELD if k == "priority" else k): v for k, v in props.items()}
    spec["properties"]["name"]["description"] += " (default: metadata.name; must equal it if given)"
    spec["properties"]["suspend"] = {
        "type": "boolean",
        "default": False,
        "description": "true: run no workers (like a batch/v1 Job's suspend; Kueue admits by clearing it)",
    }
    spec["description"] = "The training job: dl2ray.jobspec.JobSpec plus suspend."
    return spec


def _counts() -> Obj:
    return {
        "type": "object",
        "properties": {
            "desired": {"type": "integer", "description": "of the scheduler's last allocation"},
            "ready": {"type": "integer", "description": "in the coordinator's plan"},
        },
    }


def _status_schema() -> Obj:
    return {
        "type": "object",
        "description": "Written by the dl2ray agent.",
        "properties": {
            "phase": {
                "type": "string",
                "enum": ["Pending", "Running", "Suspended", "Succeeded", "Failed", "Invalid"],
            },
            "jobId": {"type": "integer"},
            "epochsDone": {"type": "number"},
            "estEpochs": {"type": "number"},
            "ps": _counts(),
            "workers": _counts(),
            "coordinator": {"type": "string", "description": "tcp://IP:PORT of the coordinator pod"},
            "submittedAt": {"type": "number", "description": "Unix seconds the agent first saw the job"},
            "finishedAt": {"type": "number", "description": "Unix seconds the agent saw it end"},
            "mark": {
                "type": "object",
                "description": "start of the slot in progress: slot, time, epochs",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "history": {
                "type": "array",
                "description": "per-slot observations (last 20)",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "scalingEvents": {
                "type": "array",
                "description": "the coordinator's last scaling events",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "replaced": {"type": "integer", "description": "member pods that failed or were evicted"},
            "conditions": {
                "type": "array",
                "description": "Valid, Created, Running, Suspended, Finished (docs/kubernetes.md)",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": {"type": "string"},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                    },
                },
            },
        },
    }


def crd() -> Obj:
    """The ``CustomResourceDefinition`` of DL2Job (configs/k8s/crd.yaml is this, written out)."""
    columns: list[Obj] = [
        {"name": "State", "type": "string", "jsonPath": ".status.phase",
         "description": "Pending, Running, Suspended, Succeeded, Failed or Invalid"},
        {"name": "Queue", "type": "string", "jsonPath": ".spec.queue",
         "description": "its queue on a shared cluster (a DL2Queue)"},
        {"name": "PS", "type": "integer", "jsonPath": ".status.ps.ready",
         "description": "parameter servers in the coordinator's plan"},
        {"name": "Workers", "type": "integer", "jsonPath": ".status.workers.ready",
         "description": "workers in the coordinator's plan"},
        {"name": "Epochs", "type": "number", "jsonPath": ".status.epochsDone",
         "description": "epochs trained"},
        {"name": "Desired PS", "type": "integer", "jsonPath": ".status.ps.desired", "priority": 1,
         "description": "parameter servers of the scheduler's last allocation"},
        {"name": "Desired Workers", "type": "integer", "jsonPath": ".status.workers.desired", "priority": 1,
         "description": "workers of the scheduler's last allocation"},
        {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return custom_resource_definition(
        group=GROUP, version=VERSION, kind=KIND, plural=PLURAL, singular=SINGULAR, short_names=SHORT_NAMES,
        scope="Namespaced", description="A dl2ray training job (PS, workers: pods).", spec=openapi_schema(),
        status=_status_schema(), columns=columns, labels=MANAGED_BY, categories=["all"])


def dl2job(spec: JobSpec, namespace: str = "default", suspend: bool = False) -> Obj:
    """The DL2Job object of a job spec (what ``dl2ray submit --k8s`` creates)."""
    body = spec.model_dump(mode="json", exclude_defaults=False)
    body.pop("name")
    for field in ("queue", "priority"):  # only where set: a job of one pool says nothing of queues
        if body[field] is None:
            del body[field]
    if "priority" in body:
        body[PRIORITY_FIELD] = body.pop("priority")
    if suspend:
        body["suspend"] = True
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": body,
    }


def spec_of(obj: Obj) -> tuple[dict[str, Any], bool]:
    """A DL2Job's ``spec`` as a JobSpec document (``name`` from metadata, ``priorityClassName`` as
    ``priority``) and its ``suspend``."""
    raw = dict(obj.get("spec") or {})
    suspend = bool(raw.pop("suspend", False))
    if PRIORITY_FIELD in raw:
        raw["priority"] = raw.pop(PRIORITY_FIELD)
    raw.setdefault("name", obj["metadata"]["name"])
    return raw, suspend


def event(job_obj: Obj, reason: str, message: str, type_: str, key: str, now: str) -> Obj:
    """A core/v1 Event on a DL2Job, named from its job's uid, ``reason`` and ``key`` (so the same
    occurrence written twice is one Event: the second create gets 409). ``now``: RFC 3339."""
    meta = job_obj["metadata"]
    digest = f"{zlib.crc32((meta.get('uid', '') + reason + key).encode()) & 0xFFFFFFFF:08x}"
    namespace = meta.get("namespace", "default")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{digest}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": meta["name"],
            "namespace": namespace,
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message[:1000],
        "type": type_,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "dl2ray-agent"},
        "reportingComponent": "dl2ray-agent",
    }


# ---- a job's pods ---------------------------------------------------------------------------------


def owner_ref(job_obj: Obj) -> Obj:
    meta = job_obj["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def resources(demand: TaskDemand) -> Obj:
    """Requests (and limits where Kubernetes needs them: GPUs) for one task's demand."""
    req = {"cpu": f"{round(demand.cpu * 1000)}m", "memory": f"{round(demand.mem * 1024)}Mi"}
    out: Obj = {"requests": req}
    if demand.gpu:
        req[GPU] = str(int(demand.gpu))
        out["limits"] = {GPU: str(int(demand.gpu))}
    return out


def _meta(job_obj: Obj, name: str, role: str, index: int | None) -> Obj:
    labels = {**MANAGED_BY, LABEL_JOB: job_obj["metadata"]["name"], LABEL_ROLE: role}
    if index is not None:
        labels[LABEL_INDEX] = str(index)
    return {
        "name": name,
        "namespace": job_obj["metadata"].get("namespace", "default"),
        "labels": labels,
        "ownerReferences": [owner_ref(job_obj)],
    }


def _env(extra: dict[str, str]) -> list[Obj]:
    env: list[Obj] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    env += [{"name": k, "value": v} for k, v in {**MEMBER_ENV, **extra}.items()]
    return env


def _pod(
    meta: Obj,
    image: str,
    pull: str,
    command: list[str],
    env: list[Obj],
    res: Obj,
    node: str | None,
    ports: list[Obj] | None = None,
    probe: Obj | None = None,
) -> Obj:
    container: Obj = {
        "name": meta["labels"][LABEL_ROLE],
        "image": image,
        "imagePullPolicy": pull,
        "command": command,
        "env": env,
        "resources": res,
    }
    if ports:
        container["ports"] = ports
    if probe:
        container["readinessProbe"] = probe
    spec: Obj = {
        "restartPolicy": "Never",
        "enableServiceLinks": True,
        "containers": [container],
        "terminationGracePeriodSeconds": 10,
    }
    if node is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def coordinator_command(
    spec: JobSpec,
    ps: int,
    workers: int,
    python: str,
    port: int,
    heartbeat_timeout_s: float,
    register_timeout_s: float,
) -> list[str]:
    return [
        python,
        "-m",
        "clusters.k8s.coordinator",
        "--host",
        "$(POD_IP)",
        "--port",
        str(port),
        "--ps",
        str(ps),
        "--workers",
        str(workers),
        "--max-ps",
        str(spec.ps_count.max),
        "--max-workers",
        str(spec.workers.max),
        "--heartbeat-timeout",
        repr(heartbeat_timeout_s),
        "--register-timeout",
        repr(register_timeout_s),
    ]


def member_command(spec: JobSpec, role: str, python: str) -> list[str]:
    if role == "ps":
        return [python, "-m", "elastic_mxnet.server", "--host", "$(POD_IP)"]
    return [python, "-m", "elastic_mxnet.demo_train", *spec.worker_args()]


def coordinator_objects(
    job_obj: Obj,
    spec: JobSpec,
    ps: int,
    workers: int,
    *,
    image: str,
    pull: str,
    python: str,
    port: int,
    heartbeat_timeout_s: float,
    register_timeout_s: float,
    node: str | None = None,
) -> tuple[Obj, Obj]:
    """The coordinator pod (started for ``ps``/``workers`` initial members) and its Service."""
    name = coordinator_name(spec.name)
    meta = _meta(job_obj, name, "coordinator", None)
    cmd = coordinator_command(spec, ps, workers, python, port, heartbeat_timeout_s, register_timeout_s)
    probe = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    res = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    pod = _pod(
        meta,
        image,
        pull,
        cmd,
        _env({}),
        res,
        node,
        [{"name": "coordinator", "containerPort": port, "protocol": "TCP"}],
        probe,
    )
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": copy.deepcopy(meta),
        "spec": {
            "selector": {LABEL_JOB: spec.name, LABEL_ROLE: "coordinator"},
            "ports": [{"name": "coordinator", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
    return pod, svc


def member_pod(
    job_obj: Obj,
    spec: JobSpec,
    role: str,
    index: int,
    node: str | None,
    *,
    image: str,
    pull: str,
    python: str,
) -> Obj:
    """Pod of one PS or worker (``role``) with index ``index``, pinned to ``node``."""
    prefix = service_env_prefix(spec.name)
    coord = f"tcp://$({prefix}_SERVICE_HOST):$({prefix}_SERVICE_PORT)"
    meta = _meta(job_obj, pod_name(spec.name, role, index), role, index)
    demand = spec.ps if role == "ps" else spec.worker
    return _pod(
        meta,
        image,
        pull,
        member_command(spec, role, python),
        _env({"ELASTIC_MXNET_COORDINATOR": coord}),
        resources(demand),
        node,
    )


def render(
    job_obj: Obj,
    spec: JobSpec,
    ps: int,
    workers: int,
    nodes: list[str] | None,
    *,
    image: str,
    pull: str = "IfNotPresent",
    python: str = "python",
    port: int = 5555,
    heartbeat_timeout_s: float = 5.0,
    register_timeout_s: float = 60.0,
) -> list[Obj]:
    """Every object the job becomes when it runs with ``ps`` PS and ``workers`` workers (``nodes``: the
    node of each PS then each worker, or None for no pinning)."""
    pod, svc = coordinator_objects(
        job_obj,
        spec,
        ps,
        workers,
        image=image,
        pull=pull,
        python=python,
        port=port,
        heartbeat_timeout_s=heartbeat_timeout_s,
        register_timeout_s=register_timeout_s,
    )
    out = [svc, pod]
    roles = ["ps"] * ps + ["worker"] * workers
    seen = {"ps": 0, "worker": 0}
    for k, role in enumerate(roles):
        node = nodes[k] if nodes else None
        out.append(member_pod(job_obj, spec, role, seen[role], node, image=image, pull=pull, python=python))
        seen[role] += 1
    return out


# ---- quantities -----------------------------------------------------------------------------------

_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity(q: str | int | float | None) -> float:
    """A Kubernetes quantity (``"500m"``, ``"16Gi"``, ``"2"``, ``"1e3"``) as a number."""
    if q is None:
        return 0.0
    if isinstance(q, int | float):
        return float(q)
    s = str(q).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and s.endswith(suffix):
            return float(s[: -len(suffix)]) * _SUFFIX[suffix]
    return float(s)


def triple(res: dict[str, Any] | None) -> tuple[float, float, float]:
    """``(cpu cores, GPUs, memory GB)`` of a resource list (allocatable or requests); GB = 2^30 bytes."""
    res = res or {}
    return (quantity(res.get("cpu")), quantity(res.get(GPU)), quantity(res.get("memory")) / 2.0**30)
