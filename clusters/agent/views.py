"""A job of a live cluster as the scheduler sees it: one builder of :class:`~dl2ray.view.JobView` for every
backend, and the job id every backend uses. (Where a waiting job stands and why it waits:
:mod:`clusters.agent.waiting`.)"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

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
    (indices into the view's nodes), its per-slot observations, progress capped at the declared epochs,
    its queue and priority class on a shared cluster."""
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
        history=hist, queue=spec.queue, priority=spec.priority)
