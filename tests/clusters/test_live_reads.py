"""Host-pushed slot readings (clusters/ray/readings.py) on the session's local Ray.

Job hosts of pending jobs (no member process, so no MXNet) follow the backend's slot clock and push their
readings; the view reads them in one GCS call. Checked: readings arrive without a call to any host; a job
whose reading for the slot is missing is left alone that slot (its last reading, busy) and read the next;
a restarted host resumes pushing from its record; the control loop goes on when a host dies. Every wait
polls live state (``support.wait_for``); nothing asserts wall-clock time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import wait_for
from test_live import small_spec

from dl2ray.config import load_config
from dl2ray.view import Allocation, Tasks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def backend(ray_session):
    """A backend of 1 s slots and the names of the jobs a test submits (removed afterwards)."""
    from clusters.ray.backend import RayBackend

    cat = load_config(ROOT / "configs" / "testbed.yaml").catalogue
    made: list[tuple[RayBackend, list[str]]] = []

    def make(slot_seconds: float = 1.0, **kw) -> tuple[RayBackend, list[str]]:
        be = RayBackend(cat, slot_seconds=slot_seconds, epoch=time.time(), **kw)
        made.append((be, []))
        return made[-1]

    yield make
    for be, names in made:
        for name in names:
            be.remove(name)


def _submit(be, names: list[str], name: str) -> int:
    names.append(name)
    return be.submit(small_spec(name))["job_id"]


def test_readings_arrive_without_a_call_to_any_host(backend) -> None:
    be, names = backend()
    for name in ("push-a", "push-b"):
        _submit(be, names, name)
    be.snapshot()
    assert be.view_parts()["readings_asked"] == 2  # never read: asked directly (and handed the clock)

    def pushed_slot():
        view = be.snapshot()
        parts = be.view_parts()
        ok = parts["readings_pushed"] == 2 and parts["readings_asked"] == parts["readings_resync"] == 0
        return view if ok and not any(j.busy for j in be.jobs.values()) else None

    view = wait_for("a slot read from pushed readings alone", pushed_slot, progress=be.slot_now)
    assert {j.job_id for j in view.jobs} == {be.jobs[n].job_id for n in names}
    assert be.view_parts()["reading_age_ms"] >= 0.0

    from clusters.ray.readings import get_readings

    slots = {n: r.slot for n, r in get_readings(names).items()}
    wait_for("the hosts to push the next slot's readings on their own",
             lambda: all(r.slot > slots[n] for n, r in get_readings(names).items()), progress=be.slot_now)


def test_a_late_reading_leaves_the_job_alone_that_slot_and_it_is_read_the_next(backend) -> None:
    be, names = backend(slot_seconds=3600.0)  # the hosts push on their own only once an hour
    jid = _submit(be, names, "late-a")
    slot = be.slot_now()
    be.snapshot()
    assert be.view_parts()["readings_asked"] == 1 and not be.jobs["late-a"].busy

    be.slot_now = lambda: slot + 1  # the next slot starts; the host has not pushed its reading for it
    view = be.snapshot()
    parts = be.view_parts()
    assert parts["readings_late"] == 1 and parts["readings_resync"] == 1  # asked, not waited for
    assert [j.job_id for j in view.jobs] == [jid]  # its last reading stands in
    report = be.apply(Allocation({jid: Tasks(1, 1)}))
    assert report.skipped_busy == ["late-a"] and report.actions == []  # left alone this slot

    def read_again():
        be.snapshot()
        return not be.jobs["late-a"].busy and be.view_parts()["readings_pushed"] == 1

    wait_for("the late job's reading of this slot", read_again)  # the direct answer's reading, no wait
    assert be.view_parts()["readings_asked"] == 0


def test_a_restarted_host_resumes_pushing_at_the_agents_slots(backend) -> None:
    import ray

    from clusters.ray.readings import get_readings
    from clusters.ray.record import load_record

    be, names = backend()
    _submit(be, names, "restart-a")
    be.snapshot()  # hands the host the clock
    host = be.hosts()["restart-a"]
    record = wait_for("the clock in the host's record", lambda: (r := load_record("restart-a")) and r.clock
                      and r)
    assert record.clock.epoch == be.epoch and record.clock.slot_seconds == be.slot_seconds

    restarts = ray.get(host.status.remote()).restarts
    ray.kill(host, no_restart=False)
    wait_for("the host to come back", lambda: _restarts(ray, host) > restarts)
    now = be.slot_now()
    # no snapshot, no call of the backend: only the clock from its record makes the host open a later slot
    wait_for("the restarted host's own pushes",
             lambda: get_readings(["restart-a"])["restart-a"].slot > now, progress=be.slot_now)

    def fresh():
        be.snapshot()
        parts = be.view_parts()
        return parts["readings_pushed"] == 1 and parts["readings_asked"] == 0

    wait_for("the backend to read the restarted host's pushed reading", fresh, progress=be.slot_now)


def _restarts(ray, host) -> int:
    try:
        return ray.get(host.status.remote(), timeout=30).restarts
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return -1


class Hold:
    """A scheduler that starts nothing (an empty allocation is a valid one)."""

    name = "hold"

    def decide(self, view) -> Allocation:
        return Allocation({})


def test_the_control_loop_goes_on_when_a_host_dies(backend, tmp_path: Path) -> None:
    import ray

    from clusters.agent.loop import Agent
    from clusters.ray.config import LiveConfig

    be, names = backend()
    for name in ("die-a", "die-b"):
        _submit(be, names, name)
    cfg = LiveConfig.model_validate({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                              "scheduler": "drf", "log_dir": str(tmp_path / "log")}})
    agent = Agent(cfg, be, "hold", policy=Hold())  # no member is started: the hosts alone matter here
    try:
        assert agent.step()["jobs"] == 2
        ray.kill(be.hosts()["die-b"])  # no restart: the job is gone
        row = wait_for("the dead host's job to leave the view",
                       lambda: (r := agent.step()).get("jobs") == 1 and r, progress=be.slot_now, within=4)
        assert "error" not in row and agent.errors == {}
        assert set(be.jobs) == {"die-a"}
    finally:
        agent.close()


def test_with_push_off_every_host_is_asked_each_slot(backend) -> None:
    from clusters.ray.config import Reads
    from clusters.ray.readings import get_readings

    be, names = backend(reads=Reads(push=False))
    for name in ("poll-a", "poll-b"):
        _submit(be, names, name)
    for _ in range(2):
        be.snapshot()
        parts = be.view_parts()
        assert (parts["readings_asked"], parts["readings_pushed"]) == (2, 0)
    assert get_readings(names) == {}  # no clock handed over: the hosts push nothing
