"""The Ray side's typed messages (clusters/ray/messages.py) and the host's slot book
(clusters/ray/host/slots.py): the JSON a user sees keeps the keys of the dicts they replaced; a stored record
reads back. No Ray runs."""

from __future__ import annotations

import json
import math

from clusters.ray.backend import RayJob
from clusters.ray.host.slots import SlotBook
from clusters.ray.messages import HostStatus, MemberRow, PushedReading, ScaleCall, ScaleReply, SlotObservation
from clusters.ray.record import HostRecord, SlotClock
from dl2ray.jobspec import JobSpec
from elastic_mxnet.protocol.messages import MemberInfo, ScalingEvent, StatusReply

SPEC = JobSpec.model_validate({"name": "j", "job_type": "resnet-50", "epochs": 3,
                               "workers": {"min": 1, "max": 4}, "ps_count": {"min": 1, "max": 2}})

STATUS_KEYS = {"name", "job_id", "job_type", "state", "reason", "spec", "submitted_at", "started_at",
               "finished_at", "ps", "workers", "members", "epochs_done", "est_epochs", "iteration",
               "samples_per_s", "operation", "events", "history", "actions", "busy", "spawned", "warm_taken",
               "restarts"}


def _status(**kw) -> HostStatus:
    base = dict(name="j", job_id=7, job_type="resnet-50", state="running", reason="", spec=SPEC,
                submitted_at=10.0, started_at=11.0, finished_at=None, ps=1, workers=2,
                members=(MemberRow(name="m0", role="ps", pid=3, node="n1", member_id=0, state="member"),
                         MemberRow(name="m1", role="worker", pid=None, node="n2", member_id=None,
                                   state="starting")),
                epochs_done=1.5, est_epochs=3.0, iteration=40, samples_per_s=12.5, operation=None,
                events=(ScalingEvent(plan_id=2, change="workers 1 -> 2", clock=30, duration_ms=80.0,
                                     suspension_ms={1: 12.0}),),
                history=(SlotObservation(slot=4, ps=1, workers=1, epochs=0.5, seconds=10.0),),
                actions=(ScaleCall(time=12.0, ok=True, reason="started", ps=1, workers=1, seconds=2.0),
                         ScaleCall(time=20.0, ok=True, reason="no change", ps=1, workers=2, seconds=0.1,
                                   plan_id=2)),
                busy=False, spawned=2, warm_taken=1, restarts=0)
    return HostStatus(**{**base, **kw})


def test_a_full_status_has_the_keys_of_jobs_status_and_is_json() -> None:
    d = _status().to_dict()
    assert set(d) == STATUS_KEYS
    assert d["spec"] == SPEC.model_dump(mode="json") and d["members"][1]["state"] == "starting"
    assert d["events"][0]["suspension_ms"] == {"1": 12.0}  # JSON's string keys, as the events always had
    # a call the coordinator was not asked about has neither plan_id nor clock; one it answered has both
    assert d["actions"][0] == {"time": 12.0, "ok": True, "reason": "started", "ps": 1, "workers": 1,
                               "seconds": 2.0}
    assert d["actions"][1]["plan_id"] == 2 and d["actions"][1]["clock"] is None
    assert math.isnan(d["history"][0]["loss"])
    json.dumps(d)


def test_a_brief_status_names_its_history_window_and_a_reading_drops_the_spec() -> None:
    brief = _status(history_from=3, history_len=4, events=(), actions=()).to_dict()
    assert set(brief) == STATUS_KEYS | {"history_from", "history_len"}
    reading = PushedReading(**{**dict(_status(history_from=3, history_len=4)), "spec": None}, slot=5,
                            epoch=100.0, slot_seconds=10.0, pushed_at=150.0)
    d = reading.to_dict()
    assert "spec" not in d and d["slot"] == 5 and d["pushed_at"] == 150.0
    back = PushedReading.from_dict(json.loads(json.dumps(d)))
    assert back.spec is None and back.history_len == 4 and back.members == reading.members
    assert math.isnan(back.history[0].loss)


def test_a_stored_record_with_null_losses_reads_back_as_nan() -> None:
    rec = HostRecord(state="running", history=[SlotObservation(slot=0, ps=1, workers=1, epochs=0.1,
                                                               seconds=9.0)],
                     actions=[ScaleCall(time=1.0, ok=True, reason="started", ps=1, workers=1, seconds=1.0)],
                     clock=SlotClock(epoch=0.0, slot_seconds=10.0))
    raw = rec.model_dump_json()
    assert '"loss":null' in raw
    back = HostRecord.model_validate_json(raw)
    assert math.isnan(back.history[0].loss) and back.actions == rec.actions and back.clock == rec.clock


def test_a_reply_records_its_call_only_with_targets() -> None:
    reply = ScaleReply(ok=True, reason="scaled", ps=1, workers=3, seconds=0.5, plan_id=4, clock=90)
    assert reply.call(5.0) == ScaleCall(time=5.0, ok=True, reason="scaled", ps=1, workers=3, seconds=0.5,
                                        plan_id=4, clock=90)


def test_the_backend_continues_a_known_history_from_a_brief_reading() -> None:
    first = RayJob.from_status(_status(history=tuple(
        SlotObservation(slot=s, ps=1, workers=1, epochs=0.1, seconds=10.0) for s in range(3))))
    assert [h.slot for h in first.history] == [0, 1, 2] and first.spec == SPEC
    reading = PushedReading(**{**dict(_status()), "spec": None, "history_from": 2, "history_len": 4,
                               "history": tuple(SlotObservation(slot=s, ps=1, workers=2, epochs=0.2,
                                                                seconds=10.0) for s in (2, 3))},
                            slot=4, epoch=0.0, slot_seconds=10.0, pushed_at=40.0)
    job = RayJob.from_status(reading, first)
    assert [h.slot for h in job.history] == [0, 1, 2, 3] and job.history[2].workers == 2
    assert job.spec == SPEC and job.plan() == (1, 0)  # one PS in the plan; the worker is starting


def _coordinator(epochs: float, workers: int) -> StatusReply:
    members = [MemberInfo(member_id=0, role="ps", state="member", pid=1, address="a", version=0)]
    members += [MemberInfo(member_id=i + 1, role="worker", state="member", pid=i + 2, address="a", version=0)
                for i in range(workers)]
    return StatusReply(state="running", members=members, plan_id=1, version=5, samples_per_s=1.0,
                       epochs_done=epochs, last_suspension_ms=None, events=[])


def test_the_slot_book_closes_each_slot_once_from_the_mark_before() -> None:
    book = SlotBook()
    assert book.close(3, None, 0.0, started=False) is None and book.mark is None  # pending: no mark taken
    assert book.close(4, _coordinator(0.0, 1), 0.0, started=True) is None  # the first mark
    obs = book.close(5, _coordinator(0.75, 2), 0.75, started=True)
    assert obs is not None and (obs.slot, obs.ps, obs.workers, obs.epochs) == (4, 1, 2, 0.75)
    assert book.close(5, _coordinator(0.9, 2), 0.9, started=True) is obs  # idempotent per slot
    assert book.close(4, _coordinator(0.9, 2), 0.9, started=True) is None and book.opened == 5
    again = SlotBook(book.history)  # a restarted host goes on after its recorded slots
    assert again.opened == 5 and again.mark is None
