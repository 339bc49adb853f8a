"""A job host's durable record in the Ray cluster's own key-value store (GCS), for a host restart.

A job host (:mod:`clusters.ray.job`) keeps what its members cannot tell it
again — its state, the coordinator's address, the slot observations, the scale
calls, the scaling events so far and the agent's slot clock it pushes its
readings at (:mod:`clusters.ray.readings`) — under ``job/<name>`` in the ``dl2ray``
namespace of Ray's internal KV store (the GCS, where Ray keeps its own job
records), written on every change. When Ray restarts the host
(``max_restarts``), ``__init__`` reads it back and re-adopts the members
(:meth:`clusters.ray.spawner.RaySpawner.adopt`); the record lives as long as the
Ray cluster and is deleted when the job is removed or the cluster goes down.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field
from ray.experimental import internal_kv

from clusters.ray.messages import ScaleCall, SlotObservation
from elastic_mxnet.protocol.messages import ScalingEvent

KV_NAMESPACE = "dl2ray"


class SlotClock(BaseModel):
    """The agent's slots as a host follows them. Slot ``k`` starts at ``epoch + k · slot_seconds``; the host
    pushes the reading of slot ``k`` (having closed slot ``k - 1``) ``lead_s`` seconds before that."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epoch: float = Field(description="Unix time (s) of slot 0's start")
    slot_seconds: float = Field(gt=0, description="slot length (s)")
    lead_s: float = Field(default=0.0, ge=0, description="push this long before each slot starts (s)")

    def push_time(self, slot: int) -> float:
        """Unix time (s) at which the reading of ``slot`` is pushed."""
        return self.epoch + slot * self.slot_seconds - self.lead_s

    def next_slot(self, now: float) -> int:
        """The first slot whose push time is after ``now``."""
        return math.floor((now + self.lead_s - self.epoch) / self.slot_seconds) + 1


class HostRecord(BaseModel):
    """What a restarted host needs back. Times are Unix seconds."""

    model_config = ConfigDict(extra="forbid")

    state: str = Field(description="pending | running | paused | finished | failed | cancelled")
    reason: str = ""
    coordinator: str | None = Field(default=None, description="tcp://host:port of the job's coordinator")
    started_at: float | None = None
    finished_at: float | None = None
    restarts: int = Field(default=0, ge=0, description="host restarts so far")
    history: list[SlotObservation] = Field(default_factory=list, description="one per slot marked")
    actions: list[ScaleCall] = Field(default_factory=list, description="every scale call")
    events: list[ScalingEvent] = Field(default_factory=list, description="scaling events, as last read")
    clock: SlotClock | None = Field(default=None, description="the slots the host pushes its readings at "
                                    "(clusters/ray/readings.py); None: no agent has asked for them")


def _key(job: str) -> bytes:
    return f"job/{job}".encode()


def reading_key(job: str) -> bytes:
    """The key of the host's last pushed reading (:mod:`clusters.ray.readings`), beside its record."""
    return f"reading/{job}".encode()


def save_record(job: str, record: HostRecord) -> None:
    internal_kv._internal_kv_put(_key(job), record.model_dump_json().encode(), overwrite=True,
                                 namespace=KV_NAMESPACE)


def load_record(job: str) -> HostRecord | None:
    raw = internal_kv._internal_kv_get(_key(job), namespace=KV_NAMESPACE)
    return None if raw is None else HostRecord.model_validate_json(raw)


def delete_record(job: str) -> None:
    """The record and the host's last pushed reading (:mod:`clusters.ray.readings`)."""
    internal_kv._internal_kv_del(_key(job), namespace=KV_NAMESPACE)
    internal_kv._internal_kv_del(reading_key(job), namespace=KV_NAMESPACE)


def record_names() -> list[str]:
    """Jobs with a record (``cluster down`` deletes them all)."""
    keys = internal_kv._internal_kv_list(b"job/", namespace=KV_NAMESPACE)
    return [k.decode()[len("job/"):] for k in keys]
