"""A job host's durable record in the Ray cluster's own key-value store (GCS), for a host restart.

A job host (:mod:`clusters.ray.job`) keeps what its members cannot tell it
again — its state, the coordinator's address, the slot observations, the scale
calls and the scaling events so far — under ``job/<name>`` in the ``dl2ray``
namespace of Ray's internal KV store (the GCS, where Ray keeps its own job
records), written on every change. When Ray restarts the host
(``max_restarts``), ``__init__`` reads it back and re-adopts the members
(:meth:`clusters.ray.spawner.RaySpawner.adopt`); the record lives as long as the
Ray cluster and is deleted when the job is removed or the cluster goes down.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray.experimental import internal_kv

KV_NAMESPACE = "dl2ray"


class HostRecord(BaseModel):
    """What a restarted host needs back. Times are Unix seconds."""

    model_config = ConfigDict(extra="forbid")

    state: str = Field(description="pending | running | paused | finished | failed | cancelled")
    reason: str = ""
    coordinator: str | None = Field(default=None, description="tcp://host:port of the job's coordinator")
    started_at: float | None = None
    finished_at: float | None = None
    restarts: int = Field(default=0, ge=0, description="host restarts so far")
    history: list[dict[str, Any]] = Field(default_factory=list, description="one per slot marked")
    actions: list[dict[str, Any]] = Field(default_factory=list, description="every scale call")
    events: list[dict[str, Any]] = Field(default_factory=list, description="scaling events, as last read")


def _key(job: str) -> bytes:
    return f"job/{job}".encode()


def save_record(job: str, record: HostRecord) -> None:
    internal_kv._internal_kv_put(_key(job), record.model_dump_json().encode(), overwrite=True,
                                 namespace=KV_NAMESPACE)


def load_record(job: str) -> HostRecord | None:
    raw = internal_kv._internal_kv_get(_key(job), namespace=KV_NAMESPACE)
    return None if raw is None else HostRecord.model_validate_json(raw)


def delete_record(job: str) -> None:
    internal_kv._internal_kv_del(_key(job), namespace=KV_NAMESPACE)


def record_names() -> list[str]:
    """Jobs with a record (``cluster down`` deletes them all)."""
    keys = internal_kv._internal_kv_list(b"job/", namespace=KV_NAMESPACE)
    return [k.decode()[len("job/"):] for k in keys]
