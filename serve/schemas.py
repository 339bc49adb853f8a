"""The HTTP messages of the decision endpoint (pydantic): shared by the app, the client and OpenAPI.

A request carries one cluster view (nodes, jobs) in the terms of
:class:`dl2ray.view.ClusterView`; a response carries the allocation of
:class:`dl2ray.view.Allocation` and says which scheduler and which policy
version produced it. :mod:`serve.convert` is the only place that turns these
into the core types and back.

Units: resources in cores, GPUs and GB (:class:`dl2ray.jobspec.TaskDemand`);
slots and epochs as in the simulator. Bounds on every number keep a request
inside what the decision loop can represent (int64 node and job ids, finite
floats), so a body that passes the schema never reaches the loop as garbage.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dl2ray.jobspec import TaskDemand

MAX_COUNT = 1_000_000  # tasks, slots, ids of nodes: far above any cluster, far below int64
MAX_ID = 2**53  # job ids: exact in a JSON number read as a double
MAX_AMOUNT = 1e9  # cores / GPUs / GB on one node
MAX_EPOCHS = 1e12
MAX_NODES = 100_000  # nodes in one view, counts included

PlacementName = Literal["load_balancing", "packing", "optimus", "tetris"]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(_Message):
    """An amount of each resource on one node."""

    cpu: float = Field(ge=0, le=MAX_AMOUNT, allow_inf_nan=False, description="CPU cores")
    gpu: float = Field(ge=0, le=MAX_AMOUNT, allow_inf_nan=False, description="GPUs")
    mem: float = Field(ge=0, le=MAX_AMOUNT, allow_inf_nan=False, description="memory, GB")


class NodeState(_Message):
    """``count`` consecutive identical nodes (default 1): their capacity and what this slot's allocation
    may use (``free``; default: all of it). Node indices (``worker_nodes``, the answer's nodes) count
    every node: an entry with ``count`` 500 is nodes i..i+499."""

    capacity: Resources
    free: Resources | None = Field(
        default=None, description="free ≤ capacity per resource; omitted: equal to capacity")
    count: int = Field(default=1, ge=1, le=MAX_NODES, description="identical consecutive nodes")


class ObservationIn(_Message):
    """What a job did in one slot it ran (:class:`dl2ray.view.Observation`)."""

    slot: int = Field(ge=0, le=MAX_COUNT)
    ps: int = Field(ge=0, le=MAX_COUNT)
    workers: int = Field(ge=0, le=MAX_COUNT)
    epochs: float = Field(ge=0, le=MAX_EPOCHS, allow_inf_nan=False, description="epochs trained in the slot")
    seconds: float = Field(ge=0, le=1e9, allow_inf_nan=False, description="wall seconds it trained")
    loss: float = Field(ge=-1e12, le=1e12, allow_inf_nan=False, description="training loss at the slot's end")


class JobState(_Message):
    """One arrived, uncompleted job (:class:`dl2ray.view.JobView`).

    ``workers``/``ps`` and their nodes are the previous slot's deployment (0 and
    empty if it did not run); the node lists are either empty (placement
    unknown) or one node index per task. Demands and caps default to the job
    type's in the server's catalogue.
    """

    job_id: int = Field(ge=0, le=MAX_ID)
    job_type: str = Field(min_length=1, max_length=200, description="a type of the server's job catalogue")
    arrival_slot: int = Field(ge=0, le=MAX_COUNT)
    slots_run: int = Field(default=0, ge=0, le=MAX_COUNT)
    est_epochs: float = Field(gt=0, le=MAX_EPOCHS, allow_inf_nan=False, description="declared epochs")
    done_epochs: float = Field(default=0.0, ge=0, le=MAX_EPOCHS, allow_inf_nan=False)
    workers: int = Field(default=0, ge=0, le=MAX_COUNT)
    ps: int = Field(default=0, ge=0, le=MAX_COUNT)
    worker_nodes: list[int] = Field(default_factory=list, max_length=MAX_COUNT)
    ps_nodes: list[int] = Field(default_factory=list, max_length=MAX_COUNT)
    worker_demand: TaskDemand | None = Field(default=None, description="omitted: the job type's")
    ps_demand: TaskDemand | None = Field(default=None, description="omitted: the job type's")
    max_workers: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="omitted: the type's cap")
    max_ps: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="omitted: the type's cap")
    history: list[ObservationIn] = Field(default_factory=list, description="slots it ran, oldest first")
    requested_bundles: int | None = Field(
        default=None, ge=0, le=MAX_COUNT,
        description="size its user asked for, in bundles of 1 worker + 1 PS; omitted: nobody said (the caps)")


class ViewIn(_Message):
    """A cluster at the start of a slot (:class:`dl2ray.view.ClusterView`); jobs in arrival order."""

    slot: int = Field(ge=0, le=MAX_COUNT)
    slot_seconds: float = Field(ge=1e-3, le=1e9, allow_inf_nan=False, description="slot length, seconds")
    nodes: list[NodeState] = Field(min_length=1, max_length=MAX_COUNT)
    jobs: list[JobState] = Field(default_factory=list)
    placement: PlacementName | None = Field(
        default=None, description="the placement the scheduler decides under; omitted: its own (PolicyInfo."
        "placements)")


class DecideRequest(_Message):
    """``POST /v1/decide``: a view, and which scheduler decides it."""

    view: ViewIn
    scheduler: str = Field(
        default="dl2", min_length=1, max_length=100,
        description="dl2 (the served policy) or a heuristic name (GET /v1/policy lists them)")


class JobAllocation(_Message):
    """Workers and PS of one job for the next slot, and the node of each (null: the backend places them)."""

    job_id: int
    workers: int = Field(ge=0)
    ps: int = Field(ge=0)
    worker_nodes: list[int] | None = None
    ps_nodes: list[int] | None = None


class DecideResponse(_Message):
    """The allocation (jobs not listed get nothing), in the order the backend should place them."""

    allocation: list[JobAllocation]
    scheduler: str
    policy_version: str = Field(description="weights that decided (dl2), or heuristic:NAME")
    decision_ms: float = Field(description="time in the scheduler's decide, milliseconds")


class OverloadInfo(_Message):
    """The replica's admission control (:mod:`serve.overload`) since it started."""

    bound_ms: float = Field(description="answer within this many ms of arrival, or refuse at once (0: off)")
    service_ms: float = Field(description="recent mean time of one decision on the replica, ms")
    held: int = Field(description="requests the replica holds now")
    admitted: int
    refused_arrival: int = Field(description="refused on arrival: the queue ahead would make them late")
    refused_late: int = Field(description="admitted, then refused before deciding: they had waited too long")


class PolicyInfo(_Message):
    """``GET /v1/policy``: what the endpoint serves now."""

    version: str
    source: str = Field(description="checkpoint:PATH or global:ACTOR")
    checkpoint: str | None
    loaded_at: float = Field(description="Unix time the weights were swapped in")
    reloads: int = Field(description="weight swaps since start")
    failures: int = Field(description="polls of the weights that failed (the old weights stayed)")
    last_error: str | None = Field(description="why the latest failed poll failed")
    config: str
    arch: Literal["paper", "shape"] = Field(
        description="the served policy's architecture: paper (3J+1 steps over windows of J jobs) or shape "
                    "(one (workers, PS) menu row per job, no window)")
    window: int = Field(description="J: jobs per decision window of the paper architecture")
    max_jobs: int = Field(description="largest view accepted (jobs)")
    job_types: list[str]
    schedulers: list[str]
    placements: dict[str, str] = Field(
        default_factory=dict, description="each served scheduler's own placement policy: what it decides "
        "under when a request's view names none")
    overload: OverloadInfo


class Health(_Message):
    status: Literal["ok"]
    policy_version: str
