"""A job stays in the listing while its host is slow (clusters/ray/backend.py ``statuses``), and a host
ending its members does not hold its listing up for the grace it gives them (clusters/ray/job.py
``close_members``). On the session's local Ray, with small stand-in actors: no MXNet member runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dl2ray.config import load_config
from dl2ray.jobspec import TaskDemand

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _gate_class(ray):
    @ray.remote(max_concurrency=4)
    class Gate:
        """A stand-in host or member: ``status``/``wait`` return once the gate is open (at once if open)."""

        def __init__(self) -> None:
            self.opened = threading.Event()
            self.opened.set()

        def close_gate(self) -> None:
            self.opened.clear()

        def open_gate(self) -> None:
            self.opened.set()

        def status(self) -> dict:
            self.opened.wait()
            return {"name": "slow", "state": "running", "submitted_at": 1.0}

        def wait(self) -> int:
            self.opened.wait()
            return 0

    return Gate


def test_a_host_that_does_not_answer_keeps_its_job_in_the_listing(ray_session) -> None:
    from clusters.ray.backend import RayBackend

    ray = ray_session
    catalogue = load_config(ROOT / "configs" / "testbed.yaml").catalogue
    be = RayBackend(catalogue, slot_seconds=1.0, epoch=time.time())
    host = _gate_class(ray).remote()
    assert be.statuses({"slow": host})["slow"] == {"name": "slow", "state": "running", "submitted_at": 1.0,
                                                    "answering": True}
    ray.get(host.close_gate.remote())
    late = be.statuses({"slow": host}, timeout_s=0.5)
    assert late["slow"]["answering"] is False and late["slow"]["state"] == "running"  # its last answer
    ray.get(host.open_gate.remote())
    assert be.statuses({"slow": host})["slow"]["answering"] is True
    assert be.statuses({}) == {}  # a host no longer listed (removed) is no job any more
    ray.get(host.close_gate.remote())
    assert be.statuses({"slow": host}, timeout_s=0.5) == {}  # nor is one that never answered
    ray.get(host.open_gate.remote())
    ray.kill(host)


def test_ending_members_leaves_the_hosts_lock_free_during_the_grace(ray_session) -> None:
    from clusters.ray.job import close_members
    from clusters.ray.spawner import MemberRecord, RaySpawner

    ray = ray_session
    member = _gate_class(ray).remote()
    ray.get(member.close_gate.remote())
    none = TaskDemand(cpu=0, gpu=0, mem=0)
    spawner = RaySpawner("gate", [], none, none, pool=None)
    spawner.members["m0"] = MemberRecord("m0", "worker", member, member.wait.remote(), None, None,
                                         time.time())
    lock = threading.Lock()
    ending = threading.Thread(target=close_members, args=(spawner, lock, 600.0))
    ending.start()
    try:
        assert lock.acquire(timeout=60)  # taken while close_members waits for the member's run
        lock.release()
        assert ending.is_alive() and list(spawner.members) == ["m0"]  # still in its grace: nothing killed yet
    finally:
        ray.get(member.open_gate.remote())  # the member's run returns: the grace ends
        ending.join(timeout=60)
    assert not ending.is_alive() and spawner.members == {}  # what is left is killed, under the lock
