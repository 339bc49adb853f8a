"""Host-pushed slot readings: each job host writes its brief status, the agent reads them all in one call.

The agent's view used to ask every job host for its status at the start of the
slot and wait for the answers (an actor call per host, each a ZeroMQ round trip
to the job's coordinator, on the control loop's critical path). Like a
Kubernetes controller reading from an informer's cache, the agent now reads
what the hosts have already published:

* A job host that follows the agent's slot clock (:class:`~clusters.ray.record.SlotClock`: ``epoch``,
  ``slot_seconds``, ``lead_s``, handed to it by the backend's first direct read
  and kept in its record, so a restarted host resumes) closes its own slot
  ``lead_s`` seconds before each slot starts and writes its *reading* under
  ``reading/<name>``: the brief status of
  :meth:`~clusters.ray.job.JobHostImpl.slot_status` (no spec, the last
  :data:`TAIL` slot observations), labelled with the slot it opens (``slot``)
  and the time it was written (``pushed_at``). It writes one again whenever it
  learns of a change (a scale call done, a cancel, the job's end, any status
  read), so the stored reading is always the host's latest knowledge.
* The backend reads every known job's reading with one multi-get
  (:func:`get_readings`).

**Where the readings live: the GCS key-value store** (namespace ``dl2ray``, the
store of the hosts' records, :mod:`clusters.ray.record`), not the agent actor.
One ``internal_kv_multi_get`` is one RPC to the GCS for every job, whoever
reads: the agent actor, a backend in a driver (the tests, ``bench
live-scale``), a restarted agent. A reading outlives the agent (nothing to
recover, level-triggered: the agent holds no state it must rebuild) and a
host's restart (the reading stays until the next one). Pushing into the agent
actor instead (a method in a concurrency group of its own) would make the read
a dictionary lookup, but every push would be an actor call into the process
that runs the control loop, at the moment the loop runs; a backend without an
agent actor would have no one to push to; and a restarted agent would start
empty. One GCS round trip per slot is the price.
"""

from __future__ import annotations

import json

from ray.experimental import internal_kv

from clusters.ray.messages import PushedReading
from clusters.ray.record import KV_NAMESPACE, reading_key

TAIL = 4
"""Slot observations in a pushed reading: the last ones (a reader that missed a few readings catches up)."""


def put_reading(job: str, reading: PushedReading) -> None:
    """Store ``job``'s reading (JSON; NaN losses as JSON's ``NaN``), replacing the previous one."""
    internal_kv._internal_kv_put(reading_key(job), json.dumps(reading.to_dict()).encode(), overwrite=True,
                                 namespace=KV_NAMESPACE)


def get_readings(jobs: list[str]) -> dict[str, PushedReading]:
    """The stored readings of ``jobs`` in one GCS call; a job without one is absent."""
    if not jobs:
        return {}
    gcs = internal_kv.internal_kv_get_gcs_client()
    raw = gcs.internal_kv_multi_get([reading_key(j) for j in jobs], KV_NAMESPACE.encode())
    return {j: PushedReading.from_dict(json.loads(raw[reading_key(j)])) for j in jobs
            if raw.get(reading_key(j)) is not None}

