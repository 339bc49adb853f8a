"""Faults on a real job: a worker dies, a PS dies, the coordinator restarts."""

from __future__ import annotations

import os
import signal

import pytest

pytestmark = pytest.mark.slow

SNAPSHOT_EVERY = 5
LAUNCH = [
    "--ps",
    "2",
    "--workers",
    "3",
    "--heartbeat-timeout",
    "1",
    "--snapshot-every",
    str(SNAPSHOT_EVERY),
]
WORKER = ["--iterations", "0", "--iter-sleep", "0.01"]


def _members(st, role):
    return [m for m in st.members if m.role == role and m.state == "member"]


def _recovered(st, what):
    return [e for e in st.events if e.change.startswith("recover") and what in e.change]


def test_worker_and_ps_failures_then_coordinator_restart(launch_job):
    job = launch_job(LAUNCH, WORKER)
    st = job.wait_for(lambda st: st.state == "running" and st.version >= 20, "training")

    # a worker dies: it is dropped and the others go on
    victim = max(_members(st, "worker"), key=lambda m: m.member_id)
    os.kill(victim.pid, signal.SIGKILL)
    st = job.wait_for(lambda st: _recovered(st, "workers"), "worker recovery")
    assert victim.member_id not in [m.member_id for m in st.members]
    assert len(_members(st, "worker")) == 2
    at = st.version
    st = job.wait_for(lambda st: st.version >= at + 20, "training after the worker died")

    # a PS dies: a replacement takes its chunks from the latest snapshot
    dead_ps = max(_members(st, "ps"), key=lambda m: m.member_id)
    os.kill(dead_ps.pid, signal.SIGKILL)
    st = job.wait_for(lambda st: _recovered(st, "ps"), "PS recovery")
    event = _recovered(st, "ps")[0]
    # snapshots every K updates, written in the background: at most 2K behind the clock
    assert 0 <= event.lost_iterations <= 2 * SNAPSHOT_EVERY
    ps_ids = [m.member_id for m in _members(st, "ps")]
    assert len(ps_ids) == 2 and dead_ps.member_id not in ps_ids
    at = st.version
    st = job.wait_for(lambda st: st.version >= at + 20, "training after the PS died")

    # the coordinator dies and comes back: membership rebuilt from re-registrations
    before = sorted((m.member_id, m.role) for m in st.members)
    job.restart_coordinator(LAUNCH, WORKER)
    st = job.wait_for(lambda st: st.state == "running", "rebuilt membership")
    assert sorted((m.member_id, m.role) for m in st.members) == before
    at = st.version
    job.wait_for(lambda st: st.version >= at + 20, "training after the restart")
    reply = job.job.scale(workers=3)
    assert reply.ok
    st = job.status()
    assert len(_members(st, "worker")) == 3
    job.job.stop()
    assert job.wait_exit() == 0
