"""A job of a live cluster as the scheduler sees it: one builder of :class:`~dl2ray.view.JobView` for every
backend, the job id every backend uses, and where a waiting job stands (queue position, wait reason)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl2ray.jobspec import JobSpec
from dl2ray.view import JobView, Observation
from dl2ray.workload import JobCatalogue


def job_id_of(name: str) -> int:
    """The job id the scheduler sees: ``crc32(name)``, stable across agent restarts without a counter."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def live_job_view(name: str, spec: JobSpec, catalogue: JobCatalogue, arrival_slot: int, done_epochs: float,
                  ps_nodes: Iterable[int], worker_nodes: Iterable[int],
                  history: Iterable[Observation]) -> JobView:
    """The view of a live job: its declared epochs and demands, the nodes of its running PS and workers
    (indices into the view's nodes), its per-slot observations, progress capped at the declared epochs."""
    hist = tuple(history)
    wd, pd = spec.worker.as_array(), spec.ps.as_array()
    wd.flags.writeable = False
    pd.flags.writeable = False
    ps, workers = tuple(ps_nodes), tuple(worker_nodes)
    return JobView(
        job_id=job_id_of(name), job_type=spec.job_type, type_index=catalogue.index(spec.job_type),
        arrival_slot=arrival_slot, slots_run=sum(1 for h in hist if h.workers > 0),
        est_epochs=spec.epochs, done_epochs=min(float(done_epochs), spec.epochs),
        workers=len(workers), ps=len(ps), worker_nodes=workers, ps_nodes=ps,
        worker_demand=wd, ps_demand=pd, max_workers=spec.workers.max, max_ps=spec.ps_count.max,
        history=hist)


WAITING = ("pending", "paused")
"""Job states that wait for the scheduler: submitted and never started, or paused (0 workers, 1 PS kept)."""


@dataclass(frozen=True)
class Wait:
    """Where a waiting job stands: ``position`` 1, 2, … among the waiting jobs in submission order (the
    order the view lists them), and why it is not running, in words; both None for a job that runs or
    ended."""

    position: int | None
    reason: str | None


def _short(need: np.ndarray, free: np.ndarray) -> str:
    """``cpu 2 > 0.5 free`` for the first resource of (cpu, gpu, mem GB) that ``need`` exceeds."""
    k = int(np.argmax(need > free + 1e-9))
    return f"{('cpu', 'gpu', 'mem GB')[k]} {need[k]:g} > {free[k]:g} free"


def wait_reasons(statuses: Iterable[dict[str, Any]], free: np.ndarray | None = None) -> dict[str, Wait]:
    """Queue position and wait reason of every job, by name, from the jobs' statuses (the dicts of
    :meth:`~clusters.agent.backend.LiveBackend.statuses`: ``name``, ``state``, ``submitted_at``,
    ``busy``, ``spec``) and, when known, the cluster's free capacity (shape (N, 3): cpu, gpu, mem GB per
    node; the last view's ``free``).

    Reasons: ``starting`` (its first scale call runs), ``no room`` (its smallest deployment,
    ``workers.min`` workers and ``ps_count.min`` PS — only the workers for a paused job, which keeps its
    PS — needs more than the cluster has free in total; the first short resource is named), else
    ``not chosen`` (there is room; the scheduler gave it no workers this slot: other jobs gain more) —
    each prefixed by ``paused`` for a paused job. ``dl2ray jobs list`` and the agent's dashboard both
    show these.
    """
    rows = sorted(statuses, key=lambda s: s["submitted_at"])
    total = None if free is None or len(free) == 0 else np.asarray(free, dtype=np.float64).sum(axis=0)
    out: dict[str, Wait] = {}
    position = 0
    for st in rows:
        if st["state"] not in WAITING:
            out[st["name"]] = Wait(None, None)
            continue
        position += 1
        spec = JobSpec.model_validate(st["spec"]) if isinstance(st["spec"], dict) else st["spec"]
        need = spec.workers.min * spec.worker.as_array()
        if st["state"] == "pending":  # a paused job holds its PS already
            need = need + spec.ps_count.min * spec.ps.as_array()
        if st.get("busy"):
            why = "starting: its first members are starting" if st["state"] == "pending" else \
                "resuming: its workers are starting"
        elif total is not None and (need > total + 1e-9).any():
            why = f"no room: its smallest deployment needs {_short(need, total)}"
        else:
            why = "not chosen: the scheduler gave it no workers this slot"
        out[st["name"]] = Wait(position, f"paused; {why}" if st["state"] == "paused" else why)
    return out
