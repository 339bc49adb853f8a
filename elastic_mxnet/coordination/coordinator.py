"""Coordinator: membership, parameter assignment and the four-step scaling protocol.

Single-threaded event loop on one ROUTER socket; members (PS, workers) and
control clients (:class:`~elastic_mxnet.job.ElasticJob`) connect to it. It is
never on the data path: training goes on while it is down.

A scaling operation (one at a time):

1. *Registration*: new members register (they get an id and wait as
   *standby*); a scale request waits for enough of them, asking the spawner
   for the missing ones.
2. *Plan*: the coordinator computes the new assignment (minimal movement, see
   :func:`~elastic_mxnet.protocol.assignment.rebalance`) and the *scaling clock*: one
   iteration past the furthest worker's estimated progress (last reported
   iteration + rate x time since, capped), plus the iterations that run during
   a round trip (``ceil(rate x (2 rtt + 10 ms))``). ``Prepare`` goes to every
   old and new member; each acks, or nacks if it already started the clock
   iteration, in which case the plan is aborted and retried with a later clock.
3. *Migration*: after all acks, ``Commit`` goes to the PS; each migrates at
   ``version == clock`` and reports ``Migrated``.
4. *Resume*: after every PS reported, ``Resume`` goes to all; workers paused
   at the clock switch to the new map and go on; removed members exit.

Failures (no heartbeat for ``heartbeat_timeout_s``) become recovery plans with
the clock right after the iteration in progress: dead workers are dropped (the
PS stop waiting for them at once), a dead PS's chunks go to a replacement (or
to the survivors) restored from the latest snapshot.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

from elastic_mxnet.config import JobConfig
from elastic_mxnet.coordination.clock import Progress, scaling_clock
from elastic_mxnet.coordination.records import (
    JobInfo,
    Member,
    Operation,
    Request,
    change_name,
    job_info,
    rebuilt_plan,
    recovery,
    scale_refusal,
    status_reply,
)
from elastic_mxnet.coordination.spawner import Role, Spawner
from elastic_mxnet.protocol import wire
from elastic_mxnet.protocol.assignment import best_fit, chunk_sizes_bytes, make_layout, rebalance
from elastic_mxnet.protocol.messages import (
    Abort,
    Ack,
    Commit,
    Heartbeat,
    HeartbeatAck,
    Leave,
    Migrated,
    Plan,
    Prepare,
    ProtocolError,
    Register,
    Registered,
    Rejoin,
    Resume,
    ScaleReply,
    ScaleRequest,
    ScalingEvent,
    StatusReply,
    StatusRequest,
    Stop,
    StopReply,
    StopRequest,
    Suspended,
    _Msg,
)

log = logging.getLogger("elastic_mxnet.coordination.coordinator")


class Coordinator:
    """The coordinator of one job. :meth:`serve` runs it until the job ends."""

    def __init__(self, config: JobConfig, spawner: Spawner | None = None, rejoin: bool = False) -> None:
        self.config = config
        self.spawner = spawner
        self.ctx = zmq.Context()
        self.sock, self.address = wire.bind_router(self.ctx, config.host, config.port)
        self.members: dict[int, Member] = {}
        self.departed: set[int] = set()
        self.job: JobInfo | None = None
        self.plan: Plan | None = None
        self.op: Operation | None = None
        self.request: Request | None = None
        self.failed_ps: set[int] = set()
        self.failed_workers: set[int] = set()
        self.failure_since: float | None = None
        self.events: list[ScalingEvent] = []
        self.next_member_id = 0
        self.next_plan_id = 0
        self.state = "rebuilding" if rejoin else "waiting"
        self.started = time.monotonic()
        self.finished_at: float | None = None
        self.exit_code = 0
        self._rejoins: dict[int, Rejoin] = {}
        self._owns_snapshot_dir = not config.sharding.snapshot_dir
        self.snapshot_dir = config.sharding.snapshot_dir or tempfile.mkdtemp(prefix="elastic-mxnet-")
        self._handlers: dict[type, Callable[[bytes, Any], None]] = {
            Register: self._on_register,
            Rejoin: self._on_rejoin,
            Heartbeat: self._on_heartbeat,
            Ack: self._on_ack,
            Migrated: self._on_migrated,
            Suspended: self._on_suspended,
            Leave: self._on_leave,
            ScaleRequest: self._on_scale,
            StatusRequest: self._on_status,
            StopRequest: self._on_stop,
        }

    # ---- loop ---------------------------------------------------------------

    def serve(self) -> int:
        """Run until the job has finished, was stopped or failed; return an exit code."""
        log.info("coordinator on %s (%s)", self.address, self.state)
        try:
            # inside the try: a signal during the first spawns still ends the members spawned so far
            if self.state == "waiting" and self.spawner is not None:
                for _ in range(self.config.initial_ps):
                    self.spawner.spawn("ps", self.address)
                for _ in range(self.config.initial_workers):
                    self.spawner.spawn("worker", self.address)
            while self.state != "done":
                if self.sock.poll(20):
                    self._drain()
                self._tick(time.monotonic())
        finally:
            self.close()
        return self.exit_code

    def close(self) -> None:
        if self.spawner is not None:
            self.spawner.close()
        self.sock.close(linger=1000)  # let the final Stop messages out
        self.ctx.term()
        if self._owns_snapshot_dir and self.exit_code == 0:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)

    def _drain(self) -> None:
        while self.sock.poll(0):
            try:
                ident, msg, _ = wire.recv(self.sock, routed=True)
            except wire.RoutedProtocolError as exc:
                log.warning("rejected a malformed message: %s", exc)
                wire.reply_error(self.sock, exc.ident, "bad_message", str(exc))
                continue
            handler = self._handlers.get(type(msg))
            try:
                if handler is None:
                    raise ProtocolError(f"coordinator does not accept {msg.kind!r}")
                assert ident is not None
                handler(ident, msg)
            except ProtocolError as exc:
                log.warning("refused a message: %s", exc)
                wire.reply_error(self.sock, ident, "unexpected", str(exc))

    def _tick(self, now: float) -> None:
        self._check_liveness(now)
        if self.state == "rebuilding":
            if now - self.started > self.config.liveness.rejoin_grace_s:
                self._rebuild()
            return
        if self.op is not None:
            if now - self.op.started > self.config.limits.operation_timeout_s:
                self._fail_op(self.op, "operation timed out")
        elif self.failed_ps or self.failed_workers:
            self._start_recovery(now)
        elif self.request is not None:
            self._try_request(self.request, now)
        elif self.state == "waiting":
            self._try_initial()
        self._check_finished(now)

    # ---- registration and liveness -----------------------------------------

    def _on_register(self, ident: bytes, msg: Register) -> None:
        if msg.role == "ps" and not msg.address:
            raise ProtocolError("a PS must register with its data address")
        if msg.role == "worker":
            self._check_job_info(msg)
        member = Member(self.next_member_id, msg.role, ident, msg.address, msg.pid, time.monotonic())
        self.next_member_id += 1
        self.members[member.member_id] = member
        log.info("registered %s %d (pid %d)", msg.role, member.member_id, msg.pid)
        self._send_registered(member)

    def _check_job_info(self, msg: Register | Rejoin) -> None:
        self.job = job_info(self.job, msg)

    def _send_registered(self, member: Member) -> None:
        live = self.config.liveness
        wire.send(
            self.sock,
            Registered(
                member_id=member.member_id,
                heartbeat_interval_s=live.heartbeat_interval_s,
                orphan_timeout_s=live.orphan_timeout_s,
            ),
            to=member.ident,
        )

    def _on_heartbeat(self, ident: bytes, msg: Heartbeat) -> None:
        member = self.members.get(msg.member_id)
        if member is None:
            if msg.member_id in self.departed:
                wire.send(self.sock, Stop(reason="no longer a member of this job"), to=ident)
            else:
                wire.reply_error(self.sock, ident, "unknown_member", f"member {msg.member_id} unknown")
            return
        member.ident = ident
        member.heard(msg.version, msg.rtt_ms / 1e3, time.monotonic())
        wire.send(self.sock, HeartbeatAck(), to=ident)

    def _on_leave(self, _ident: bytes, msg: Leave) -> None:
        member = self.members.get(msg.member_id)
        if member is None:
            return
        if msg.reason == "finished" and member.role == "worker":
            member.finished = True
        elif msg.reason == "error":
            self._declare_dead(member)
        else:
            self._forget(member)

    def _check_liveness(self, now: float) -> None:
        timeout = self.config.liveness.heartbeat_timeout_s
        for member in list(self.members.values()):
            if not member.finished and now - member.last_seen > timeout:
                log.warning("%s %d missed heartbeats for %.1f s", member.role, member.member_id, timeout)
                self._declare_dead(member)

    def _declare_dead(self, member: Member) -> None:
        self._forget(member)
        if member.state != "member":
            # Before the first plan every registered member is one the job was started with: one that dies
            # then (a PS that missed its heartbeats on a loaded machine) is spawned again, or the job would
            # wait for it forever. Later a standby is a spare; its loss changes nothing.
            if self.state == "waiting" and self.spawner is not None:
                log.warning("%s %d died before the job started: spawning another", member.role,
                            member.member_id)
                self.spawner.spawn("ps" if member.role == "ps" else "worker", self.address)
            return
        (self.failed_ps if member.role == "ps" else self.failed_workers).add(member.member_id)
        if member.role == "ps" and self.spawner is not None and self.state != "stopping":
            self.spawner.spawn("ps", self.address)
        op = self.op
        if op is None:
            return
        if op.phase == "prepare" and member.member_id in op.need_ack:
            self._fail_op(op, f"{member.role} {member.member_id} died during the operation")
        elif member.member_id in op.need_done:
            self._fail_op(op, f"PS {member.member_id} died while migrating")

    def _forget(self, member: Member) -> None:
        self.members.pop(member.member_id, None)
        self.departed.add(member.member_id)

    # ---- control API --------------------------------------------------------

    def _on_scale(self, ident: bytes, msg: ScaleRequest) -> None:
        reason, ps, workers = self._check_scale(msg)
        if reason:
            wire.send(self.sock, ScaleReply(ok=False, reason=reason), to=ident)
            return
        assert self.plan is not None
        if ps == len(self.plan.ps) and workers == len(self.plan.workers):
            wire.send(self.sock, ScaleReply(ok=True, reason="no change", plan_id=self.plan.plan_id), to=ident)
            return
        change = change_name(len(self.plan.ps), ps, len(self.plan.workers), workers)
        deadline = time.monotonic() + self.config.limits.register_timeout_s
        self.request = Request(change, ps, workers, deadline, ident, msg.at_iteration)
        self._spawn_missing(ps - len(self.plan.ps), workers - len(self.plan.workers))

    def _check_scale(self, msg: ScaleRequest) -> tuple[str, int, int]:
        # the furthest iteration known to have started: by a worker, or aggregated by a PS
        ps_done = [m.version - 1 for m in self.members.values() if m.role == "ps" and m.state == "member"]
        started = max([m.version for m in self._workers()] + ps_done, default=-1)
        return scale_refusal(
            msg,
            self.state,
            self.plan,
            self._operation(),
            bool(self.failed_ps or self.failed_workers),
            self.config.limits,
            started,
        )

    def _operation(self) -> str | None:
        """The change in progress or waiting for its new members, if any."""
        return self.op.change if self.op else (self.request.change if self.request else None)

    def _spawn_missing(self, more_ps: int, more_workers: int) -> None:
        if self.spawner is None:
            return
        wanted: list[tuple[Role, int]] = [("ps", more_ps), ("worker", more_workers)]
        for role, more in wanted:
            for _ in range(max(0, more - len(self._standby(role)))):
                self.spawner.spawn(role, self.address)

    def _on_stop(self, ident: bytes, msg: StopRequest) -> None:
        if self.state != "running" or self.plan is None:
            wire.send(self.sock, StopReply(ok=False, reason=f"job is {self.state}"), to=ident)
            return
        if self.op is not None or self.request is not None:
            busy = StopReply(ok=False, reason="busy: a scaling operation is in progress")
            wire.send(self.sock, busy, to=ident)
            return
        self.request = Request("stop", len(self.plan.ps), len(self.plan.workers), math.inf, ident,
                               msg.at_iteration, stop=True)

    def _on_status(self, ident: bytes, _msg: StatusRequest) -> None:
        wire.send(self.sock, self.status(), to=ident)

    def status(self) -> StatusReply:
        """Members, progress and the history of scaling events (:func:`status_reply`)."""
        return status_reply(self.state, self.members, self.plan, self.job, self.events, self._operation())

    # ---- planning -----------------------------------------------------------

    def _standby(self, role: str) -> list[int]:
        return sorted(m.member_id for m in self.members.values() if m.role == role and m.state == "standby")

    def _workers(self) -> list[Member]:
        ids = self.plan.workers if self.plan else []
        return [self.members[w] for w in ids if w in self.members and not self.members[w].finished]

    def _progress(self) -> list[Progress]:
        now = time.monotonic()
        return [Progress(m.version, now - m.version_at, m.rate, m.rtt_s) for m in self._workers()]

    def _clock(self, floor: int = -1, margin: bool = True) -> int:
        """The scaling clock for a plan prepared now (see :func:`scaling_clock`)."""
        assert self.plan is not None
        ps_versions = [self.members[p].version for p in self.plan.ps if p in self.members]
        extrapolate = 2 * self.config.liveness.heartbeat_interval_s
        return scaling_clock(self._progress(), ps_versions, extrapolate, floor, margin)

    def _plan(self, ps: list[int], workers: list[int], owners: list[int], clock: int, **extra) -> Plan:
        assert self.job is not None
        sharding = self.config.sharding
        layout = self.plan.layout if self.plan else make_layout(self.job.shapes, sharding.chunk_elems)
        pid, self.next_plan_id = self.next_plan_id, self.next_plan_id + 1
        return Plan(plan_id=pid, clock=clock, layout=layout, owners=owners,
                    ps={p: self.members[p].address for p in sorted(ps)}, workers=sorted(workers),
                    optimizer=self.job.optimizer, global_batch=self.job.global_batch,
                    snapshot_dir=self.snapshot_dir, snapshot_every=sharding.snapshot_every, **extra)

    def _try_initial(self) -> None:
        cfg = self.config
        ps, workers = self._standby("ps"), self._standby("worker")
        if self.job is None or len(ps) < cfg.initial_ps or len(workers) < cfg.initial_workers:
            return
        ps, workers = ps[: cfg.initial_ps], workers[: cfg.initial_workers]
        layout = make_layout(self.job.shapes, cfg.sharding.chunk_elems)
        owners = best_fit(chunk_sizes_bytes(layout), ps)
        plan = self._plan(ps, workers, owners, 0, init_from=workers[0])
        self.state = "starting"
        self._start_op("start", plan, None, pinned=True)

    def _try_request(self, req: Request, now: float) -> None:
        assert self.plan is not None
        cur_ps, cur_w = sorted(self.plan.ps), list(self.plan.workers)
        add_ps, add_w = (
            self._standby("ps")[: req.ps - len(cur_ps)],
            self._standby("worker")[: req.workers - len(cur_w)],
        )
        if len(cur_ps) + len(add_ps) < req.ps or len(cur_w) + len(add_w) < req.workers:
            if now > req.deadline:
                self.request = None
                self._reply(
                    req.client,
                    ok=False,
                    reason="timed out waiting for new members to register",
                    stop=req.stop,
                )
            return
        ps = (cur_ps + add_ps)[: req.ps]
        workers = (cur_w + add_w)[: req.workers]
        owners = rebalance(chunk_sizes_bytes(self.plan.layout), self.plan.owners, ps)
        clock = req.at_iteration if req.at_iteration is not None else self._clock()
        plan = self._plan(ps, workers, owners, clock, stop=req.stop)
        self.request = None
        self._start_op(req.change, plan, req.client, pinned=req.at_iteration is not None)

    def _start_recovery(self, now: float) -> None:
        assert self.plan is not None
        dead_ps = self.failed_ps
        spares = self._standby("ps")[: len(dead_ps)]
        if self.failure_since is None:
            self.failure_since = now
        waited = now - self.failure_since
        if dead_ps and self.spawner is not None and len(spares) < len(dead_ps) and waited < 30.0:
            return  # give the replacement PS up to 30 s to register
        rec = recovery(self.plan, self.failed_ps, self.failed_workers, spares)
        if rec is None:
            self._fail_job("no PS or no worker left after a failure")
            return
        plan = self._plan(rec.ps, rec.workers, rec.owners, self._clock(margin=False), dead_ps=sorted(dead_ps),
                          dead_workers=sorted(self.failed_workers), restore=rec.restore)
        self.failed_ps, self.failed_workers, self.failure_since = set(), set(), None
        self._start_op(rec.change, plan, None, pinned=False)

    # ---- the operation ------------------------------------------------------

    def _start_op(self, change: str, plan: Plan, client: bytes | None, pinned: bool) -> None:
        old = set(self.plan.ps) | set(self.plan.workers) if self.plan else set()
        new = set(plan.ps) | set(plan.workers)
        alive = {m for m in old | new if m in self.members and not self.members[m].finished}
        old_ps = set(self.plan.ps) if self.plan else set()
        need_done = (old_ps | set(plan.ps)) & alive
        self.op = Operation(change, plan, alive, need_done, client, pinned, time.monotonic())
        log.info("plan %d (%s): clock %d, ps %s, workers %s", plan.plan_id, change, plan.clock,
                 sorted(plan.ps), plan.workers)
        self._broadcast(self.op.need_ack, Prepare(plan=plan))

    def _on_ack(self, _ident: bytes, msg: Ack) -> None:
        op = self.op
        if op is None or op.phase != "prepare" or msg.plan_id != op.plan.plan_id:
            return  # a late answer to an aborted attempt
        if not msg.ok:
            self._retry(op, msg.version, msg.reason)
            return
        op.acked.add(msg.member_id)
        if op.acked >= op.need_ack:
            op.phase = "commit"
            targets = set(op.need_done)
            if op.plan.init_from is not None:
                targets.add(op.plan.init_from)
            self._broadcast(targets, Commit(plan_id=op.plan.plan_id))
            if not op.need_done:
                self._finish_op(op)

    def _retry(self, op: Operation, version: int, reason: str) -> None:
        self._broadcast(op.need_ack, Abort(plan_id=op.plan.plan_id, reason=reason))
        if op.pinned or op.attempts >= self.config.limits.prepare_attempts:
            self._fail_op(op, f"scaling clock {op.plan.clock} missed: {reason}", aborted=True)
            return
        plan = op.plan.model_copy(update={"plan_id": self.next_plan_id, "clock": self._clock(floor=version)})
        self.next_plan_id += 1
        op.plan, op.acked, op.attempts = plan, set(), op.attempts + 1
        log.info("plan retried as %d with clock %d (%s)", plan.plan_id, plan.clock, reason)
        self._broadcast(op.need_ack, Prepare(plan=plan))

    def _on_migrated(self, _ident: bytes, msg: Migrated) -> None:
        op = self.op
        if op is None or op.phase != "commit" or msg.plan_id != op.plan.plan_id:
            return
        op.done.add(msg.member_id)
        op.lost = max(op.lost, msg.lost_iterations)
        if op.done >= op.need_done:
            self._finish_op(op)

    def _finish_op(self, op: Operation) -> None:
        plan = op.plan
        self._broadcast(op.need_ack, Resume(plan_id=plan.plan_id))
        self.plan = plan
        in_plan = set(plan.ps) | set(plan.workers)
        for mid in list(self.members):
            member = self.members[mid]
            if mid in in_plan:
                member.state = "member"
            elif member.state == "member":
                self._forget(member)
        duration = (time.monotonic() - op.started) * 1e3
        self.events.append(ScalingEvent(plan_id=plan.plan_id, change=op.change, clock=plan.clock,
                                        duration_ms=duration, lost_iterations=op.lost))
        self.op = None
        self._reply(op.client, ok=True, plan_id=plan.plan_id, clock=plan.clock, stop=plan.stop)
        if self.state == "starting":
            self.state = "running"
        if plan.stop:
            self.state = "stopping"
            self.finished_at = time.monotonic()
            self._broadcast(set(plan.ps), Stop(reason="job stopped"))
        log.info("plan %d done in %.1f ms", plan.plan_id, duration)

    def _fail_op(self, op: Operation, reason: str, aborted: bool = False) -> None:
        log.error("operation '%s' failed: %s", op.change, reason)
        self.op = None
        if op.phase == "prepare" and not aborted:
            self._broadcast(op.need_ack, Abort(plan_id=op.plan.plan_id, reason=reason))
        self._reply(op.client, ok=False, reason=reason, stop=op.plan.stop)
        if op.phase != "prepare" or self.state == "starting":
            self._fail_job(f"cannot recover from: {reason}")

    def _on_suspended(self, _ident: bytes, msg: Suspended) -> None:
        for event in reversed(self.events):
            if event.plan_id == msg.plan_id:
                event.suspension_ms[msg.member_id] = msg.suspension_ms
                if event.resumed_at is None:
                    event.resumed_at = time.time()
                return

    # ---- ending -------------------------------------------------------------

    def _check_finished(self, now: float) -> None:
        if self.state == "running" and self.plan is not None:
            ids = self.plan.workers
            # A plan without workers is a paused job (``Limits.min_workers = 0``): the PS
            # keep parameters and optimizer state until a scale request adds workers.
            if ids and all(w not in self.members or self.members[w].finished for w in ids):
                log.info("all workers finished")
                self._shutdown()
        elif self.state == "stopping":
            ids = self.plan.workers if self.plan else []
            left = all(w not in self.members or self.members[w].finished for w in ids)
            if left or now - (self.finished_at or now) > 10.0:
                self._shutdown()

    def _shutdown(self) -> None:
        # a client still waiting on a request or an operation gets its answer, not a timeout
        for pending in (self.request, self.op):
            if pending is not None and pending.client is not None:
                stop = pending.stop if isinstance(pending, Request) else pending.plan.stop
                self._reply(pending.client, ok=False, reason="job ended", stop=stop)
        self.request, self.op = None, None
        self._broadcast(set(self.members), Stop(reason="job finished"))
        self.state = "done"

    def _fail_job(self, reason: str) -> None:
        log.error("job failed: %s", reason)
        self.exit_code = 1
        self._shutdown()

    # ---- restart ------------------------------------------------------------

    def _on_rejoin(self, ident: bytes, msg: Rejoin) -> None:
        if self.state != "rebuilding":
            raise ProtocolError("rejoin outside a coordinator restart")
        if msg.role == "worker":
            self._check_job_info(msg)
        member = Member(
            msg.member_id,
            msg.role,
            ident,
            msg.address,
            msg.pid,
            time.monotonic(),
            version=msg.version,
            version_at=time.monotonic(),
        )
        self.members[msg.member_id] = member
        self._rejoins[msg.member_id] = msg
        self._send_registered(member)

    def _rebuild(self) -> None:
        """Membership and assignment from the members' re-registrations (after the grace period)."""
        base = rebuilt_plan(self._rejoins)
        self.next_member_id = max(self._rejoins, default=-1) + 1
        if base is None:
            log.info("nobody rejoined with a plan: starting fresh")
            self.state = "waiting"
            return
        self.plan = base
        self.snapshot_dir, self._owns_snapshot_dir = base.snapshot_dir, False
        if self.job is None:
            self.job = JobInfo([], base.optimizer, base.global_batch, base.global_batch)
        self.next_plan_id = base.plan_id + 1
        for mid, member in self.members.items():
            member.state = "member" if mid in set(base.ps) | set(base.workers) else "standby"
        self.failed_ps = {p for p in base.ps if p not in self.members}
        self.failed_workers = {w for w in base.workers if w not in self.members}
        self.state = "running"
        log.info("rebuilt plan %d from %d members", base.plan_id, len(self._rejoins))

    # ---- helpers ------------------------------------------------------------

    def _broadcast(self, ids: set[int], msg: _Msg) -> None:
        for mid in sorted(ids):
            if mid in self.members:
                wire.send(self.sock, msg, to=self.members[mid].ident)

    def _reply(self, client: bytes | None, ok: bool, reason: str = "", plan_id: int | None = None,
               clock: int | None = None, stop: bool = False) -> None:
        """Answer a control client (None: an internal change, no one to answer): a stop request's reply, or
        a scale request's."""
        if client is None:
            return
        if stop:
            wire.send(self.sock, StopReply(ok=ok, reason=reason), to=client)
        else:
            wire.send(self.sock, ScaleReply(ok=ok, reason=reason, plan_id=plan_id, clock=clock), to=client)
