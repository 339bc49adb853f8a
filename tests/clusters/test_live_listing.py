"""A job stays in the listing while its host is slow (clusters/ray/backend.py ``statuses``), and a host
ending its members does not hold its listing up for the grace it gives them (clusters/ray/host/members.py
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


SLOW = dict(name="slow", job_id=1, job_type="resnet-50", state="running", reason="", submitted_at=1.0,
            started_at=None, finished_at=None, ps=0, workers=0, members=(), epochs_done=0.0,
            est_epochs=1.0, iteration=None, samples_per_s=0.0, operation=None, busy=False, spawned=0,
            warm_taken=0, restarts=0)
"""The stand-in host's status (a dict: the actor class is pickled by value, this module's functions not)."""


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

        def status(self):
            from clusters.ray.messages import HostStatus

            self.opened.wait()
            return HostStatus(**SLOW)

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
    from clusters.ray.messages import HostStatus

    assert be.statuses({"slow": host})["slow"] == {**HostStatus(**SLOW).to_dict(), "answering": True}
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
    from clusters.ray.host.members import close_members
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
        # the member's run returns: the grace ends, and close_members may kill the member before this call's
        # reply is back (a race on a loaded machine): its effect is what the join below waits for
        member.open_gate.remote()
        ending.join(timeout=60)
    assert not ending.is_alive() and spawner.members == {}  # what is left is killed, under the lock
