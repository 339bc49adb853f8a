"""Wire messages: a versioned, validated msgpack header plus raw array frames.

A message is one ZeroMQ multipart message ``[header, array_0, array_1, ...]``.
The header is a msgpack map validated by the pydantic model named by its
``kind`` field; its ``arrays`` list gives dtype and shape of every following
frame, and a frame whose byte length does not match is rejected. Arrays travel
as raw bytes (zero-copy on send, ``np.frombuffer`` on receive), never through
msgpack. Anything that fails validation raises :class:`ProtocolError`; the
receiving loop answers it with an :class:`Error` and keeps running.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import msgpack
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

PROTOCOL_VERSION = 1
"""Bumped on any incompatible header change; a peer speaking another version is refused."""

DTYPES = ("float32", "float64", "int64")


class ProtocolError(ValueError):
    """A message that is malformed, of the wrong version, or unexpected here."""


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    v: Literal[1] = 1
    kind: str


class ArraySpec(BaseModel):
    """Dtype and shape of one array frame."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dtype: Literal["float32", "float64", "int64"]
    shape: tuple[Annotated[int, Field(ge=0)], ...]


class ChunkSpec(BaseModel):
    """Chunk ``cid``: elements ``[start, stop)`` of flattened parameter ``param`` (by order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cid: int = Field(ge=0)
    param: int = Field(ge=0)
    start: int = Field(ge=0)
    stop: int = Field(ge=0)

    @property
    def size(self) -> int:
        """Number of elements."""
        return self.stop - self.start


class OptimizerSpec(BaseModel):
    """Optimizer the PS run, in MXNet's parametrisation (``learning_rate`` per sample-mean grad)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Literal["sgd", "adam"] = "sgd"
    learning_rate: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    wd: float = Field(default=0.0, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.999, ge=0, lt=1)
    epsilon: float = Field(default=1e-8, gt=0)


class Plan(BaseModel):
    """A membership and parameter map, valid from iteration ``clock`` on.

    ``owners[cid]`` is the PS id holding chunk ``cid`` of ``layout``; a worker's
    rank is its index in ``workers`` (sorted ids). ``restore`` lists chunks
    their new owner loads from the snapshot directory instead of receiving by
    migration (their owner died). ``init_from`` names the worker whose initial
    parameter values seed the PS (first plan only).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    plan_id: int = Field(ge=0)
    clock: int = Field(ge=0)
    layout: list[ChunkSpec]
    owners: list[int]
    ps: dict[int, str]
    workers: list[int]
    dead_ps: list[int] = []
    dead_workers: list[int] = []
    restore: list[int] = []
    init_from: int | None = None
    optimizer: OptimizerSpec
    global_batch: int = Field(ge=1)
    snapshot_dir: str
    snapshot_every: int = Field(ge=1)
    stop: bool = False


# ---- member -> coordinator -------------------------------------------------


class Register(_Msg):
    """A new PS or worker asks for an id. Workers describe the model they train."""

    kind: Literal["register"] = "register"
    role: Literal["ps", "worker"]
    address: str = ""
    pid: int = Field(ge=0)
    shapes: list[tuple[int, ...]] = []
    optimizer: OptimizerSpec | None = None
    global_batch: int = 0
    num_samples: int = 0


class Registered(_Msg):
    """Reply to Register/Rejoin: the member's id and the heartbeat settings (seconds)."""

    kind: Literal["registered"] = "registered"
    member_id: int
    heartbeat_interval_s: float
    orphan_timeout_s: float


class Rejoin(_Msg):
    """A member re-registers with a restarted coordinator, carrying its state."""

    kind: Literal["rejoin"] = "rejoin"
    role: Literal["ps", "worker"]
    member_id: int
    address: str = ""
    pid: int
    version: int
    plan: Plan | None = None
    owned: list[int] = []
    shapes: list[tuple[int, ...]] = []
    optimizer: OptimizerSpec | None = None
    global_batch: int = 0
    num_samples: int = 0


class Heartbeat(_Msg):
    """Liveness plus progress. ``version``: worker = last iteration started; PS = updates done."""

    kind: Literal["heartbeat"] = "heartbeat"
    member_id: int
    version: int
    rtt_ms: float = 0.0


class HeartbeatAck(_Msg):
    kind: Literal["heartbeat_ack"] = "heartbeat_ack"


class Ack(_Msg):
    """Answer to Prepare; ``ok=False`` when the member is already at or past the clock."""

    kind: Literal["ack"] = "ack"
    member_id: int
    plan_id: int
    ok: bool
    version: int
    reason: str = ""


class Migrated(_Msg):
    """A PS has sent and received every chunk of the plan and switched to it.

    ``lost_iterations``: for chunks restored from a snapshot, how many updates
    behind the clock that snapshot was (0 when nothing was restored).
    """

    kind: Literal["migrated"] = "migrated"
    member_id: int
    plan_id: int
    lost_iterations: int = 0


class Suspended(_Msg):
    """A worker resumed after a plan; ``suspension_ms``: from reaching the clock to going on."""

    kind: Literal["suspended"] = "suspended"
    member_id: int
    plan_id: int
    suspension_ms: float


class Leave(_Msg):
    kind: Literal["leave"] = "leave"
    member_id: int
    reason: Literal["finished", "removed", "error"]


# ---- coordinator -> member -------------------------------------------------


class Prepare(_Msg):
    kind: Literal["prepare"] = "prepare"
    plan: Plan


class Commit(_Msg):
    kind: Literal["commit"] = "commit"
    plan_id: int


class Abort(_Msg):
    kind: Literal["abort"] = "abort"
    plan_id: int
    reason: str


class Resume(_Msg):
    kind: Literal["resume"] = "resume"
    plan_id: int


class Stop(_Msg):
    kind: Literal["stop"] = "stop"
    reason: str


# ---- data plane (worker <-> PS, PS <-> PS) --------------------------------


class Push(_Msg):
    """Gradients of ``chunks`` for ``iteration``, summed over ``samples`` local samples."""

    kind: Literal["push"] = "push"
    worker: int
    iteration: int = Field(ge=0)
    samples: int = Field(ge=0)
    chunks: list[int]


class Pull(_Msg):
    """Ask for the values of ``chunks`` once the PS has applied ``version`` updates."""

    kind: Literal["pull"] = "pull"
    worker: int
    version: int = Field(ge=0)
    chunks: list[int]


class Params(_Msg):
    """Values of ``chunks`` after ``version`` updates (one float32 frame per chunk)."""

    kind: Literal["params"] = "params"
    version: int
    chunks: list[int]


class Init(_Msg):
    """Initial values of ``chunks`` sent by the plan's ``init_from`` worker."""

    kind: Literal["init"] = "init"
    plan_id: int
    chunks: list[int]


class Migrate(_Msg):
    """Chunks with optimizer state: per chunk, frames values then each of ``state_names``."""

    kind: Literal["migrate"] = "migrate"
    plan_id: int
    chunks: list[int]
    steps: list[int]
    state_names: list[str]


class Done(_Msg):
    """Generic acknowledgement of Init/Migrate."""

    kind: Literal["done"] = "done"
    plan_id: int
    chunks: list[int]


# ---- control API (ElasticJob <-> coordinator) -----------------------------


class ScaleRequest(_Msg):
    """Absolute targets; ``at_iteration`` pins the scaling clock (refused if already passed)."""

    kind: Literal["scale"] = "scale"
    ps: int | None = Field(default=None, ge=0)
    workers: int | None = Field(default=None, ge=0)
    at_iteration: int | None = Field(default=None, ge=0)


class ScaleReply(_Msg):
    kind: Literal["scale_reply"] = "scale_reply"
    ok: bool
    reason: str = ""
    plan_id: int | None = None
    clock: int | None = None


class StatusRequest(_Msg):
    kind: Literal["status"] = "status"


class MemberInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    member_id: int
    role: Literal["ps", "worker"]
    state: Literal["member", "standby"]
    pid: int
    address: str
    version: int


class ScalingEvent(BaseModel):
    """One completed plan. ``suspension_ms`` per worker id; ``duration_ms`` prepare to resume;
    ``resumed_at``: Unix time (s) the coordinator received the first worker's report that it started the
    clock iteration on this plan (at most one control-thread poll, 10 ms, after it did); None until then."""

    model_config = ConfigDict(extra="forbid")
    plan_id: int
    change: str
    clock: int
    duration_ms: float
    suspension_ms: dict[int, float] = {}
    lost_iterations: int = 0
    resumed_at: float | None = None


class StatusReply(_Msg):
    kind: Literal["status_reply"] = "status_reply"
    state: str
    members: list[MemberInfo]
    plan_id: int | None
    version: int
    samples_per_s: float
    epochs_done: float
    last_suspension_ms: float | None
    events: list[ScalingEvent]
    operation: str | None = None
    """The change in progress or waiting for its new members, if any."""

    @property
    def started(self) -> bool:
        """Whether the coordinator's first plan ran: any state past ``waiting`` and ``starting``
        (``running``, ``stopping``, ``done``, or ``rebuilding`` after a restart)."""
        return self.state not in ("waiting", "starting")


class StopRequest(_Msg):
    kind: Literal["stop_job"] = "stop_job"
    at_iteration: int | None = Field(default=None, ge=0)


class StopReply(_Msg):
    kind: Literal["stop_reply"] = "stop_reply"
    ok: bool
    reason: str = ""


class Error(_Msg):
    """Sent back for a malformed, unknown or unexpected message."""

    kind: Literal["error"] = "error"
    code: str
    reason: str


Message = Annotated[
    Register
    | Registered
    | Rejoin
    | Heartbeat
    | HeartbeatAck
    | Ack
    | Migrated
    | Suspended
    | Leave
    | Prepare
    | Commit
    | Abort
    | Resume
    | Stop
    | Push
    | Pull
    | Params
    | Init
    | Migrate
    | Done
    | ScaleRequest
    | ScaleReply
    | StatusRequest
    | StatusReply
    | StopRequest
    | StopReply
    | Error,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def encode(msg: _Msg, arrays: Sequence[np.ndarray] = ()) -> list[bytes | memoryview]:
    """Frames of ``msg`` followed by ``arrays`` (C-contiguous, sent without copying)."""
    specs = []
    frames: list[bytes | memoryview] = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        if a.dtype.name not in DTYPES:
            raise ProtocolError(f"unsupported dtype {a.dtype.name}")
        specs.append({"dtype": a.dtype.name, "shape": list(a.shape)})
        frames.append(a.data.cast("B"))
    header = msg.model_dump(mode="json")
    header["arrays"] = specs
    return [msgpack.packb(header, use_bin_type=True), *frames]


def decode(frames: Sequence[bytes | memoryview]) -> tuple[_Msg, list[np.ndarray]]:
    """Parse and validate ``[header, *array frames]``; raise :class:`ProtocolError` if invalid."""
    if not frames:
        raise ProtocolError("empty message")
    try:
        header = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise ProtocolError(f"header is not msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a map")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r}, expected {PROTOCOL_VERSION}")
    raw_specs = header.pop("arrays", [])
    try:
        msg = _ADAPTER.validate_python(header)
        specs = [ArraySpec.model_validate(s) for s in raw_specs]
    except ValidationError as exc:
        raise ProtocolError(f"invalid header: {_short(exc)}") from None
    if len(specs) != len(frames) - 1:
        raise ProtocolError(f"header lists {len(specs)} arrays, message has {len(frames) - 1}")
    arrays = []
    for spec, frame in zip(specs, frames[1:], strict=True):
        dtype = np.dtype(spec.dtype)
        count = int(np.prod(spec.shape, dtype=np.int64))
        buf = frame if isinstance(frame, memoryview | bytes) else memoryview(frame)
        if len(buf) != count * dtype.itemsize:
            raise ProtocolError(f"array frame of {len(buf)} bytes does not match {spec}")
        arrays.append(np.frombuffer(buf, dtype=dtype).reshape(spec.shape))
    return msg, arrays


def _short(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" + (
        f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    )
