"""One live job on Ray: a named, detached host actor running the job's elastic MXNet coordinator.

The host actor (:class:`JobHostImpl`, named ``dl2ray-job-<name>`` in the
``dl2ray`` namespace) *is* the job as far as the cluster is concerned: it holds
the job spec, runs the :class:`~elastic_mxnet.coordinator.Coordinator` in a
thread, owns the member actors through its :class:`~clusters.ray.spawner.RaySpawner`
and keeps the per-slot observations of the job. Everything a cluster agent
needs after a restart is read back from these actors (level-triggered), never
from a log of the agent's own.

**Restartable.** The host is created with ``max_restarts=-1``. Its members are
named, detached actors (:mod:`clusters.ray.member`), so they outlive it, and it
keeps a durable record (:mod:`clusters.ray.record`: state, coordinator address,
slot observations, scale calls, scaling events) in the Ray cluster's KV store.
When Ray restarts a killed host, ``__init__`` reads the record, re-adopts the
job's members (:meth:`~clusters.ray.spawner.RaySpawner.adopt`) and starts the
coordinator again on the same address in *rejoin* mode: the members, which
kept training meanwhile (the coordinator is not on the data path), re-register
with their ids, plan and shards, and the coordinator rebuilds the plan from
them (docs/elastic_mxnet.md, "Coordinator restarts"). A job whose workers all
finished while the host was down is recorded finished; one with no member left
is failed.

**Pushed readings.** Once a backend's first direct read
(:meth:`JobHostImpl.slot_status`) hands it the agent's slot clock, the host
closes its own slot ``lead_s`` before each slot starts and writes its brief
reading to the GCS (:mod:`clusters.ray.readings`), from a thread of its own; it
writes one again after every scale call, cancel and status read, so the stored
reading is its latest knowledge. The clock is part of the record: a restarted
host goes on pushing.

Control calls are idempotent by contract: :meth:`JobHostImpl.scale_to` takes
absolute targets and starts only the members that are missing (counting the
ones still starting), so a restarted agent repeating a decision starts no
duplicates; one scale operation runs at a time (a second call answers
``busy``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray

from clusters.agent.plan import PAUSED_PS, bounded
from clusters.ray.readings import TAIL, put_reading
from clusters.ray.record import HostRecord, SlotClock, load_record, save_record
from clusters.ray.spawner import POOL_NAME, RaySpawner
from clusters.runtime import actor_class
from dl2ray.jobspec import JobSpec
from elastic_mxnet.config import JobConfig, Limits, Liveness
from elastic_mxnet.coordinator import Coordinator
from elastic_mxnet.job import ElasticJob, ScaleRefused

log = logging.getLogger(__name__)

JOB_PREFIX = "dl2ray-job-"
TERMINAL = ("finished", "failed", "cancelled")
SAVE_DELAY_S = 1.0
"""Seconds a slot's observation waits before the record is written (a host restart may miss it)."""


def host_name(job: str) -> str:
    return JOB_PREFIX + job


class JobHostImpl:
    """Host of one job (module docstring).

    States: pending → running ⇄ paused → finished | failed | cancelled.
    """

    def __init__(self, spec_json: str, job_id: int, submitted_at: float,
                 heartbeat_timeout_s: float = 5.0, register_timeout_s: float = 60.0,
                 orphan_timeout_s: float = 120.0, pool: str | None = POOL_NAME) -> None:
        self.spec = JobSpec.model_validate_json(spec_json)
        self.job_id, self.submitted_at = job_id, submitted_at
        self.spawner = RaySpawner(self.spec.name, self.spec.worker_args(), self.spec.worker, self.spec.ps,
                                  pool)
        # a member outlives a silent coordinator by orphan_timeout_s: long enough for Ray to restart the host
        self.liveness = Liveness(heartbeat_timeout_s=heartbeat_timeout_s, orphan_timeout_s=orphan_timeout_s)
        self.register_timeout_s = register_timeout_s
        self.coordinator: Coordinator | None = None
        self.thread: threading.Thread | None = None
        self.state = "pending"
        self.reason = ""
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.history: list[dict[str, Any]] = []  # one per slot marked: slot, ps, workers, epochs, seconds
        self.actions: list[dict[str, Any]] = []  # every scale call: time, targets, ok, reason
        self._mark: tuple[float, float] | None = None  # (time, epochs) at the last slot mark
        self._event_objs: list[Any] = []  # the coordinator's scaling events, as last read
        self._op = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._client: ElasticJob | None = None  # the status reads' connection to the coordinator
        self._old_events: list[dict[str, Any]] = []  # scaling events of the coordinator before a restart
        self.restarts = 0
        self._save_lock = threading.Lock()
        self._dirty = threading.Event()
        self.clock: SlotClock | None = None  # the agent's slots, once a backend asked for pushed readings
        self._slot = -1  # the latest slot this host opened (closing the one before): its readings' label
        self._push_lock = threading.Lock()  # closing a slot and writing the reading, in order
        self._pushed_at = 0.0  # monotonic time of the coordinator read behind the last reading written
        self._pushed_st: Any = None  # that read (the coordinator's status; None: none)
        self._wake = threading.Event()  # a new clock: the pusher computes its next push time again
        threading.Thread(target=self._saver, name="record-saver", daemon=True).start()
        record = load_record(self.spec.name)
        if record is not None:
            self._recover(record)
        threading.Thread(target=self._pusher, name="slot-pusher", daemon=True).start()

    # ---- durability -----------------------------------------------------------

    def _record(self) -> HostRecord:
        return HostRecord(state=self.state, reason=self.reason,
                          coordinator=self.coordinator.address if self.coordinator else None,
                          started_at=self.started_at, finished_at=self.finished_at, restarts=self.restarts,
                          history=self.history, actions=self.actions, events=self._all_events(),
                          clock=self.clock)

    def _save(self) -> None:
        """Write the record now (state changes, scale calls)."""
        with self._save_lock:
            try:
                save_record(self.spec.name, self._record())
            except Exception:  # the job goes on; only a later restart would miss this change
                log.exception("job %s: could not save the host record", self.spec.name)

    def _save_soon(self) -> None:
        """Write the record from the saver thread (a slot's observation: off the snapshot's path)."""
        self._dirty.set()

    def _saver(self) -> None:
        while True:
            self._dirty.wait()
            # a slot's observation is written a little after the reading that closed it, not while the
            # agent is still collecting every host's reading (the GCS write and JSON would compete with it)
            time.sleep(SAVE_DELAY_S)
            self._dirty.clear()
            self._save()

    def _all_events(self) -> list[dict[str, Any]]:
        return self._old_events + [e.model_dump(mode="json") for e in self._event_objs]

    def _recover(self, rec: HostRecord) -> None:
        """After a restart: the record's state, the members adopted, the coordinator back in rejoin mode."""
        self.restarts = rec.restarts + 1
        self.reason, self.started_at, self.finished_at = rec.reason, rec.started_at, rec.finished_at
        self.history, self.actions, self._old_events = list(rec.history), list(rec.actions), list(rec.events)
        self.state = rec.state
        self.clock = rec.clock  # a restarted host goes on pushing its readings at the agent's slots
        self._slot = self.history[-1]["slot"] + 1 if self.history else -1
        with self._spawn_lock:
            address = self.spawner.adopt()
            ended = self.spawner.reap()
        log.info("job %s: host restarted (%s), adopted %d members", self.spec.name, rec.state,
                 len(self.spawner.members) + len(ended))
        if rec.state in TERMINAL or rec.state == "pending" or rec.coordinator is None:
            with self._spawn_lock:
                self.spawner.close(grace_s=0.0)  # nothing may run for a job that is over or not started
            self._save()
            return
        import ray.util

        here = ray.util.get_node_ip_address()
        if any(r.role == "worker" and r.exit_code == 0 for r in ended):
            self._end("finished", "")  # its workers reached the last iteration while the host was down
        elif not self.spawner.members:
            self._end("failed", "host restarted and no member of the job was alive")
        elif not rec.coordinator.startswith(f"tcp://{here}:"):
            self._end("failed", f"host restarted on another node ({here}): members know {rec.coordinator}")
        else:
            self._start_coordinator(self._config(0, 0, rec.coordinator), rejoin=True)
            log.info("job %s: coordinator rejoining on %s", self.spec.name, address or rec.coordinator)
        self._save()

    def _end(self, state: str, reason: str) -> None:
        self.state, self.reason, self.finished_at = state, reason, time.time()
        close_members(self.spawner, self._spawn_lock, grace_s=0.0 if state != "finished" else 15.0)

    # ---- reading ------------------------------------------------------------

    def spec_json(self) -> str:
        return self.spec.model_dump_json()

    def status(self) -> dict[str, Any]:
        """The job as it is now: state, progress, members (with pid and node), scaling events, history.
        What it read is pushed as the job's reading too (:mod:`clusters.ray.readings`)."""
        with self._spawn_lock:
            self.spawner.reap()
        at = time.monotonic()
        st = self._coordinator_status()
        self._publish(st, at)
        return self._status(st)

    def slot_status(self, slot: int, history_from: int = 0,
                    clock: dict[str, float] | None = None) -> dict[str, Any]:
        """:meth:`mark_slot` then :meth:`status`, with one coordinator query (the backend's direct read).

        Brief: no scaling events or scale calls, and of the history only the observations from index
        ``history_from`` on (the backend keeps the ones it read); ``history_len`` is the full count.
        ``clock``: a :class:`~clusters.ray.record.SlotClock`'s fields; from now on the host closes its
        slots and pushes its readings at those slots itself (kept in its record, so after a restart too)."""
        if clock is not None:
            self._follow(SlotClock.model_validate(clock))
        with self._spawn_lock:
            self.spawner.reap()
        at = time.monotonic()
        st = self._coordinator_status()
        self._publish(st, at, opens=slot)
        out = self._status(st, brief=True)
        out.update(history=self.history[history_from:], history_from=history_from,
                   history_len=len(self.history))
        return out

    # ---- pushed readings (clusters/ray/readings.py) --------------------------

    def _follow(self, clock: SlotClock) -> None:
        if clock != self.clock:
            self.clock = clock
            self._save()
            self._wake.set()

    def _pusher(self) -> None:
        """Open each slot of the followed clock at its push time: close the slot before, push the reading."""
        while True:
            clock = self.clock
            if clock is None:
                self._wake.wait()
                self._wake.clear()
                continue
            slot = clock.next_slot(time.time())
            if self._wake.wait(max(clock.push_time(slot) - time.time(), 0.0)):
                self._wake.clear()  # a new clock
                continue
            try:
                with self._spawn_lock:
                    self.spawner.reap()
                at = time.monotonic()
                self._publish(self._coordinator_status(), at, opens=slot)
            except Exception:  # the next slot tries again; the agent asks directly meanwhile
                log.exception("job %s: could not push the reading of slot %d", self.spec.name, slot)

    def _publish(self, st, at: float, opens: int | None = None) -> None:
        """Close the slot before ``opens`` (if given) and write the reading built from ``st`` (the
        coordinator's status read at monotonic time ``at``). If a later read was written meanwhile, the
        reading is written again only if a slot was opened, from that later read (never an older state)."""
        with self._push_lock:
            opened = opens is not None and opens > self._slot
            if opens is not None:
                self._close_slot(opens, st)
            clock = self.clock
            if clock is None:
                return
            if at < self._pushed_at:
                if not opened:
                    return
                st = self._pushed_st
            else:
                self._pushed_at, self._pushed_st = at, st
            reading = self._status(st, brief=True)
            del reading["spec"]  # the reader has it from its first, direct read
            start = max(len(self.history) - TAIL, 0)
            reading.update(history=self.history[start:], history_from=start, history_len=len(self.history),
                           slot=self._slot, epoch=clock.epoch, slot_seconds=clock.slot_seconds,
                           pushed_at=time.time())
            try:
                put_reading(self.spec.name, reading)
            except Exception:  # the reader finds the previous one, treats the job as late, asks directly
                log.exception("job %s: could not write its reading", self.spec.name)

    def _status(self, st, brief: bool = False) -> dict[str, Any]:
        members = self._members(st)
        plan = [m for m in members if m["state"] == "member"]
        events: list[dict[str, Any]] = []
        if not brief:
            events = self._all_events()
        return {
            "name": self.spec.name, "job_id": self.job_id, "job_type": self.spec.job_type,
            "state": self.state, "reason": self.reason, "spec": self.spec.model_dump(mode="json"),
            "submitted_at": self.submitted_at, "started_at": self.started_at, "finished_at": self.finished_at,
            "ps": sum(m["role"] == "ps" for m in plan), "workers": sum(m["role"] == "worker" for m in plan),
            "members": members,
            "epochs_done": st.epochs_done if st else self._final_epochs(),
            "est_epochs": self.spec.epochs,
            "iteration": st.version if st else None,
            "samples_per_s": st.samples_per_s if st else 0.0,
            "operation": st.operation if st else None,
            "events": events,
            "history": [] if brief else list(self.history), "actions": [] if brief else list(self.actions),
            "busy": self._op.locked(), "spawned": self.spawner.seq, "warm_taken": self.spawner.warm_taken,
            "restarts": self.restarts,
        }

    def _final_epochs(self) -> float:
        return self.spec.epochs if self.state == "finished" else (self._mark[1] if self._mark else 0.0)

    def _coordinator_status(self):
        self._check_thread()
        if self.coordinator is None or self.state in TERMINAL:
            return None
        with self._status_lock:  # one persistent client: no new ZeroMQ context and connection per read
            if self._client is None or self._client.address != self.coordinator.address:
                if self._client is not None:
                    self._client.close()
                self._client = ElasticJob(self.coordinator.address, timeout_s=10)
            try:
                st = self._client.status(timeout_s=10)
            except (TimeoutError, ScaleRefused):
                return None
        self._event_objs = list(st.events)  # turned into dicts only when asked for (status, record)
        return st

    def _members(self, st) -> list[dict[str, Any]]:
        """Every member actor alive, joined with the coordinator's view of it by pid."""
        by_pid = {m.pid: m for m in st.members} if st else {}
        rows = []
        for rec in list(self.spawner.members.values()):
            m = by_pid.get(rec.pid) if rec.pid is not None else None
            rows.append({"name": rec.name, "role": rec.role, "pid": rec.pid,
                         "node": rec.node or rec.wanted_node,
                         "member_id": m.member_id if m else None,
                         "state": m.state if m else ("starting" if rec.pid is None else "unregistered")})
        return rows

    def _check_thread(self) -> None:
        """Notice the end of the coordinator's thread: finished (exit 0) or failed."""
        if self.thread is None or self.thread.is_alive() or self.state in TERMINAL:
            return
        assert self.coordinator is not None
        code = self.coordinator.exit_code
        self.state = "finished" if code == 0 else "failed"
        self.reason = "" if code == 0 else f"coordinator exited with {code}"
        self.finished_at = time.time()
        close_members(self.spawner, self._spawn_lock)
        self._save()

    # ---- the slot ----------------------------------------------------------

    def mark_slot(self, slot: int) -> dict[str, Any] | None:
        """Close the observation of the slot before ``slot`` (idempotent per slot); return it or None.

        The observation is what the job did since the previous mark: epochs
        trained, wall seconds, and the PS/workers it ran with.
        """
        st = self._coordinator_status()
        with self._push_lock:
            return self._close_slot(slot, st)

    def _close_slot(self, slot: int, st) -> dict[str, Any] | None:
        """Close slot ``slot - 1`` (under ``_push_lock``: the pusher and direct reads both close slots)."""
        self._slot = max(self._slot, slot)
        if self.history and self.history[-1]["slot"] >= slot - 1:
            return self.history[-1] if self.history[-1]["slot"] == slot - 1 else None
        now = time.time()
        epochs = st.epochs_done if st else self._final_epochs()
        plan = [m for m in st.members if m.state == "member"] if st else []
        ps = sum(m.role == "ps" for m in plan)
        workers = sum(m.role == "worker" for m in plan)
        obs = None
        if self._mark is not None:
            t0, e0 = self._mark
            obs = {"slot": slot - 1, "ps": ps, "workers": workers, "epochs": max(epochs - e0, 0.0),
                   "seconds": now - t0, "loss": float("nan")}
            self.history.append(obs)
            self._save_soon()
        if self.state not in ("pending",):
            self._mark = (now, epochs)
        return obs

    # ---- control ------------------------------------------------------------

    def scale_to(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> dict[str, Any]:
        """Run with ``ps`` PS and ``workers`` workers (absolute; ``workers == 0``: pause).

        New members go to ``ps_nodes``/``worker_nodes`` in order. Scale-up starts
        the missing members, then scales; scale-down scales, then the removed
        members exit and their actors are ended. A paused job keeps one PS
        (its parameters and optimizer state). Returns ``{ok, reason, ...,
        members}``: ``members`` are the member actors alive afterwards (role
        and node; what the job holds of the cluster now), so the backend does
        not read the host again in the same slot; the new deployment is pushed as the job's reading.
        """
        if not self._op.acquire(blocking=False):
            return {"ok": False, "reason": "busy: an operation is in progress"}
        try:
            result = self._scale(ps, workers, ps_nodes, worker_nodes)
        finally:
            self._op.release()
        with self._spawn_lock:
            self.spawner.reap()
        at = time.monotonic()
        st = self._coordinator_status()
        self._publish(st, at)
        return {**result, "members": self._members(st)}

    def _scale(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> dict[str, Any]:
        self._check_thread()
        if self.state in TERMINAL:
            return {"ok": False, "reason": f"job is {self.state}"}
        if workers > 0:
            ps, workers = bounded(ps, workers, self.spec)
        else:
            ps = PAUSED_PS
        t0 = time.time()
        if self.coordinator is None:
            if workers == 0:
                return {"ok": True, "reason": "not started"}
            result = self._start(ps, workers, ps_nodes, worker_nodes)
        else:
            result = self._rescale(ps, workers, ps_nodes, worker_nodes)
        result.update(ps=ps, workers=workers, seconds=time.time() - t0)
        self.actions.append({"time": t0, **result})
        self._save()
        return result

    def _config(self, ps: int, workers: int, address: str | None = None) -> JobConfig:
        """The coordinator's config: on this node's address, a fresh port (or ``address``'s: a restart)."""
        import ray.util

        spec = self.spec
        port = int(address.rsplit(":", 1)[1]) if address else 0
        return JobConfig(host=ray.util.get_node_ip_address(), port=port, initial_ps=ps,
                         initial_workers=workers, liveness=self.liveness,
                         limits=Limits(min_ps=1, max_ps=spec.ps_count.max, min_workers=0,
                                       max_workers=spec.workers.max,
                                       register_timeout_s=self.register_timeout_s))

    def _start_coordinator(self, cfg: JobConfig, rejoin: bool) -> None:
        """The coordinator in a thread; ``rejoin``: a restarted host's, rebuilding from its members."""
        self.coordinator = Coordinator(cfg, _Locked(self.spawner, self._spawn_lock), rejoin=rejoin)
        self.thread = threading.Thread(target=self.coordinator.serve, name="coordinator", daemon=True)
        self.thread.start()

    def _start(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> dict[str, Any]:
        self.spawner.prefer("ps", ps_nodes)
        self.spawner.prefer("worker", worker_nodes)
        self._start_coordinator(self._config(ps, workers), rejoin=False)
        self.state, self.started_at = "running", time.time()
        self._save()
        deadline = time.monotonic() + self.register_timeout_s
        while time.monotonic() < deadline:
            st = self._coordinator_status()
            if st is not None and st.started:
                return {"ok": True, "reason": "started"}
            if self.thread is None or not self.thread.is_alive():
                break
            time.sleep(0.1)
        self._check_thread()
        if self.state == "finished":  # a short job trained to its end between two polls
            return {"ok": True, "reason": "started"}
        return {"ok": False, "reason": f"the job did not start ({self.state})"}

    def _rescale(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> dict[str, Any]:
        assert self.coordinator is not None
        with self._spawn_lock:
            self.spawner.reap()
            self.spawner.prefer("ps", ps_nodes)
            self.spawner.prefer("worker", worker_nodes)
        try:
            with ElasticJob(self.coordinator.address, timeout_s=self.register_timeout_s + 60) as job:
                reply = job.scale(ps=ps, workers=workers)
        except (ScaleRefused, TimeoutError) as exc:
            return {"ok": False, "reason": str(exc)}
        finally:
            with self._spawn_lock:
                self.spawner.prefer("ps", [])
                self.spawner.prefer("worker", [])
        self.state = "paused" if workers == 0 else "running"
        self._trim_spares()
        return {"ok": True, "reason": reply.reason or "scaled", "plan_id": reply.plan_id,
                "clock": reply.clock}

    def _trim_spares(self) -> None:
        """End member actors that registered but are in no plan (left over from a refused operation)."""
        st = self._coordinator_status()
        if st is None:
            return
        standby = {m.pid for m in st.members if m.state == "standby"}
        with self._spawn_lock:
            spare = [r.name for r in self.spawner.members.values() if r.pid in standby]
            self.spawner.stop(spare)

    def cancel(self) -> dict[str, Any]:
        """Stop the job now: every member ends, the job is ``cancelled`` (idempotent)."""
        if self.state in TERMINAL:
            return {"ok": self.state == "cancelled", "reason": f"job is {self.state}"}
        self.state, self.finished_at, self.reason = "cancelled", time.time(), "cancelled"
        if self.coordinator is not None:
            self.coordinator.state = "done"  # its loop ends at the next tick and stops the members
            if self.thread is not None:
                self.thread.join(timeout=10)
        with self._spawn_lock:
            self.spawner.close(grace_s=0.0)
        self._save()
        self._publish(None, time.monotonic())
        return {"ok": True, "reason": "cancelled"}

    def kill_member(self, role: str) -> str | None:
        """Tests and fault drills: kill one member actor of ``role`` (its process dies); its name."""
        with self._spawn_lock:
            for rec in self.spawner.members.values():
                if rec.role == role and rec.pid is not None:
                    ray.kill(rec.handle)
                    return rec.name
        return None


class _Locked:
    """The spawner as the coordinator's thread sees it: every call under the host's lock."""

    def __init__(self, spawner: RaySpawner, lock: threading.Lock) -> None:
        self.spawner, self.lock = spawner, lock

    def spawn(self, role, coordinator: str) -> None:
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


JobHost = actor_class(JobHostImpl, num_cpus=0, max_restarts=-1, max_concurrency=8)
"""The host actor class; created detached and named by :meth:`clusters.ray.backend.RayBackend.submit`."""
