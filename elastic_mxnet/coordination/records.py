"""What the coordinator keeps, and the rules over it that need no socket: plain records, pure functions.

:class:`Member` (one registered process), :class:`JobInfo` (what every worker
must agree on), :class:`Request` (a change waiting for its members) and
:class:`Operation` (a plan going through prepare -> commit -> resume) are the
coordinator's state (:mod:`elastic_mxnet.coordination.coordinator`). The
functions decide from that state alone — whether a scale request is refused,
the job info after a worker registers, the plan a restarted coordinator
rebuilds, the status it answers — so tests call them without a socket.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastic_mxnet.config import Limits
from elastic_mxnet.protocol.assignment import chunk_sizes_bytes, rebalance, substitute
from elastic_mxnet.protocol.messages import (
    MemberInfo,
    OptimizerSpec,
    Plan,
    ProtocolError,
    Register,
    Rejoin,
    ScaleRequest,
    ScalingEvent,
    StatusReply,
)


@dataclass
class Member:
    """What the coordinator knows of one registered process."""

    member_id: int
    role: str
    ident: bytes
    address: str
    pid: int
    last_seen: float
    state: str = "standby"
    version: int = -1
    version_at: float = 0.0
    rate: float = 0.0
    rtt_s: float = 0.0
    finished: bool = False

    def heard(self, version: int, rtt_s: float, now: float) -> None:
        """A heartbeat at monotonic ``now``: the member is at iteration ``version``, its round trip
        ``rtt_s``. A new version updates ``rate`` (iterations/s): the first measure, then a moving average
        (0.7 old, 0.3 new)."""
        self.last_seen, self.rtt_s = now, rtt_s
        if version != self.version:
            if self.version >= 0 and now > self.version_at:
                inst = (version - self.version) / (now - self.version_at)
                self.rate = inst if self.rate == 0 else 0.7 * self.rate + 0.3 * inst
            self.version, self.version_at = version, now


@dataclass
class JobInfo:
    """The model and data every worker must agree on (from the first worker to register)."""

    shapes: list[tuple[int, ...]]
    optimizer: OptimizerSpec
    global_batch: int
    num_samples: int


@dataclass
class Request:
    """A change waiting for its new members to register. ``ps``/``workers``: absolute targets."""

    change: str
    ps: int
    workers: int
    deadline: float
    client: bytes | None = None
    at_iteration: int | None = None
    dead_ps: set[int] = field(default_factory=set)
    dead_workers: set[int] = field(default_factory=set)
    stop: bool = False


@dataclass
class Operation:
    """A plan on its way through prepare -> commit -> resume."""

    change: str
    plan: Plan
    need_ack: set[int]
    need_done: set[int]
    client: bytes | None
    pinned: bool
    started: float
    phase: str = "prepare"
    acked: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    attempts: int = 1
    lost: int = 0



def change_name(ps0: int, ps1: int, w0: int, w1: int) -> str:
    """``add_ps``, ``remove_worker``, ... or a combined ``ps 2->3, workers 2->1``."""
    parts = []
    if ps1 != ps0:
        parts.append(("add_ps" if ps1 > ps0 else "remove_ps", f"ps {ps0}->{ps1}"))
    if w1 != w0:
        parts.append(("add_worker" if w1 > w0 else "remove_worker", f"workers {w0}->{w1}"))
    if len(parts) == 1 and abs((ps1 - ps0) + (w1 - w0)) == 1:
        return parts[0][0]
    return ", ".join(p[1] for p in parts)


def job_info(current: JobInfo | None, msg: Register | Rejoin) -> JobInfo:
    """The job's info once the worker of ``msg`` (a registration or a rejoin) is in: the first worker's
    defines it; one rebuilt from PS only (a paused job's restart, no shapes) is completed by the first
    worker with the same optimizer and batch. A worker that disagrees raises :class:`ProtocolError`."""
    if not msg.shapes or msg.optimizer is None or msg.global_batch < 1 or msg.num_samples < 1:
        raise ProtocolError("a worker must register with shapes, optimizer, global_batch, num_samples")
    info = JobInfo([tuple(s) for s in msg.shapes], msg.optimizer, msg.global_batch, msg.num_samples)
    if current is None:
        return info
    if not current.shapes and (info.optimizer, info.global_batch) == (current.optimizer,
                                                                      current.global_batch):
        return info
    if info != current:
        raise ProtocolError("this worker's model, optimizer or batch differs from the job's")
    return current


def scale_refusal(msg: ScaleRequest, state: str, plan: Plan | None, busy: str | None, recovering: bool,
                  limits: Limits, started: int) -> tuple[str, int, int]:
    """Why a scale request is refused (``""``: it is not) and its absolute targets ``(ps, workers)``
    (``None`` in the request: keep the plan's count). ``busy``: the change of the operation or request in
    progress; ``recovering``: a failure awaits its recovery plan; ``started``: the furthest iteration known
    to have started (a pinned ``at_iteration`` must lie after it)."""
    if state != "running" or plan is None:
        return f"job is {state}, not running", 0, 0
    if busy is not None:
        return f"busy: scaling operation '{busy}' in progress (one at a time)", 0, 0
    if recovering:
        return "busy: recovering from a failure", 0, 0
    ps = len(plan.ps) if msg.ps is None else msg.ps
    workers = len(plan.workers) if msg.workers is None else msg.workers
    if not limits.min_ps <= ps <= limits.max_ps:
        return f"ps={ps} outside the limits [{limits.min_ps}, {limits.max_ps}]", 0, 0
    if not limits.min_workers <= workers <= limits.max_workers:
        return f"workers={workers} outside the limits [{limits.min_workers}, {limits.max_workers}]", 0, 0
    if msg.at_iteration is not None and msg.at_iteration <= started:
        return f"iteration {msg.at_iteration} has already started", 0, 0
    return "", ps, workers


def rebuilt_plan(rejoins: Mapping[int, Rejoin]) -> Plan | None:
    """The plan a restarted coordinator goes on with: the latest plan any member rejoined with, each chunk
    owned by the PS that rejoined holding it; None when nobody rejoined with a plan (start fresh)."""
    plans = [r.plan for r in rejoins.values() if r.plan is not None]
    if not plans:
        return None
    base = max(plans, key=lambda p: p.plan_id)
    owners = list(base.owners)
    for r in rejoins.values():
        if r.role == "ps" and r.plan is not None:
            for cid in r.owned:
                owners[cid] = r.member_id
    return base.model_copy(update={"owners": owners})


def status_reply(state: str, members: Mapping[int, Member], plan: Plan | None, job: JobInfo | None,
                 events: Sequence[ScalingEvent], operation: str | None) -> StatusReply:
    """The coordinator's status: members sorted by id (``member`` if in ``plan``, else ``standby``); the
    iteration (the slowest PS's version, 0 before any); samples/s (the fastest worker's iterations/s x the
    global batch); epochs done (iteration x global batch / samples); the last event's longest suspension."""
    in_plan = set(plan.ps) | set(plan.workers) if plan else set()
    infos = [MemberInfo(member_id=m.member_id, role=m.role,  # type: ignore[arg-type]
                        state="member" if m.member_id in in_plan else "standby", pid=m.pid,
                        address=m.address, version=m.version)
             for m in sorted(members.values(), key=lambda m: m.member_id)]
    version = min((m.version for m in members.values() if m.role == "ps" and m.state == "member"), default=0)
    workers = [members[w] for w in (plan.workers if plan else []) if w in members and not members[w].finished]
    gb = job.global_batch if job else 0
    last = next((max(e.suspension_ms.values()) for e in reversed(events) if e.suspension_ms), None)
    rate = max((m.rate for m in workers), default=0.0)
    return StatusReply(state=state, members=infos, plan_id=plan.plan_id if plan else None,
                       version=max(version, 0), samples_per_s=rate * gb,
                       epochs_done=version * gb / job.num_samples if job else 0.0, last_suspension_ms=last,
                       events=list(events), operation=operation)


@dataclass(frozen=True)
class Recovery:
    """The members and chunk owners of a recovery plan: ``ps`` (survivors then spares), ``workers`` (the
    living), ``owners`` per chunk, ``restore`` the chunks their new owner loads from the snapshot; ``change``
    names what died."""

    ps: list[int]
    workers: list[int]
    owners: list[int]
    restore: list[int]
    change: str


def recovery(plan: Plan, dead_ps: set[int], dead_workers: set[int], spares: list[int]) -> Recovery | None:
    """How ``plan`` goes on without ``dead_ps`` and ``dead_workers``: each dead PS's chunks go to a spare PS
    (``spares``, registered standby) when there is one for every dead PS, else spread over the survivors and
    spares with minimal movement. None when no worker, or no PS at all, is left."""
    survivors = [p for p in plan.ps if p not in dead_ps]
    workers = [w for w in plan.workers if w not in dead_workers]
    if not workers or not (survivors or spares):
        return None
    if len(spares) == len(dead_ps):
        owners = substitute(plan.owners, dict(zip(sorted(dead_ps), spares, strict=True)))
    else:
        owners = rebalance(chunk_sizes_bytes(plan.layout), plan.owners, survivors + spares)
    restore = [c for c, o in enumerate(plan.owners) if o in dead_ps]
    parts = [f"ps {sorted(dead_ps)} died"] * bool(dead_ps) + [f"workers {sorted(dead_workers)} died"] * bool(
        dead_workers)
    return Recovery(survivors + spares, workers, owners, restore, "recover: " + ", ".join(parts))
