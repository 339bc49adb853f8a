"""A job host's member actors: its :class:`~clusters.ray.spawner.RaySpawner` behind the host's lock.

The coordinator's thread spawns and closes members, the host's control calls
prefer nodes and trim spares, and every read reaps; all of them touch the
spawner, so each goes through :class:`HostMembers`, which holds the one lock.
"""

from __future__ import annotations

import threading

import ray

from clusters.ray.messages import MemberRow
from clusters.ray.spawner import MemberRecord, RaySpawner
from elastic_mxnet.protocol.messages import StatusReply


class HostMembers:
    """The member actors of one job (module docstring). ``lock`` guards the spawner."""

    def __init__(self, spawner: RaySpawner) -> None:
        self.spawner = spawner
        self.lock = threading.Lock()

    @property
    def alive(self) -> int:
        return len(self.spawner.members)

    def reap(self) -> list[MemberRecord]:
        """Forget the members whose run ended (:meth:`RaySpawner.reap`); the ended ones."""
        with self.lock:
            return self.spawner.reap()

    def adopt(self) -> tuple[str | None, list[MemberRecord]]:
        """After a host restart: the job's members alive taken back, then reaped; the coordinator address
        they serve (None: none alive) and the ones whose run had ended."""
        with self.lock:
            address = self.spawner.adopt()
            return address, self.spawner.reap()

    def prefer(self, ps_nodes: list[str], worker_nodes: list[str]) -> None:
        """Nodes of the next PS and workers spawned, in order (empty lists: anywhere)."""
        with self.lock:
            self.spawner.prefer("ps", ps_nodes)
            self.spawner.prefer("worker", worker_nodes)

    def rows(self, st: StatusReply | None) -> tuple[MemberRow, ...]:
        """Every member actor alive, joined with the coordinator's view of it (``st``) by pid."""
        by_pid = {m.pid: m for m in st.members} if st else {}
        rows = []
        for rec in list(self.spawner.members.values()):
            m = by_pid.get(rec.pid) if rec.pid is not None else None
            state = m.state if m else ("starting" if rec.pid is None else "unregistered")
            rows.append(MemberRow(name=rec.name, role=rec.role, pid=rec.pid,  # type: ignore[arg-type]
                                  node=rec.node or rec.wanted_node, member_id=m.member_id if m else None,
                                  state=state))
        return tuple(rows)

    def stop_standby(self, st: StatusReply) -> None:
        """End member actors that registered but are in no plan (left over from a refused operation)."""
        standby = {m.pid for m in st.members if m.state == "standby"}
        with self.lock:
            self.spawner.stop([r.name for r in self.spawner.members.values() if r.pid in standby])

    def kill(self, role: str) -> str | None:
        """Tests and fault drills: kill one started member actor of ``role`` (its process dies); its name."""
        with self.lock:
            for rec in self.spawner.members.values():
                if rec.role == role and rec.pid is not None:
                    ray.kill(rec.handle)
                    return rec.name
        return None

    def kill_all(self) -> None:
        """End every member now, no grace (a cancel, a job over or not started)."""
        with self.lock:
            self.spawner.close(grace_s=0.0)

    def close(self, grace_s: float = 15.0) -> None:
        """End every member after ``grace_s`` (:func:`close_members`)."""
        close_members(self.spawner, self.lock, grace_s)

    def for_coordinator(self) -> Locked:
        """The spawner as the coordinator's thread sees it."""
        return Locked(self.spawner, self.lock)


class Locked:
    """The spawner as the coordinator's thread sees it (elastic_mxnet's ``Spawner``): every call under the
    host's lock."""

    def __init__(self, spawner: RaySpawner, lock: threading.Lock) -> None:
        self.spawner, self.lock = spawner, lock

    def spawn(self, role: str, coordinator: str) -> None:
        with self.lock:
            self.spawner.spawn(role, coordinator)

    def close(self) -> None:
        close_members(self.spawner, self.lock)


def close_members(spawner: RaySpawner, lock: threading.Lock, grace_s: float = 15.0) -> None:
    """End every member of a job: its grace (``spawner.await_runs``) *without* the host's lock, which
    ``status()`` and the slot reads take (a job's listing must not wait it out), then kill what is left
    under it."""
    spawner.await_runs(grace_s)
    with lock:
        spawner.close(grace_s=0.0)
