"""The coordinator's pure rules (elastic_mxnet/coordination/records.py), with values worked out by hand:
change names, a scale request's refusal, the job info, a heartbeat's rate, the status, a rebuilt plan and a
recovery's assignment."""

from __future__ import annotations

import pytest

from elastic_mxnet.config import Limits
from elastic_mxnet.coordination.records import (
    JobInfo,
    Member,
    change_name,
    job_info,
    rebuilt_plan,
    recovery,
    scale_refusal,
    status_reply,
)
from elastic_mxnet.protocol.assignment import make_layout
from elastic_mxnet.protocol.messages import (
    OptimizerSpec,
    Plan,
    ProtocolError,
    Register,
    Rejoin,
    ScaleRequest,
    ScalingEvent,
)

OPT = OptimizerSpec()


def plan(ps: dict[int, str], workers: list[int], owners: list[int] | None = None, plan_id: int = 3) -> Plan:
    layout = make_layout([(4,), (4,), (4,), (4,)], chunk_elems=4)  # four chunks of 16 bytes
    return Plan(plan_id=plan_id, clock=10, layout=layout, owners=owners or [min(ps)] * len(layout), ps=ps,
                workers=workers, optimizer=OPT, global_batch=8, snapshot_dir="/tmp/s", snapshot_every=5)


@pytest.mark.parametrize(("counts", "name"), [
    ((1, 2, 2, 2), "add_ps"),
    ((2, 2, 3, 2), "remove_worker"),
    ((1, 1, 2, 4), "workers 2->4"),
    ((2, 3, 2, 1), "ps 2->3, workers 2->1"),
    ((1, 2, 2, 3), "ps 1->2, workers 2->3"),
])
def test_a_change_is_named_by_what_it_adds_or_removes(counts, name) -> None:
    assert change_name(*counts) == name


LIMITS = Limits(min_ps=1, max_ps=2, min_workers=0, max_workers=4)
RUNNING = plan({0: "a"}, [1, 2])


@pytest.mark.parametrize(("args", "expected"), [
    (dict(state="starting"), ("job is starting, not running", 0, 0)),
    (dict(plan=None), ("job is running, not running", 0, 0)),
    (dict(busy="add_ps"), ("busy: scaling operation 'add_ps' in progress (one at a time)", 0, 0)),
    (dict(recovering=True), ("busy: recovering from a failure", 0, 0)),
    (dict(msg=ScaleRequest(ps=3)), ("ps=3 outside the limits [1, 2]", 0, 0)),
    (dict(msg=ScaleRequest(workers=5)), ("workers=5 outside the limits [0, 4]", 0, 0)),
    (dict(msg=ScaleRequest(workers=3, at_iteration=7)), ("iteration 7 has already started", 0, 0)),
    (dict(msg=ScaleRequest(workers=3, at_iteration=8)), ("", 1, 3)),
    (dict(msg=ScaleRequest(ps=2)), ("", 2, 2)),  # an unnamed count keeps the plan's
    (dict(msg=ScaleRequest(workers=0)), ("", 1, 0)),  # a pause within the limits
])
def test_a_scale_request_is_refused_for_the_first_reason_that_applies(args, expected) -> None:
    kw = dict(msg=ScaleRequest(), state="running", plan=RUNNING, busy=None, recovering=False, limits=LIMITS,
              started=7)
    assert scale_refusal(**{**kw, **args}) == expected


def _worker(shapes=((2, 3),), batch: int = 8) -> Register:
    return Register(role="worker", pid=1, shapes=list(shapes), optimizer=OPT, global_batch=batch,
                    num_samples=64)


def test_the_first_worker_defines_the_job_and_the_others_must_agree() -> None:
    info = job_info(None, _worker())
    assert info == JobInfo([(2, 3)], OPT, 8, 64)
    assert job_info(info, _worker()) is info
    with pytest.raises(ProtocolError, match="differs"):
        job_info(info, _worker(batch=16))
    with pytest.raises(ProtocolError, match="must register"):
        job_info(info, Register(role="worker", pid=1))
    # rebuilt from PS only (no shapes): the first worker with the same optimizer and batch completes it
    partial = JobInfo([], OPT, 8, 8)
    assert job_info(partial, _worker()) == info
    with pytest.raises(ProtocolError):
        job_info(partial, _worker(batch=4))


def test_a_heartbeat_updates_the_rate_as_a_moving_average() -> None:
    m = Member(0, "worker", b"w", "", 1, last_seen=0.0)
    m.heard(5, 0.002, now=10.0)
    assert (m.version, m.version_at, m.rate, m.last_seen, m.rtt_s) == (5, 10.0, 0.0, 10.0, 0.002)
    m.heard(15, 0.002, now=12.0)  # 10 iterations in 2 s: the first measure is taken as is
    assert m.rate == pytest.approx(5.0)
    m.heard(15, 0.004, now=13.0)  # same version: no new measure
    assert m.rate == pytest.approx(5.0) and m.version_at == 12.0 and m.rtt_s == 0.004
    m.heard(25, 0.004, now=14.0)  # 10 in 2 s again... from version_at 12: 5/s -> 0.7*5 + 0.3*5
    assert m.rate == pytest.approx(5.0)
    m.heard(45, 0.004, now=15.0)  # 20 in 1 s: 0.7 * 5 + 0.3 * 20 = 9.5
    assert m.rate == pytest.approx(9.5)


def test_the_status_counts_progress_from_the_slowest_ps_and_the_fastest_worker() -> None:
    p = plan({0: "a", 1: "b"}, [2, 3])
    members = {0: Member(0, "ps", b"", "a", 1, 0.0, state="member", version=40),
               1: Member(1, "ps", b"", "b", 1, 0.0, state="member", version=38),
               2: Member(2, "worker", b"", "", 1, 0.0, state="member", version=39, rate=3.0),
               3: Member(3, "worker", b"", "", 1, 0.0, state="member", version=39, rate=4.0),
               4: Member(4, "worker", b"", "", 1, 0.0)}  # a standby
    events = [ScalingEvent(plan_id=1, change="start", clock=0, duration_ms=5.0,
                           suspension_ms={2: 7.0, 3: 9.0}),
              ScalingEvent(plan_id=2, change="add_worker", clock=20, duration_ms=5.0)]
    st = status_reply("running", members, p, JobInfo([(4,)], OPT, 8, 80), events, "add_ps")
    assert st.version == 38 and st.epochs_done == pytest.approx(38 * 8 / 80)
    assert st.samples_per_s == pytest.approx(4.0 * 8) and st.last_suspension_ms == 9.0
    assert [(m.member_id, m.state) for m in st.members][-1] == (4, "standby") and st.operation == "add_ps"
    empty = status_reply("waiting", {}, None, None, [], None)
    assert (empty.version, empty.epochs_done, empty.samples_per_s, empty.plan_id) == (0, 0.0, 0.0, None)


def _rejoin(mid: int, role: str, p: Plan | None, owned=()) -> Rejoin:
    return Rejoin(role=role, member_id=mid, pid=1, version=0, plan=p, owned=list(owned))


def test_a_rebuilt_plan_is_the_latest_one_with_chunks_where_the_ps_say_they_are() -> None:
    older = plan({0: "a", 1: "b"}, [2], owners=[0, 0, 1, 1], plan_id=3)
    newer = plan({0: "a", 1: "b"}, [2], owners=[0, 1, 0, 1], plan_id=4)
    rebuilt = rebuilt_plan({0: _rejoin(0, "ps", older, owned=[0, 1]),
                            1: _rejoin(1, "ps", newer, owned=[2, 3]),
                            2: _rejoin(2, "worker", newer)})
    assert rebuilt is not None and rebuilt.plan_id == 4 and rebuilt.owners == [0, 0, 1, 1]
    assert rebuilt_plan({5: _rejoin(5, "worker", None)}) is None


def test_a_recovery_uses_spares_for_dead_ps_else_spreads_their_chunks() -> None:
    p = plan({0: "a", 1: "b"}, [2, 3], owners=[0, 1, 0, 1])
    spared = recovery(p, {1}, set(), spares=[7])
    assert spared is not None and spared.ps == [0, 7] and spared.owners == [0, 7, 0, 7]
    assert spared.restore == [1, 3] and spared.change == "recover: ps [1] died"
    spread = recovery(p, {1}, {3}, spares=[])
    assert spread is not None and spread.ps == [0] and spread.owners == [0, 0, 0, 0]
    assert spread.workers == [2] and spread.change == "recover: ps [1] died, workers [3] died"
    assert recovery(p, set(), {2, 3}, spares=[]) is None  # no worker left
    assert recovery(p, {0, 1}, set(), spares=[]) is None  # no PS left
