"""DL2Queue: each queue of a shared cluster as a cluster-scoped custom resource, kept by the agent.

The queues are the experiment's ``tenancy:`` (docs/tenancy.md), which the agent's scheduler decides within
(the queue layer, :class:`dl2ray.schedulers.queued.Queued`); a DL2Queue (``dl2ray.io/v1alpha1``,
cluster-scoped, short name ``dl2q``) mirrors one of them for ``kubectl``: its ``spec`` is
:class:`~dl2ray.tenancy.QueueSpec`'s (without the generator's ``share``; the schema is generated from the
model), its ``status`` what the agent's last decision left it (:func:`clusters.agent.queues.queue_rows`):
resources used and borrowed beyond the nominal quota, jobs running and waiting, the slot. The agent
creates the DL2Queues it is missing and sets a spec edited by hand back to its config's (the config is the
source of truth: the queue layer was built from it), and writes a status only when it changed.
``kubectl get dl2queues`` shows the quota against the use (printer columns of :func:`queue_crd`).

A DL2Job names its queue in ``spec.queue`` and its priority class in ``spec.priorityClassName``; one naming
a queue or class the cluster does not have is ``Invalid`` (condition ``Valid=False`` and a Warning event
naming the field, :mod:`clusters.k8s.world`).
"""

from __future__ import annotations

import re
from typing import Any

from clusters.agent.queues import QueueRow
from clusters.k8s.objects import GROUP, MANAGED_BY, VERSION
from clusters.k8s.schema import custom_resource_definition, model_openapi
from dl2ray.errors import UserError
from dl2ray.tenancy import QueueSpec, TenancyConfig

KIND = "DL2Queue"
PLURAL = "dl2queues"
SINGULAR = "dl2queue"
SHORT_NAMES = ["dl2q"]
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
"""What a cluster-scoped object's name may be (a DNS subdomain)."""

Obj = dict[str, Any]


def check_names(tenancy: TenancyConfig) -> None:
    """UserError naming the field when a queue's name cannot name a Kubernetes object."""
    for i, q in enumerate(tenancy.queues):
        if not NAME_RE.match(q.name):
            raise UserError(f"tenancy.queues.{i}.name: {q.name!r} cannot name a DL2Queue "
                            "(lowercase letters, digits, '-' and '.')")


def queue_spec(q: QueueSpec) -> Obj:
    """A DL2Queue's ``spec`` of ``q``: its fields but the name (the object's) and the generator's share."""
    body = q.model_dump(mode="json", exclude={"name", "share"})
    return {k: v for k, v in body.items() if v is not None}


def spec_schema() -> Obj:
    spec = model_openapi(QueueSpec)
    for field in ("name", "share"):
        spec["properties"].pop(field)
    spec["required"] = [r for r in spec.get("required", []) if r not in ("name", "share")]
    spec["description"] = "A queue of the shared cluster: dl2ray.tenancy.QueueSpec (set by the agent)."
    return spec


def _resources(description: str) -> Obj:
    return {"type": "object", "description": description,
            "properties": {r: {"type": "number"} for r in ("cpu", "gpu", "mem")}}


def status_schema() -> Obj:
    return {
        "type": "object",
        "description": "Written by the dl2ray agent after each slot's decision.",
        "properties": {
            "used": _resources("what the queue's jobs hold (cores, GPUs, GB)"),
            "borrowed": _resources("what it holds beyond its nominal quota"),
            "jobs": {"type": "integer", "description": "its jobs not yet ended"},
            "running": {"type": "integer"},
            "waiting": {"type": "integer", "description": "its jobs with no worker (pending or paused)"},
            "slot": {"type": "integer", "description": "the slot of the decision"},
        },
    }


def queue_crd() -> Obj:
    """The ``CustomResourceDefinition`` of DL2Queue (in configs/k8s/crd.yaml beside DL2Job's)."""
    col = [("Cohort", "string", ".spec.cohort", 0),
           ("GPU Quota", "number", ".spec.nominal.gpu", 0), ("GPU Used", "number", ".status.used.gpu", 0),
           ("GPU Borrowed", "number", ".status.borrowed.gpu", 0),
           ("CPU Quota", "number", ".spec.nominal.cpu", 0), ("CPU Used", "number", ".status.used.cpu", 0),
           ("CPU Borrowed", "number", ".status.borrowed.cpu", 0),
           ("Running", "integer", ".status.running", 0), ("Waiting", "integer", ".status.waiting", 0),
           ("Mem Quota", "number", ".spec.nominal.mem", 1), ("Mem Used", "number", ".status.used.mem", 1),
           ("Weight", "number", ".spec.weight", 1)]
    columns = [{"name": n, "type": t, "jsonPath": p, **({"priority": pr} if pr else {})}
               for n, t, p, pr in col]
    columns.append({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
    return custom_resource_definition(
        group=GROUP, version=VERSION, kind=KIND, plural=PLURAL, singular=SINGULAR, short_names=SHORT_NAMES,
        scope="Cluster", description="A queue of a shared dl2ray cluster: its quota and what it uses.",
        spec=spec_schema(), status=status_schema(), columns=columns, labels=MANAGED_BY)


def dl2queue(q: QueueSpec) -> Obj:
    """The DL2Queue object of ``q``."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": q.name, "labels": dict(MANAGED_BY)}, "spec": queue_spec(q)}


def queue_status(row: QueueRow) -> Obj:
    """A DL2Queue's ``status`` of one :class:`~clusters.agent.queues.QueueRow`."""
    return {"used": dict(row.used), "borrowed": dict(row.borrowed), "jobs": row.jobs, "running": row.running,
            "waiting": row.waiting, "slot": row.slot}


def publish(api: Any, tenancy: TenancyConfig, rows: list[QueueRow]) -> int:
    """Bring the DL2Queues in line with ``tenancy`` and ``rows`` (one list call; a create per missing queue,
    a spec patch per queue edited by hand, a status patch per changed status). Returns the writes made."""
    existing = {o["metadata"]["name"]: o for o in api.queues()}
    writes = 0
    for q, row in zip(tenancy.queues, rows, strict=True):
        obj = existing.get(q.name)
        if obj is None:
            api.create(dl2queue(q))
            writes += 1
            obj = {"spec": queue_spec(q), "status": {}}
        elif obj.get("spec") != queue_spec(q):
            api.patch_queue(q.name, {"spec": queue_spec(q)})
            writes += 1
        status = queue_status(row)
        if obj.get("status") != status:
            api.patch_queue(q.name, {"status": status}, subresource="status")
            writes += 1
    return writes
