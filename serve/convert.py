"""The one place where the HTTP messages (:mod:`serve.schemas`) become core types and back.

Server side: :func:`to_view` (request → :class:`~dl2ray.view.ClusterView`,
checking what the schema alone cannot: job types against the catalogue,
node indices, free ≤ capacity, caps, duplicate ids, the size of the view) and
:func:`from_allocation` (Allocation → response items). Client side:
:func:`from_view` and :func:`to_allocation`, their inverses.

A check that fails raises :class:`ViewError` with the offending field's path
inside the request body (``("view", "jobs", 3, "job_type")``); the app turns
it into a 422 in FastAPI's validation-error format.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dl2ray.jobspec import TaskDemand
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Observation, Tasks
from dl2ray.workload import JobCatalogue
from serve.schemas import MAX_NODES, JobAllocation, JobState, NodeState, ObservationIn, Resources, ViewIn

Loc = tuple[str | int, ...]


class ViewError(ValueError):
    """A request that is well-formed but inconsistent; ``loc`` is the field's path in the body."""

    def __init__(self, loc: Loc, msg: str, value: object = None) -> None:
        super().__init__(f"{'.'.join(map(str, loc))}: {msg}")
        self.loc, self.msg, self.value = loc, msg, value


RESOLUTION = 1e-6
"""Smallest non-zero amount of a resource (cores, GPUs, GB) and of observed epochs and seconds: below it,
ratios (shares, speeds) leave the floating-point range the schedulers compute in."""


def _check_amounts(loc: Loc, values: np.ndarray) -> None:
    """``values`` of shape (3,) or (N, 3): the first amount in (0, RESOLUTION) raises. A ``"{}"`` in
    ``loc`` stands for the row index (``("view", "nodes", "{}", "capacity")``)."""
    tiny = (values > 0) & (values < RESOLUTION)
    if tiny.any():
        *row, r = (int(i) for i in np.argwhere(tiny)[0])
        v = float(values[(*row, r)])
        at = tuple(row[0] if part == "{}" else part for part in loc) if row else loc
        raise ViewError((*at, ("cpu", "gpu", "mem")[r]),
                        f"{v} is below the resolution {RESOLUTION} (use 0 or more)", v)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _nodes(nodes: Sequence[NodeState]) -> tuple[np.ndarray, np.ndarray]:
    """Per node (run lengths expanded): capacity and free, shape (N, 3), read-only."""
    cap = np.array([(n.capacity.cpu, n.capacity.gpu, n.capacity.mem) for n in nodes], dtype=np.float64)
    _check_amounts(("view", "nodes", "{}", "capacity"), cap)
    free = np.array([(n.capacity.cpu, n.capacity.gpu, n.capacity.mem) if n.free is None
                     else (n.free.cpu, n.free.gpu, n.free.mem) for n in nodes], dtype=np.float64)
    _check_amounts(("view", "nodes", "{}", "free"), free)
    over = free > cap
    if over.any():
        i, r = (int(k) for k in np.argwhere(over)[0])
        raise ViewError(("view", "nodes", i, "free", ("cpu", "gpu", "mem")[r]),
                        f"free {free[i, r]} exceeds the node's capacity {cap[i, r]}", float(free[i, r]))
    counts = np.array([n.count for n in nodes])
    if counts.sum() > MAX_NODES:
        raise ViewError(("view", "nodes"), f"{int(counts.sum())} nodes; at most {MAX_NODES} per view", None)
    if (counts > 1).any():
        cap, free = np.repeat(cap, counts, axis=0), np.repeat(free, counts, axis=0)
    return _readonly(cap), _readonly(free)


def _check_nodes(loc: Loc, nodes: list[int], count: int, what: str, num_nodes: int) -> tuple[int, ...]:
    if not nodes:
        return ()
    if len(nodes) != count:
        raise ViewError(loc, f"{len(nodes)} nodes listed for {count} {what}: give one per task or none",
                        nodes)
    if min(nodes) < 0 or max(nodes) >= num_nodes:  # one pass in C; the loop below only names the culprit
        for k, n in enumerate(nodes):
            if not 0 <= n < num_nodes:
                raise ViewError((*loc, k), f"node {n} is not in the view (nodes 0..{num_nodes - 1})", n)
    return tuple(nodes)


def _demand(loc: Loc, d: TaskDemand | None, default: np.ndarray) -> np.ndarray:
    """The task demand as a shape-(3,) array: the catalogue's own (no allocation) when
    the request repeats the type's default, as the client does for every job."""
    if d is None:
        return default
    if d.cpu == default[0] and d.gpu == default[1] and d.mem == default[2]:
        return default
    a = d.as_array()
    if any(0 < v < RESOLUTION for v in (d.cpu, d.gpu, d.mem)):
        _check_amounts(loc, a)
    return _readonly(a)


def _job(loc: Loc, job: JobState, catalogue: JobCatalogue, num_nodes: int) -> JobView:
    try:
        ti = catalogue.index(job.job_type)
    except KeyError:
        raise ViewError((*loc, "job_type"), f"unknown job type {job.job_type!r}; known: "
                        f"{list(catalogue.names)}", job.job_type) from None
    jt = catalogue.types[ti]
    for k, o in enumerate(job.history):
        if 0 < o.epochs < RESOLUTION or 0 < o.seconds < RESOLUTION:
            name, v = ("epochs", o.epochs) if 0 < o.epochs < RESOLUTION else ("seconds", o.seconds)
            raise ViewError((*loc, "history", k, name), f"{v} is below the resolution {RESOLUTION} "
                            "(use 0 or more)", v)
    max_w = jt.max_workers if job.max_workers is None else job.max_workers
    max_p = jt.max_ps if job.max_ps is None else job.max_ps
    if job.workers > max_w:
        raise ViewError((*loc, "workers"), f"{job.workers} workers exceed the cap max_workers={max_w}",
                        job.workers)
    if job.ps > max_p:
        raise ViewError((*loc, "ps"), f"{job.ps} PS exceed the cap max_ps={max_p}", job.ps)
    return JobView(
        job_id=job.job_id, job_type=jt.name, type_index=ti, arrival_slot=job.arrival_slot,
        slots_run=job.slots_run, est_epochs=job.est_epochs, done_epochs=job.done_epochs,
        workers=job.workers, ps=job.ps,
        worker_nodes=_check_nodes((*loc, "worker_nodes"), job.worker_nodes, job.workers, "workers",
                                  num_nodes),
        ps_nodes=_check_nodes((*loc, "ps_nodes"), job.ps_nodes, job.ps, "PS", num_nodes),
        worker_demand=_demand((*loc, "worker_demand"), job.worker_demand, catalogue.worker_demand[ti]),
        ps_demand=_demand((*loc, "ps_demand"), job.ps_demand, catalogue.ps_demand[ti]),
        max_workers=max_w, max_ps=max_p,
        history=tuple([Observation(o.slot, o.ps, o.workers, o.epochs, o.seconds, o.loss)
                       for o in job.history]),
        requested_bundles=job.requested_bundles,
    )


def to_view(view: ViewIn, catalogue: JobCatalogue, default_placement: str, max_jobs: int) -> ClusterView:
    """The request's view as a :class:`ClusterView` over ``catalogue``; :class:`ViewError` if inconsistent."""
    if len(view.jobs) > max_jobs:
        raise ViewError(("view", "jobs"), f"{len(view.jobs)} jobs; this endpoint decides at most {max_jobs} "
                        "per request", len(view.jobs))
    cap, free = _nodes(view.nodes)
    if not cap.any():
        raise ViewError(("view", "nodes"), "no node has any capacity: nothing to schedule on", None)
    jobs, seen = [], set()
    for i, job in enumerate(view.jobs):
        if job.job_id in seen:
            raise ViewError(("view", "jobs", i, "job_id"), f"job id {job.job_id} appears twice", job.job_id)
        seen.add(job.job_id)
        jobs.append(_job(("view", "jobs", i), job, catalogue, len(cap)))
    return ClusterView(view.slot, view.slot_seconds, cap, free, tuple(jobs), catalogue,
                       view.placement or default_placement)


def from_allocation(alloc: Allocation) -> list[JobAllocation]:
    """Response items in the allocation's job order (the order a backend places them in)."""
    out = []
    for job_id, t in alloc.tasks.items():
        p = alloc.placement.get(job_id) if alloc.placement is not None else None
        # built without validation: every field is an int (or a list of ints) made here
        out.append(JobAllocation.model_construct(
            job_id=int(job_id), workers=int(t.workers), ps=int(t.ps),
            worker_nodes=None if p is None else [int(n) for n in p.worker_nodes],
            ps_nodes=None if p is None else [int(n) for n in p.ps_nodes]))
    return out


# -- client side ---------------------------------------------------------------------------------


def _resources(row: np.ndarray) -> Resources:
    return Resources(cpu=float(row[0]), gpu=float(row[1]), mem=float(row[2]))


def _node_runs(capacity: np.ndarray, free: np.ndarray) -> list[NodeState]:
    """Consecutive identical nodes as one entry with a ``count`` (a 500-node cluster of one kind: 1 entry)."""
    rows = np.concatenate([capacity, free], axis=1)
    starts = [0, *(np.flatnonzero((rows[1:] != rows[:-1]).any(axis=1)) + 1).tolist()]
    out = []
    for k, i in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(rows)
        same = bool((capacity[i] == free[i]).all())
        out.append(NodeState(capacity=_resources(capacity[i]), free=None if same else _resources(free[i]),
                             count=end - i))
    return out


def _observations(job, history: bool | str) -> tuple:
    """The observations of ``job`` that :func:`from_view` sends."""
    if history == "recent":
        from dl2ray.policy.shape import SLOWNESS_SLOTS

        trained = [o for o in job.history if o.epochs > 0 and o.seconds > 0]
        return tuple(trained[-SLOWNESS_SLOTS:])
    return job.history if history else ()


def from_view(view: ClusterView, history: bool | str = True) -> ViewIn:
    """The request body's view for ``view`` (every field explicit, so the server's defaults do not matter).

    ``history``: True sends every observation; ``"recent"`` only each job's last
    :data:`~dl2ray.policy.shape.SLOWNESS_SLOTS` observations that trained (all the DL2 policies read: the
    shape policy's observed slowness, the paper policy's last speed; the body stays small);
    False none.
    """
    nodes = _node_runs(view.capacity, view.free)
    jobs = [JobState(
        job_id=j.job_id, job_type=j.job_type, arrival_slot=j.arrival_slot, slots_run=j.slots_run,
        est_epochs=float(j.est_epochs), done_epochs=float(j.done_epochs), workers=j.workers, ps=j.ps,
        worker_nodes=list(j.worker_nodes), ps_nodes=list(j.ps_nodes),
        worker_demand=TaskDemand.of(j.worker_demand), ps_demand=TaskDemand.of(j.ps_demand),
        max_workers=j.max_workers, max_ps=j.max_ps,
        history=[ObservationIn(slot=o.slot, ps=o.ps, workers=o.workers, epochs=float(o.epochs),
                               seconds=float(o.seconds), loss=float(o.loss))
                 for o in _observations(j, history)],
        requested_bundles=j.requested_bundles,
    ) for j in view.jobs]
    return ViewIn(slot=view.slot, slot_seconds=float(view.slot_seconds), nodes=nodes, jobs=jobs,
                  placement=view.placement)  # type: ignore[arg-type]  # a PlacementName by construction


def to_allocation(items: Sequence[JobAllocation]) -> Allocation:
    """The response's allocation as an :class:`Allocation` (with placement when every job has nodes)."""
    tasks = {a.job_id: Tasks(a.workers, a.ps) for a in items}
    placed = all(a.worker_nodes is not None and a.ps_nodes is not None for a in items)
    placement = ({a.job_id: JobPlacement(tuple(a.worker_nodes or ()), tuple(a.ps_nodes or ())) for a in items}
                 if placed else None)
    return Allocation(tasks, placement)
