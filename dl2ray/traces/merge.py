"""Several traces as one shared cluster's: each file's jobs in a queue of their own (docs/tenancy.md).

A Philly virtual cluster's segment per queue is how the shared-cluster tables
and the queue-trained policy's training traces are built
(``dl2ray trace merge --queue VC=FILE ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dl2ray.workload import Trace, sort_trace


def merge_queues(traces: Mapping[str, Trace]) -> Trace:
    """The jobs of every ``queue -> trace`` in one trace, each job in its trace's queue, ids renumbered
    0..n-1 in arrival order (ties: by queue name, then the job's old id)."""
    jobs = [replace(j, queue=q) for q, trace in traces.items() for j in trace]
    jobs.sort(key=lambda j: (j.arrival_slot, str(j.queue), j.job_id))
    return sort_trace([replace(j, job_id=i) for i, j in enumerate(jobs)])
