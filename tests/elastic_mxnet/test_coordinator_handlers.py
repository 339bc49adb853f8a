"""The coordinator's handlers called directly: registration, the first plan, scaling, refusals, failures,
stopping and a restart's rejoin. In-process: no MXNet, no member process, no Ray.

A :class:`Coordinator` binds its ROUTER on 127.0.0.1 as usual; the tests swap its socket for an
:class:`Outbox` that decodes what it sends, call ``_on_<message>`` with a member's routing id, and drive
time through ``_tick(now)``. Fake members are routing ids (``b"ps0"``, ``b"w0"``...).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from elastic_mxnet.config import JobConfig, Limits, Liveness
from elastic_mxnet.coordination.coordinator import Coordinator
from elastic_mxnet.protocol.messages import (
    Abort,
    Ack,
    Commit,
    Error,
    Heartbeat,
    HeartbeatAck,
    Leave,
    Migrated,
    OptimizerSpec,
    Prepare,
    ProtocolError,
    Register,
    Registered,
    Rejoin,
    Resume,
    ScaleReply,
    ScaleRequest,
    StatusRequest,
    Stop,
    StopReply,
    StopRequest,
    Suspended,
    _Msg,
    decode,
)

SHAPES = [(4, 3), (3,)]
OPT = OptimizerSpec(name="sgd", learning_rate=0.1)
CLIENT = b"client"


class Outbox:
    """Stands in for the coordinator's ROUTER: keeps every message sent, decoded, by routing id."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, _Msg]] = []

    def send_multipart(self, frames, copy: bool = True) -> None:
        msg, _ = decode([bytes(f) for f in frames[1:]])
        self.sent.append((bytes(frames[0]), msg))

    def take(self, kind: type | None = None) -> list[tuple[bytes, _Msg]]:
        """The messages sent since the last take (of ``kind`` only, if given; the others are dropped)."""
        out, self.sent = self.sent, []
        return [(to, m) for to, m in out if kind is None or isinstance(m, kind)]

    def close(self, linger: int = 0) -> None:
        pass


@dataclass
class FakeSpawner:
    """Records the members the coordinator asks for."""

    spawned: list[str] = field(default_factory=list)
    closed: bool = False

    def spawn(self, role, coordinator: str) -> None:
        self.spawned.append(role)

    def close(self) -> None:
        self.closed = True


def make(initial_ps: int = 1, initial_workers: int = 1, spawner: FakeSpawner | None = None,
         rejoin: bool = False, **limits) -> Coordinator:
    cfg = JobConfig(initial_ps=initial_ps, initial_workers=initial_workers,
                    liveness=Liveness(heartbeat_interval_s=0.1, heartbeat_timeout_s=2.0, rejoin_grace_s=1.5),
                    limits=Limits(**limits))
    coord = Coordinator(cfg, spawner, rejoin=rejoin)
    coord._real_sock = coord.sock  # type: ignore[attr-defined]
    coord.sock = Outbox()  # type: ignore[assignment]
    return coord


@pytest.fixture
def coords() -> Iterator[list[Coordinator]]:
    made: list[Coordinator] = []
    yield made
    for c in made:
        c._real_sock.close(linger=0)  # type: ignore[attr-defined]
        c.ctx.term()


def out(c: Coordinator) -> Outbox:
    assert isinstance(c.sock, Outbox)
    return c.sock


def register_ps(c: Coordinator, ident: bytes) -> int:
    c._on_register(ident, Register(role="ps", address=f"tcp://127.0.0.1:{9000 + len(c.members)}", pid=100))
    return _registered(c, ident)


def register_worker(c: Coordinator, ident: bytes, shapes=SHAPES, batch: int = 8) -> int:
    c._on_register(ident, Register(role="worker", pid=200, shapes=shapes, optimizer=OPT, global_batch=batch,
                                   num_samples=800))
    return _registered(c, ident)


def _registered(c: Coordinator, ident: bytes) -> int:
    (to, msg), = out(c).take(Registered)
    assert to == ident and isinstance(msg, Registered)
    return msg.member_id


def keep_alive(c: Coordinator, seconds: float = 1000.0) -> None:
    """Every member heard from ``seconds`` into the future: no one misses heartbeats while time jumps."""
    for m in c.members.values():
        m.last_seen = time.monotonic() + seconds


def complete(c: Coordinator) -> int:
    """Run the operation in progress to its end: every member acks, every PS reports migrated."""
    op = c.op
    assert op is not None
    pid = op.plan.plan_id
    for mid in sorted(op.need_ack):
        c._on_ack(b"", Ack(member_id=mid, plan_id=pid, ok=True, version=0))
    for mid in sorted(op.need_done):
        c._on_migrated(b"", Migrated(member_id=mid, plan_id=pid))
    return pid


def running(c: Coordinator, ps: int = 1, workers: int = 1) -> dict[str, int]:
    """Register ``ps`` PS and ``workers`` workers and run the first plan: the job runs."""
    ids = {f"ps{i}": register_ps(c, f"ps{i}".encode()) for i in range(ps)}
    ids |= {f"w{i}": register_worker(c, f"w{i}".encode()) for i in range(workers)}
    c._tick(time.monotonic())
    complete(c)
    assert c.state == "running" and c.plan is not None
    assert (len(c.plan.ps), len(c.plan.workers)) == (ps, workers), "make() the coordinator with these counts"
    out(c).take()
    return ids


def test_registration_hands_out_ids_and_checks_what_each_role_must_say(coords) -> None:
    coords.append(c := make())
    assert register_ps(c, b"ps0") == 0 and register_worker(c, b"w0") == 1
    with pytest.raises(ProtocolError, match="data address"):
        c._on_register(b"ps1", Register(role="ps", pid=1))
    with pytest.raises(ProtocolError, match="shapes"):
        c._on_register(b"w1", Register(role="worker", pid=1))
    with pytest.raises(ProtocolError, match="differs"):  # another model than the job's
        register_worker(c, b"w2", shapes=[(5, 3)])
    assert sorted(c.members) == [0, 1] and c.job is not None and c.job.global_batch == 8


def test_the_first_plan_waits_for_its_members_then_goes_through_prepare_commit_resume(coords) -> None:
    coords.append(c := make(initial_ps=1, initial_workers=2))
    ps = register_ps(c, b"ps0")
    w0 = register_worker(c, b"w0")
    c._tick(time.monotonic())
    assert c.op is None and c.state == "waiting"  # one worker short
    w1 = register_worker(c, b"w1")
    c._tick(time.monotonic())
    assert c.state == "starting" and c.op is not None
    prepares = out(c).take(Prepare)
    assert sorted(to for to, _ in prepares) == [b"ps0", b"w0", b"w1"]
    plan = prepares[0][1].plan  # type: ignore[attr-defined]
    assert (plan.clock, plan.init_from, plan.workers, list(plan.ps)) == (0, w0, [w0, w1], [ps])
    assert set(plan.owners) == {ps} and len(plan.owners) == len(plan.layout)

    for mid in (ps, w0, w1):
        c._on_ack(b"", Ack(member_id=mid, plan_id=plan.plan_id, ok=True, version=0))
    # the commit goes to the PS and to the worker whose initial values seed it
    assert sorted(to for to, _ in out(c).take(Commit)) == [b"ps0", b"w0"]
    c._on_migrated(b"", Migrated(member_id=ps, plan_id=plan.plan_id))
    assert sorted(to for to, _ in out(c).take(Resume)) == [b"ps0", b"w0", b"w1"]
    assert c.state == "running" and c.op is None and c.plan == plan
    assert [(e.plan_id, e.change) for e in c.events] == [(plan.plan_id, "start")]
    st = c.status()
    assert [(m.member_id, m.state) for m in st.members] == [(ps, "member"), (w0, "member"), (w1, "member")]
    assert st.started and st.plan_id == plan.plan_id and st.operation is None


def test_a_scale_request_starts_missing_members_then_plans_with_them(coords) -> None:
    coords.append(c := make(spawner=(sp := FakeSpawner())))
    running(c)
    sp.spawned.clear()
    c._on_scale(CLIENT, ScaleRequest(workers=3))
    assert sp.spawned == ["worker", "worker"] and c.request is not None
    assert c.status().operation == "workers 1->3"
    w1 = register_worker(c, b"w1")
    c._tick(time.monotonic())
    assert c.op is None  # still one short
    w2 = register_worker(c, b"w2")
    c._tick(time.monotonic())
    assert c.op is not None and c.request is None
    plan = c.op.plan
    assert plan.workers[-2:] == [w1, w2] and len(plan.workers) == 3
    pid = complete(c)
    (to, reply), = out(c).take(ScaleReply)
    assert to == CLIENT and reply.ok and reply.plan_id == pid and reply.clock == plan.clock
    assert [m.state for m in c.status().members].count("member") == 4


def test_a_request_for_what_runs_is_answered_at_once(coords) -> None:
    coords.append(c := make())
    running(c)
    c._on_scale(CLIENT, ScaleRequest(ps=1, workers=1))
    (_, reply), = out(c).take(ScaleReply)
    assert reply.ok and reply.reason == "no change" and reply.plan_id == c.plan.plan_id  # type: ignore[union-attr]
    assert c.request is None and c.op is None


@pytest.mark.parametrize(("request_", "reason"), [
    (ScaleRequest(workers=5), "workers=5 outside the limits [1, 4]"),
    (ScaleRequest(ps=3), "ps=3 outside the limits [1, 2]"),
    (ScaleRequest(workers=2, at_iteration=0), "iteration 0 has already started"),
])
def test_a_scale_request_out_of_bounds_or_too_late_is_refused(coords, request_, reason) -> None:
    coords.append(c := make(max_ps=2, max_workers=4))
    ids = running(c)
    c._on_heartbeat(b"w0", Heartbeat(member_id=ids["w0"], version=3))
    out(c).take()
    c._on_scale(CLIENT, request_)
    (_, reply), = out(c).take(ScaleReply)
    assert not reply.ok and reply.reason == reason and c.request is None


def test_one_operation_at_a_time_and_none_before_the_job_runs(coords) -> None:
    coords.append(c := make())
    c._on_scale(CLIENT, ScaleRequest(workers=2))
    (_, reply), = out(c).take(ScaleReply)
    assert reply.reason == "job is waiting, not running"
    running(c)
    c._on_scale(b"a", ScaleRequest(workers=2))
    c._on_scale(b"b", ScaleRequest(workers=3))
    (to, busy), = out(c).take(ScaleReply)
    assert to == b"b" and busy.reason == "busy: scaling operation 'add_worker' in progress (one at a time)"
    c._on_stop(b"c", StopRequest())
    (_, stop), = out(c).take(StopReply)
    assert not stop.ok and stop.reason.startswith("busy")


def test_a_request_whose_members_never_register_times_out(coords) -> None:
    coords.append(c := make(register_timeout_s=5.0))
    running(c)
    c._on_scale(CLIENT, ScaleRequest(workers=2))
    keep_alive(c)
    c._tick(time.monotonic() + 1.0)
    assert c.request is not None and out(c).take(ScaleReply) == []
    c._tick(time.monotonic() + 6.0)
    (_, reply), = out(c).take(ScaleReply)
    assert not reply.ok and reply.reason == "timed out waiting for new members to register"
    assert c.request is None and c.state == "running"


def test_a_nack_retries_with_a_later_clock_and_a_pinned_clock_fails_instead(coords) -> None:
    coords.append(c := make())
    ids = running(c)
    c._on_register(b"w1", Register(role="worker", pid=3, shapes=SHAPES, optimizer=OPT, global_batch=8,
                                   num_samples=800))
    out(c).take()
    c._on_scale(CLIENT, ScaleRequest(workers=2))
    c._tick(time.monotonic())
    first = c.op.plan  # type: ignore[union-attr]
    c._on_ack(b"", Ack(member_id=ids["w0"], plan_id=first.plan_id, ok=False, version=first.clock + 4,
                       reason="past the clock"))
    assert [to for to, _ in out(c).take(Abort)] == [b"ps0", b"w0", b"w1"]
    retry = c.op.plan  # type: ignore[union-attr]
    assert retry.plan_id > first.plan_id and retry.clock > first.clock + 4 and c.op.attempts == 2  # type: ignore[union-attr]
    c._on_ack(b"", Ack(member_id=ids["w0"], plan_id=first.plan_id, ok=True, version=0))  # late: ignored
    assert c.op.acked == set()  # type: ignore[union-attr]
    complete(c)
    assert out(c).take(ScaleReply)[0][1].ok

    c._on_scale(CLIENT, ScaleRequest(workers=1, at_iteration=10_000))
    c._tick(time.monotonic())
    pinned = c.op.plan  # type: ignore[union-attr]
    assert pinned.clock == 10_000
    c._on_ack(b"", Ack(member_id=ids["w0"], plan_id=pinned.plan_id, ok=False, version=10_001))
    (_, reply), = out(c).take(ScaleReply)
    assert not reply.ok and "scaling clock 10000 missed" in reply.reason
    assert c.op is None and c.state == "running"  # a refused prepare leaves the job as it was


def test_heartbeats_measure_progress_and_unknown_or_departed_members_are_told(coords) -> None:
    coords.append(c := make())
    ids = running(c)
    member = c.members[ids["w0"]]
    c._on_heartbeat(b"w0", Heartbeat(member_id=ids["w0"], version=0, rtt_ms=4.0))
    member.version_at -= 1.0  # one second ago
    c._on_heartbeat(b"w0", Heartbeat(member_id=ids["w0"], version=10, rtt_ms=4.0))
    assert member.version == 10 and member.rtt_s == pytest.approx(0.004)
    assert member.rate == pytest.approx(10.0, rel=0.05)
    assert [type(m) for _, m in out(c).take()] == [HeartbeatAck, HeartbeatAck]
    assert c.status().samples_per_s == pytest.approx(10.0 * 8, rel=0.05)

    c._on_heartbeat(b"x", Heartbeat(member_id=99, version=0))
    (_, err), = out(c).take()
    assert isinstance(err, Error) and err.code == "unknown_member"
    c._on_leave(b"w0", Leave(member_id=ids["w0"], reason="removed"))
    c._on_heartbeat(b"w0", Heartbeat(member_id=ids["w0"], version=11))
    (_, stop), = out(c).take()
    assert isinstance(stop, Stop)


def test_a_silent_worker_is_dropped_by_a_recovery_plan(coords) -> None:
    coords.append(c := make(initial_workers=2))
    ids = running(c, ps=1, workers=2)
    now = time.monotonic()
    for name in ("ps0", "w0"):
        c.members[ids[name]].last_seen = now + 10  # these keep talking
    c._tick(now + 3.0)  # w1 missed 2 s of heartbeats
    assert ids["w1"] not in c.members and c.op is not None
    plan = c.op.plan
    assert plan.workers == [ids["w0"]] and plan.dead_workers == [ids["w1"]] and plan.restore == []
    assert c.op.change == f"recover: workers [{ids['w1']}] died"
    complete(c)
    assert c.state == "running" and c.plan == plan and c.failed_workers == set()


def test_a_member_that_dies_before_the_job_starts_is_spawned_again(coords) -> None:
    """A PS that misses its heartbeats while the job waits for its first members (a loaded machine) is
    dropped and another is spawned; the job starts once the replacement registers."""
    coords.append(c := make(spawner=(sp := FakeSpawner())))
    now = time.monotonic()
    ps0 = register_ps(c, b"ps0")
    c._tick(now + 3.0)  # ps0 silent for longer than the 2 s timeout; no worker yet
    assert ps0 not in c.members and c.state == "waiting" and sp.spawned == ["ps"]
    register_worker(c, b"w0")
    c._tick(time.monotonic())
    assert c.op is None  # still no PS
    register_ps(c, b"ps1")
    c._tick(time.monotonic())
    assert c.op is not None and c.op.change == "start" and c.state == "starting"


def test_a_dead_ps_is_replaced_by_a_spare_which_restores_its_chunks(coords) -> None:
    coords.append(c := make(spawner=(sp := FakeSpawner())))
    ids = running(c, ps=1, workers=1)
    old = c.plan
    sp.spawned.clear()
    c._on_leave(b"ps0", Leave(member_id=ids["ps0"], reason="error"))
    assert sp.spawned == ["ps"] and c.failed_ps == {ids["ps0"]}
    c._tick(time.monotonic())
    assert c.op is None  # waits for the replacement to register
    spare = register_ps(c, b"ps1")
    c._tick(time.monotonic())
    plan = c.op.plan  # type: ignore[union-attr]
    assert list(plan.ps) == [spare] and set(plan.owners) == {spare} and plan.dead_ps == [ids["ps0"]]
    assert plan.restore == list(range(len(old.owners)))  # type: ignore[union-attr]


def test_a_job_without_a_worker_left_fails(coords) -> None:
    coords.append(c := make())
    ids = running(c)
    c._on_leave(b"w0", Leave(member_id=ids["w0"], reason="error"))
    c._tick(time.monotonic())
    assert c.state == "done" and c.exit_code == 1
    assert {to for to, m in out(c).take(Stop)} == {b"ps0"}


def test_a_member_dying_mid_operation_fails_it_and_a_failed_start_fails_the_job(coords) -> None:
    coords.append(c := make())
    ids = running(c)
    register_worker(c, b"w1")
    c._on_scale(CLIENT, ScaleRequest(workers=2))
    c._tick(time.monotonic())
    c._on_leave(b"w0", Leave(member_id=ids["w0"], reason="error"))
    (_, reply), = out(c).take(ScaleReply)
    assert not reply.ok and "died during the operation" in reply.reason
    assert c.state == "running"  # a prepare that failed changed nothing; recovery follows

    coords.append(d := make())
    register_ps(d, b"ps0")
    register_worker(d, b"w0")
    d._tick(time.monotonic())
    keep_alive(d)
    d._tick(time.monotonic() + 200.0)  # operation_timeout_s (120 s) passed during the first plan
    assert d.state == "done" and d.exit_code == 1


def test_when_every_worker_finished_the_job_ends_and_everyone_is_stopped(coords) -> None:
    coords.append(c := make(initial_workers=2))
    ids = running(c, workers=2)
    c._on_leave(b"w0", Leave(member_id=ids["w0"], reason="finished"))
    c._tick(time.monotonic())
    assert c.state == "running"
    c._on_leave(b"w1", Leave(member_id=ids["w1"], reason="finished"))
    c._tick(time.monotonic())
    assert c.state == "done" and c.exit_code == 0
    assert sorted(to for to, _ in out(c).take(Stop)) == [b"ps0", b"w0", b"w1"]


def test_a_stop_request_runs_a_stop_plan_then_stops_the_ps(coords) -> None:
    coords.append(c := make())
    running(c)
    c._on_stop(CLIENT, StopRequest())
    c._tick(time.monotonic())
    assert c.op is not None and c.op.plan.stop and c.op.change == "stop"
    complete(c)
    sent = out(c).take()
    assert [(to, m.ok) for to, m in sent if isinstance(m, StopReply)] == [(CLIENT, True)]
    assert [to for to, m in sent if isinstance(m, Stop)] == [b"ps0"]
    assert c.state == "stopping"
    keep_alive(c)
    c._tick(time.monotonic() + 11.0)  # the workers did not leave within 10 s
    assert c.state == "done"


def test_a_paused_job_keeps_its_ps_and_does_not_end_until_workers_come_back(coords) -> None:
    coords.append(c := make(min_workers=0))
    ids = running(c)
    c._on_scale(CLIENT, ScaleRequest(workers=0))
    c._tick(time.monotonic())
    assert c.op is not None and c.op.change == "remove_worker"
    complete(c)
    assert c.plan is not None and c.plan.workers == [] and list(c.plan.ps) == [ids["ps0"]]
    assert ids["w0"] not in c.members  # the removed worker is forgotten, not waited for
    keep_alive(c)
    c._tick(time.monotonic() + 30.0)
    assert c.state == "running"  # no worker in the plan: paused, not finished
    register_worker(c, b"w1")
    c._on_scale(CLIENT, ScaleRequest(workers=1))
    c._tick(time.monotonic())
    assert c.op is not None and c.op.plan.workers == [max(c.members)]


def test_suspensions_are_recorded_on_their_event(coords) -> None:
    coords.append(c := make())
    ids = running(c)
    pid = c.events[-1].plan_id
    c._on_suspended(b"w0", Suspended(member_id=ids["w0"], plan_id=pid, suspension_ms=42.0))
    event = c.events[-1]
    assert event.suspension_ms == {ids["w0"]: 42.0} and event.resumed_at is not None
    assert c.status().last_suspension_ms == 42.0


def test_status_is_answered_to_whoever_asks(coords) -> None:
    coords.append(c := make())
    c._on_status(CLIENT, StatusRequest())
    (to, st), = out(c).take()
    assert to == CLIENT and st.state == "waiting" and st.members == [] and not st.started


def _rejoin(c: Coordinator, ident: bytes, mid: int, role: str, plan, owned=(), version: int = 7) -> None:
    extra = dict(shapes=SHAPES, optimizer=OPT, global_batch=8, num_samples=800) if role == "worker" else {}
    c._on_rejoin(ident, Rejoin(role=role, member_id=mid, address="tcp://127.0.0.1:9100", pid=5,
                               version=version, plan=plan, owned=list(owned), **extra))
    out(c).take(Registered)


def test_a_restarted_coordinator_rebuilds_the_plan_its_members_rejoin_with(coords) -> None:
    coords.append(old := make(initial_ps=2))
    ids = running(old, ps=2, workers=1)
    plan = old.plan
    assert plan is not None
    coords.append(c := make(rejoin=True))
    assert c.state == "rebuilding"
    p0, p1 = ids["ps0"], ids["ps1"]
    owned0 = [cid for cid, o in enumerate(plan.owners) if o == p0]
    _rejoin(c, b"ps0", p0, "ps", plan, owned=owned0)
    _rejoin(c, b"ps1", p1, "ps", plan, owned=[cid for cid, o in enumerate(plan.owners) if o == p1])
    _rejoin(c, b"w0", ids["w0"], "worker", plan)
    c._tick(time.monotonic())
    assert c.state == "rebuilding"  # within the grace
    keep_alive(c)
    c._tick(c.started + 2.0)
    assert c.state == "running" and c.plan == plan and c.failed_ps == set()
    assert c.next_plan_id == plan.plan_id + 1 and c.next_member_id == max(ids.values()) + 1
    with pytest.raises(ProtocolError, match="outside a coordinator restart"):
        c._on_rejoin(b"late", Rejoin(role="ps", member_id=9, pid=1, version=0))


def test_a_rebuild_without_a_ps_recovers_it_and_without_plans_starts_fresh(coords) -> None:
    coords.append(old := make(initial_ps=2))
    ids = running(old, ps=2, workers=1)
    plan = old.plan
    coords.append(c := make(rejoin=True))
    _rejoin(c, b"ps0", ids["ps0"], "ps", plan, owned=[cid for cid, o in enumerate(plan.owners)  # type: ignore[union-attr]
                                                       if o == ids["ps0"]])
    _rejoin(c, b"w0", ids["w0"], "worker", plan)
    keep_alive(c)
    c._tick(c.started + 2.0)
    assert c.state == "running" and c.failed_ps == {ids["ps1"]}
    c._tick(time.monotonic())  # no spawner: the survivor takes the dead PS's chunks, restored
    assert c.op is not None and list(c.op.plan.ps) == [ids["ps0"]] and c.op.plan.restore

    coords.append(fresh := make(rejoin=True))
    _rejoin(fresh, b"w9", 9, "worker", None)
    fresh._tick(fresh.started + 2.0)
    assert fresh.state == "waiting" and fresh.next_member_id == 10
