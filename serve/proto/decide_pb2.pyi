from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Resources(_message.Message):
    __slots__ = ("cpu", "gpu", "mem")
    CPU_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MEM_FIELD_NUMBER: _ClassVar[int]
    cpu: float
    gpu: float
    mem: float
    def __init__(self, cpu: _Optional[float] = ..., gpu: _Optional[float] = ..., mem: _Optional[float] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("capacity", "free", "count")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    capacity: Resources
    free: Resources
    count: int
    def __init__(self, capacity: _Optional[_Union[Resources, _Mapping]] = ..., free: _Optional[_Union[Resources, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("slot", "ps", "workers", "epochs", "seconds", "loss")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    PS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    slot: int
    ps: int
    workers: int
    epochs: float
    seconds: float
    loss: float
    def __init__(self, slot: _Optional[int] = ..., ps: _Optional[int] = ..., workers: _Optional[int] = ..., epochs: _Optional[float] = ..., seconds: _Optional[float] = ..., loss: _Optional[float] = ...) -> None: ...

class JobState(_message.Message):
    __slots__ = ("job_id", "job_type", "arrival_slot", "slots_run", "est_epochs", "done_epochs", "workers", "ps", "worker_nodes", "ps_nodes", "worker_demand", "ps_demand", "max_workers", "max_ps", "history", "requested_bundles")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_SLOT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_RUN_FIELD_NUMBER: _ClassVar[int]
    EST_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    DONE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PS_FIELD_NUMBER: _ClassVar[int]
    WORKER_NODES_FIELD_NUMBER: _ClassVar[int]
    PS_NODES_FIELD_NUMBER: _ClassVar[int]
    WORKER_DEMAND_FIELD_NUMBER: _ClassVar[int]
    PS_DEMAND_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_PS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BUNDLES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    job_type: str
    arrival_slot: int
    slots_run: int
    est_epochs: float
    done_epochs: float
    workers: int
    ps: int
    worker_nodes: _containers.RepeatedScalarFieldContainer[int]
    ps_nodes: _containers.RepeatedScalarFieldContainer[int]
    worker_demand: Resources
    ps_demand: Resources
    max_workers: int
    max_ps: int
    history: _containers.RepeatedCompositeFieldContainer[Observation]
    requested_bundles: int
    def __init__(self, job_id: _Optional[int] = ..., job_type: _Optional[str] = ..., arrival_slot: _Optional[int] = ..., slots_run: _Optional[int] = ..., est_epochs: _Optional[float] = ..., done_epochs: _Optional[float] = ..., workers: _Optional[int] = ..., ps: _Optional[int] = ..., worker_nodes: _Optional[_Iterable[int]] = ..., ps_nodes: _Optional[_Iterable[int]] = ..., worker_demand: _Optional[_Union[Resources, _Mapping]] = ..., ps_demand: _Optional[_Union[Resources, _Mapping]] = ..., max_workers: _Optional[int] = ..., max_ps: _Optional[int] = ..., history: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ..., requested_bundles: _Optional[int] = ...) -> None: ...

class View(_message.Message):
    __slots__ = ("slot", "slot_seconds", "nodes", "jobs", "placement")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    slot: int
    slot_seconds: float
    nodes: _containers.RepeatedCompositeFieldContainer[NodeState]
    jobs: _containers.RepeatedCompositeFieldContainer[JobState]
    placement: str
    def __init__(self, slot: _Optional[int] = ..., slot_seconds: _Optional[float] = ..., nodes: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobState, _Mapping]]] = ..., placement: _Optional[str] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("view", "scheduler")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    view: View
    scheduler: str
    def __init__(self, view: _Optional[_Union[View, _Mapping]] = ..., scheduler: _Optional[str] = ...) -> None: ...

class JobAllocation(_message.Message):
    __slots__ = ("job_id", "workers", "ps", "placed", "worker_nodes", "ps_nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PS_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    WORKER_NODES_FIELD_NUMBER: _ClassVar[int]
    PS_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    workers: int
    ps: int
    placed: bool
    worker_nodes: _containers.RepeatedScalarFieldContainer[int]
    ps_nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[int] = ..., workers: _Optional[int] = ..., ps: _Optional[int] = ..., placed: _Optional[bool] = ..., worker_nodes: _Optional[_Iterable[int]] = ..., ps_nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("allocation", "scheduler", "policy_version", "decision_ms")
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_FIELD_NUMBER: _ClassVar[int]
    allocation: _containers.RepeatedCompositeFieldContainer[JobAllocation]
    scheduler: str
    policy_version: str
    decision_ms: float
    def __init__(self, allocation: _Optional[_Iterable[_Union[JobAllocation, _Mapping]]] = ..., scheduler: _Optional[str] = ..., policy_version: _Optional[str] = ..., decision_ms: _Optional[float] = ...) -> None: ...
