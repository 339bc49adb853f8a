"""One live job on Ray: a named, detached host actor running the job's elastic MXNet coordinator.

The host actor (:class:`JobHostImpl`, named ``dl2ray-job-<name>`` in the
``dl2ray`` namespace) *is* the job as far as the cluster is concerned: it holds
the job spec, runs the :class:`~elastic_mxnet.coordination.coordinator.Coordinator` in a
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

The host composes the parts of :mod:`clusters.ray.host` (members, coordinator,
slot observations, record saver, pusher); its answers are the typed messages of
:mod:`clusters.ray.messages`.

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

from clusters.agent.plan import PAUSED_PS, bounded
from clusters.ray.host.coordinator import CoordinatorRunner
from clusters.ray.host.members import HostMembers
from clusters.ray.host.pusher import ReadingPusher
from clusters.ray.host.saver import RecordSaver
from clusters.ray.host.slots import SlotBook
from clusters.ray.messages import TERMINAL, HostStatus, PushedReading, ScaleCall, ScaleReply, SlotObservation
from clusters.ray.readings import TAIL
from clusters.ray.record import HostRecord, SlotClock, load_record
from clusters.ray.spawner import POOL_NAME, RaySpawner
from clusters.runtime import actor_class
from dl2ray.jobspec import JobSpec
from elastic_mxnet.config import Liveness
from elastic_mxnet.job import ScaleRefused
from elastic_mxnet.protocol.messages import ScalingEvent, StatusReply

log = logging.getLogger(__name__)

JOB_PREFIX = "dl2ray-job-"
__all__ = ["JOB_PREFIX", "TERMINAL", "JobHost", "JobHostImpl", "host_name"]


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
        self.members = HostMembers(RaySpawner(self.spec.name, self.spec.worker_args(), self.spec.worker,
                                              self.spec.ps, pool))
        # a member outlives a silent coordinator by orphan_timeout_s: long enough for Ray to restart the host
        liveness = Liveness(heartbeat_timeout_s=heartbeat_timeout_s, orphan_timeout_s=orphan_timeout_s)
        self.coordinator = CoordinatorRunner(self.members, liveness, register_timeout_s)
        self.state = "pending"
        self.reason = ""
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.actions: list[ScaleCall] = []
        self._old_events: list[ScalingEvent] = []  # scaling events of the coordinator before a restart
        self.restarts = 0
        self._op = threading.Lock()  # one scale operation at a time
        record = load_record(self.spec.name)
        self.slots = SlotBook(record.history if record else None)
        self.saver = RecordSaver(self.spec.name, self._record)
        self.pusher = ReadingPusher(self.spec.name, self.slots, self._read, self._close_slot, self._reading,
                                    record.clock if record else None)  # a restarted host goes on pushing
        if record is not None:
            self._recover(record)
        self.pusher.start()

    # ---- durability -----------------------------------------------------------

    def _record(self) -> HostRecord:
        return HostRecord(state=self.state, reason=self.reason, coordinator=self.coordinator.address,
                          started_at=self.started_at, finished_at=self.finished_at, restarts=self.restarts,
                          history=list(self.slots.history), actions=list(self.actions),
                          events=self._all_events(), clock=self.pusher.clock)

    def _all_events(self) -> list[ScalingEvent]:
        return self._old_events + self.coordinator.events

    def _recover(self, rec: HostRecord) -> None:
        """After a restart: the record's state, the members adopted, the coordinator back in rejoin mode."""
        self.restarts = rec.restarts + 1
        self.reason, self.started_at, self.finished_at = rec.reason, rec.started_at, rec.finished_at
        self.actions, self._old_events = list(rec.actions), list(rec.events)
        self.state = rec.state
        address, ended = self.members.adopt()
        log.info("job %s: host restarted (%s), adopted %d members", self.spec.name, rec.state,
                 self.members.alive + len(ended))
        if rec.state in TERMINAL or rec.state == "pending" or rec.coordinator is None:
            self.members.kill_all()  # nothing may run for a job that is over or not started
            self.saver.save()
            return
        import ray.util

        here = ray.util.get_node_ip_address()
        if any(r.role == "worker" and r.exit_code == 0 for r in ended):
            self._end("finished", "")  # its workers reached the last iteration while the host was down
        elif not self.members.alive:
            self._end("failed", "host restarted and no member of the job was alive")
        elif not rec.coordinator.startswith(f"tcp://{here}:"):
            self._end("failed", f"host restarted on another node ({here}): members know {rec.coordinator}")
        else:
            self.coordinator.start(self.coordinator.config(self.spec, 0, 0, rec.coordinator), rejoin=True)
            log.info("job %s: coordinator rejoining on %s", self.spec.name, address or rec.coordinator)
        self.saver.save()

    def _end(self, state: str, reason: str) -> None:
        self.state, self.reason, self.finished_at = state, reason, time.time()
        self.members.close(grace_s=0.0 if state != "finished" else 15.0)

    # ---- reading ------------------------------------------------------------

    def spec_json(self) -> str:
        return self.spec.model_dump_json()

    def status(self) -> HostStatus:
        """The job as it is now: state, progress, members (with pid and node), scaling events, history.
        What it read is pushed as the job's reading too (:mod:`clusters.ray.readings`)."""
        at, st = self._read()
        self.pusher.publish(st, at)
        return self._status(st)

    def slot_status(self, slot: int, history_from: int = 0,
                    clock: SlotClock | None = None) -> HostStatus:
        """:meth:`mark_slot` then :meth:`status`, with one coordinator query (the backend's direct read).

        Brief: no scaling events or scale calls, and of the history only the observations from index
        ``history_from`` on (the backend keeps the ones it read); ``history_len`` is the full count.
        ``clock``: the agent's slots; from now on the host closes its
        slots and pushes its readings at those slots itself (kept in its record, so after a restart too)."""
        if clock is not None and self.pusher.follow(clock):
            self.saver.save()
        at, st = self._read()
        self.pusher.publish(st, at, opens=slot)
        history = self.slots.history
        return self._status(st, brief=True).model_copy(update=dict(
            history=tuple(history[history_from:]), history_from=history_from, history_len=len(history)))

    def _read(self) -> tuple[float, StatusReply | None]:
        """Members reaped, then the coordinator's status: (monotonic time of the read, the status)."""
        self.members.reap()
        return time.monotonic(), self._coordinator_status()

    def _reading(self, st: StatusReply | None, clock: SlotClock) -> PushedReading:
        """The reading pushed for ``st`` at ``clock``: brief, no spec, the last observations."""
        history = self.slots.history
        start = max(len(history) - TAIL, 0)
        brief = dict(self._status(st, brief=True))
        brief.update(spec=None, history=tuple(history[start:]), history_from=start, history_len=len(history))
        return PushedReading(**brief, slot=self.slots.opened, epoch=clock.epoch,
                             slot_seconds=clock.slot_seconds, pushed_at=time.time())

    def _status(self, st: StatusReply | None, brief: bool = False) -> HostStatus:
        members = self.members.rows(st)
        plan = [m for m in members if m.state == "member"]
        return HostStatus(
            name=self.spec.name, job_id=self.job_id, job_type=self.spec.job_type, state=self.state,
            reason=self.reason, spec=self.spec, submitted_at=self.submitted_at, started_at=self.started_at,
            finished_at=self.finished_at, ps=sum(m.role == "ps" for m in plan),
            workers=sum(m.role == "worker" for m in plan), members=members,
            epochs_done=st.epochs_done if st else self._final_epochs(), est_epochs=self.spec.epochs,
            iteration=st.version if st else None, samples_per_s=st.samples_per_s if st else 0.0,
            operation=st.operation if st else None, events=() if brief else tuple(self._all_events()),
            history=() if brief else tuple(self.slots.history), actions=() if brief else tuple(self.actions),
            busy=self._op.locked(), spawned=self.members.spawner.seq,
            warm_taken=self.members.spawner.warm_taken, restarts=self.restarts)

    def _final_epochs(self) -> float:
        return self.spec.epochs if self.state == "finished" else self.slots.last_epochs()

    def _coordinator_status(self) -> StatusReply | None:
        self._check_thread()
        if self.state in TERMINAL:
            return None
        return self.coordinator.read()

    def _check_thread(self) -> None:
        """Notice the end of the coordinator's thread: finished (exit 0) or failed."""
        code = self.coordinator.ended()
        if code is None or self.state in TERMINAL:
            return
        self.state = "finished" if code == 0 else "failed"
        self.reason = "" if code == 0 else f"coordinator exited with {code}"
        self.finished_at = time.time()
        self.members.close()
        self.saver.save()

    # ---- the slot ----------------------------------------------------------

    def mark_slot(self, slot: int) -> SlotObservation | None:
        """Close the observation of the slot before ``slot`` (idempotent per slot); return it or None.

        The observation is what the job did since the previous mark: epochs
        trained, wall seconds, and the PS/workers it ran with.
        """
        return self.pusher.close_slot(slot, self._coordinator_status())

    def _close_slot(self, slot: int, st: StatusReply | None) -> SlotObservation | None:
        """Close slot ``slot - 1`` (the pusher calls it in order with its pushes)."""
        before = len(self.slots.history)
        obs = self.slots.close(slot, st, st.epochs_done if st else self._final_epochs(),
                               started=self.state != "pending")
        if len(self.slots.history) > before:
            self.saver.save_soon()
        return obs

    # ---- control ------------------------------------------------------------

    def scale_to(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> ScaleReply:
        """Run with ``ps`` PS and ``workers`` workers (absolute; ``workers == 0``: pause).

        New members go to ``ps_nodes``/``worker_nodes`` in order. Scale-up starts
        the missing members, then scales; scale-down scales, then the removed
        members exit and their actors are ended. A paused job keeps one PS
        (its parameters and optimizer state). The reply's ``members`` are the
        member actors alive afterwards (role and node; what the job holds of
        the cluster now), so the backend does not read the host again in the
        same slot; the new deployment is pushed as the job's reading.
        """
        if not self._op.acquire(blocking=False):
            return ScaleReply(ok=False, reason="busy: an operation is in progress")
        try:
            result = self._scale(ps, workers, ps_nodes, worker_nodes)
        finally:
            self._op.release()
        at, st = self._read()
        self.pusher.publish(st, at)
        return result.model_copy(update={"members": self.members.rows(st)})

    def _scale(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> ScaleReply:
        self._check_thread()
        if self.state in TERMINAL:
            return ScaleReply(ok=False, reason=f"job is {self.state}")
        if workers > 0:
            ps, workers = bounded(ps, workers, self.spec)
        else:
            ps = PAUSED_PS
        t0 = time.time()
        if self.coordinator.coordinator is None:
            if workers == 0:
                return ScaleReply(ok=True, reason="not started")
            result = self._start(ps, workers, ps_nodes, worker_nodes)
        else:
            result = self._rescale(ps, workers, ps_nodes, worker_nodes)
        result = result.model_copy(update=dict(ps=ps, workers=workers, seconds=time.time() - t0))
        self.actions.append(result.call(t0))
        self.saver.save()
        return result

    def _start(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> ScaleReply:
        self.members.prefer(ps_nodes, worker_nodes)
        self.coordinator.start(self.coordinator.config(self.spec, ps, workers), rejoin=False)
        self.state, self.started_at = "running", time.time()
        self.saver.save()
        deadline = time.monotonic() + self.coordinator.register_timeout_s
        while time.monotonic() < deadline:
            st = self._coordinator_status()
            if st is not None and st.started:
                return ScaleReply(ok=True, reason="started")
            if not self.coordinator.running:
                break
            time.sleep(0.1)
        self._check_thread()
        if self.state == "finished":  # a short job trained to its end between two polls
            return ScaleReply(ok=True, reason="started")
        return ScaleReply(ok=False, reason=f"the job did not start ({self.state})")

    def _rescale(self, ps: int, workers: int, ps_nodes: list[str], worker_nodes: list[str]) -> ScaleReply:
        self.members.reap()
        self.members.prefer(ps_nodes, worker_nodes)
        try:
            reply = self.coordinator.scale(ps, workers)
        except (ScaleRefused, TimeoutError) as exc:
            return ScaleReply(ok=False, reason=str(exc))
        finally:
            self.members.prefer([], [])
        self.state = "paused" if workers == 0 else "running"
        self._trim_spares()
        return ScaleReply(ok=True, reason=reply.reason or "scaled", plan_id=reply.plan_id, clock=reply.clock)

    def _trim_spares(self) -> None:
        """End member actors that registered but are in no plan (left over from a refused operation)."""
        st = self._coordinator_status()
        if st is not None:
            self.members.stop_standby(st)

    def cancel(self) -> ScaleReply:
        """Stop the job now: every member ends, the job is ``cancelled`` (idempotent)."""
        if self.state in TERMINAL:
            return ScaleReply(ok=self.state == "cancelled", reason=f"job is {self.state}")
        self.state, self.finished_at, self.reason = "cancelled", time.time(), "cancelled"
        self.coordinator.stop()  # its loop ends at the next tick and stops the members
        self.members.kill_all()
        self.saver.save()
        self.pusher.publish(None, time.monotonic())
        return ScaleReply(ok=True, reason="cancelled")

    def kill_member(self, role: str) -> str | None:
        """Tests and fault drills: kill one member actor of ``role`` (its process dies); its name."""
        return self.members.kill(role)


JobHost = actor_class(JobHostImpl, num_cpus=0, max_restarts=-1, max_concurrency=8)
"""The host actor class; created detached and named by :meth:`clusters.ray.backend.RayBackend.submit`."""
