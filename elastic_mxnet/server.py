"""Parameter server: holds chunks, aggregates worker gradients, updates, migrates.

One single-threaded event loop over three kinds of sockets: its data ROUTER
(pushes, pulls, initial values and migrated chunks arrive here), its control
link to the coordinator, and DEALERs to other PS (to migrate chunks out).

Synchronous SGD: iteration ``t`` is aggregated once every worker expected at
``t`` has pushed; then each owned chunk gets ``grad = sum_w grad_w / sum_w
samples_w`` (summed in worker-id order, so the result does not depend on
arrival order), one optimizer step, and every waiting worker gets the new
values. ``version`` counts applied updates: after iteration ``t`` it is ``t+1``.

Scaling: on ``Prepare`` the PS acknowledges (unless it already started the
clock iteration); on ``Commit`` it waits until ``version == clock``, sends the
chunks it gives up (values + optimizer state) to their new owners, receives or
restores the chunks it gains, switches to the new plan and reports
``Migrated``. A PS left out of the new plan exits on ``Resume``.

Run as ``python -m elastic_mxnet.server --coordinator tcp://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import zmq

from elastic_mxnet import optim, snapshot
from elastic_mxnet.protocol import wire
from elastic_mxnet.protocol.assignment import owned_by
from elastic_mxnet.protocol.link import MemberLink, Orphaned
from elastic_mxnet.protocol.messages import (
    Abort,
    Ack,
    Commit,
    Done,
    Init,
    Leave,
    Migrate,
    Migrated,
    Params,
    Plan,
    Prepare,
    ProtocolError,
    Pull,
    Push,
    Register,
    Rejoin,
    Resume,
    Stop,
    _Msg,
)

log = logging.getLogger("elastic_mxnet.server")


@dataclass
class _Aggregation:
    """Pushes received for the iteration equal to the PS version."""

    grads: dict[int, tuple[int, list[np.ndarray]]] = field(default_factory=dict)
    waiting: list[bytes] = field(default_factory=list)


@dataclass
class _Migration:
    """Progress of the committed plan's chunk movement on this PS."""

    outgoing: set[int]
    incoming: set[int]
    lost_iterations: int = 0


class ParameterServer:
    """One PS process; :meth:`run` until stopped, removed or orphaned."""

    def __init__(self, coordinator: str, host: str = "127.0.0.1") -> None:
        self.ctx = zmq.Context()
        self.data, self.address = wire.bind_router(self.ctx, host)
        reg = Register(role="ps", address=self.address, pid=os.getpid())
        self.link = MemberLink(self.ctx, coordinator, reg, self._rejoin_msg)
        self.plan: Plan | None = None
        self.pending: Plan | None = None
        self.committed = False
        self.version = 0
        self.chunks: dict[int, optim.ChunkState] = {}
        self.early: dict[int, optim.ChunkState] = {}
        self.expected: set[int] = set()
        self.agg = _Aggregation()
        self.pulls: list[tuple[bytes, Pull]] = []
        self.migration: _Migration | None = None
        self.peers: dict[str, zmq.Socket] = {}
        self.snapshots = snapshot.Snapshotter()
        self.running = True
        self.poller = zmq.Poller()
        self.poller.register(self.data, zmq.POLLIN)
        self.poller.register(self.link.sock, zmq.POLLIN)

    @property
    def member_id(self) -> int:
        assert self.link.member_id is not None
        return self.link.member_id

    # ---- loop ---------------------------------------------------------------

    def run(self, register_timeout_s: float = 60.0) -> int:
        """Register, then serve until told to stop. Returns the process exit code."""
        self.link.register(register_timeout_s)
        log.info("PS %d serving on %s", self.member_id, self.address)
        try:
            while self.running:
                ready = dict(self.poller.poll(20))
                if self.data in ready:
                    self._drain(self.data, routed=True, handler=self._on_data)
                if self.link.sock in ready:
                    self._drain(self.link.sock, routed=False, handler=self._on_control)
                for sock in list(self.peers.values()):
                    if sock in ready:
                        self._drain(sock, routed=False, handler=self._on_peer)
                self.link.tick(self.version)
        except Orphaned as exc:
            log.error("PS %d exiting: %s", self.member_id, exc)
            return 3
        finally:
            self.close()
        return 0

    def close(self) -> None:
        self.snapshots.close()
        for sock in self.peers.values():
            sock.close(linger=0)
        self.link.close(linger_ms=1000)
        # Replies still queued (a removed PS answers its last iteration's pushes
        # just before it exits) must reach the workers: linger, do not drop.
        self.data.close(linger=10_000)
        self.ctx.term()

    def _drain(self, sock: zmq.Socket, routed: bool, handler) -> None:
        while self.running and sock.poll(0):
            try:
                ident, msg, arrays = wire.recv(sock, routed=routed)
                handler(ident, msg, arrays)
            except wire.RoutedProtocolError as exc:
                log.warning("PS rejected a message: %s", exc)
                if routed:
                    wire.reply_error(sock, exc.ident, "bad_message", str(exc))
            except ProtocolError as exc:
                log.warning("PS refused a message: %s", exc)
                if routed:
                    wire.reply_error(sock, ident, "unexpected", str(exc))

    # ---- data plane ---------------------------------------------------------

    def _on_data(self, ident: bytes | None, msg: _Msg, arrays: list[np.ndarray]) -> None:
        assert ident is not None
        if isinstance(msg, Push):
            self._on_push(ident, msg, arrays)
        elif isinstance(msg, Pull):
            self._check_owned(msg.chunks, exact=False)
            self.pulls.append((ident, msg))
            self._serve_pulls()
        elif isinstance(msg, Init | Migrate):
            self._on_incoming(ident, msg, arrays)
        else:
            raise ProtocolError(f"PS does not accept {msg.kind!r} on its data port")

    def _check_owned(self, chunks: list[int], exact: bool = True) -> None:
        if self.plan is None:
            raise ProtocolError("PS has no plan yet")
        mine = owned_by(self.plan.owners, self.member_id)
        if (chunks != mine) if exact else not set(chunks) <= set(mine):
            raise ProtocolError(f"chunks {chunks} are not this PS's chunks {mine}")

    def _on_push(self, ident: bytes, msg: Push, arrays: list[np.ndarray]) -> None:
        self._check_owned(msg.chunks)
        assert self.plan is not None
        if msg.iteration != self.version:
            raise ProtocolError(f"push for iteration {msg.iteration}, PS is at {self.version}")
        if msg.worker not in self.expected:
            raise ProtocolError(f"worker {msg.worker} is not expected at iteration {msg.iteration}")
        if self.migration is not None:
            raise ProtocolError("push during a migration")
        sizes = [self.plan.layout[c].size for c in msg.chunks]
        if [a.size for a in arrays] != sizes or any(a.dtype != np.float32 for a in arrays):
            raise ProtocolError("push arrays do not match the chunk sizes or are not float32")
        self.agg.grads[msg.worker] = (msg.samples, arrays)
        self.agg.waiting.append(ident)
        self._maybe_update()

    def _maybe_update(self) -> None:
        if self.plan is None or not self.agg.waiting or not set(self.agg.grads) >= self.expected:
            return
        order = sorted(self.agg.grads)
        total = max(sum(self.agg.grads[w][0] for w in order), 1)
        mine = owned_by(self.plan.owners, self.member_id)
        for i, cid in enumerate(mine):
            g = self.agg.grads[order[0]][1][i].astype(np.float32, copy=True)
            for w in order[1:]:
                g += self.agg.grads[w][1][i]
            g /= np.float32(total)
            optim.update(self.plan.optimizer, self.chunks[cid], g)
        self.version += 1
        values = [self.chunks[c].values for c in mine]
        reply = Params(version=self.version, chunks=mine)
        for ident in self.agg.waiting:
            wire.send(self.data, reply, values, to=ident)
        self.agg = _Aggregation()
        if self.version % self.plan.snapshot_every == 0:
            self.snapshots.submit(self.plan.snapshot_dir, self.chunks, self.version)
        self._maybe_migrate()
        self._serve_pulls()

    def _serve_pulls(self) -> None:
        if self.migration is not None or self.plan is None:
            return
        keep = []
        for ident, pull in self.pulls:
            if self.version >= pull.version:
                values = [self.chunks[c].values for c in pull.chunks]
                wire.send(
                    self.data, Params(version=self.version, chunks=pull.chunks), values, to=ident
                )
            else:
                keep.append((ident, pull))
        self.pulls = keep

    # ---- migration ----------------------------------------------------------

    def _on_incoming(self, ident: bytes, msg: Init | Migrate, arrays: list[np.ndarray]) -> None:
        plan = self.pending
        if plan is None or plan.plan_id != msg.plan_id:
            raise ProtocolError(f"{msg.kind} for plan {msg.plan_id}, not the prepared plan")
        if any(plan.owners[c] != self.member_id for c in msg.chunks):
            raise ProtocolError(f"{msg.kind} of chunks this PS will not own")
        names = optim.state_names(plan.optimizer)
        per = 1 if isinstance(msg, Init) else 1 + len(names)
        if isinstance(msg, Migrate) and (
            msg.state_names != names or len(msg.steps) != len(msg.chunks)
        ):
            raise ProtocolError("migrated optimizer state does not match this job's optimizer")
        if len(arrays) != per * len(msg.chunks):
            raise ProtocolError(
                f"{msg.kind} carries {len(arrays)} arrays for {len(msg.chunks)} chunks"
            )
        for i, cid in enumerate(msg.chunks):
            if arrays[per * i].size != plan.layout[cid].size:
                raise ProtocolError(f"chunk {cid} has the wrong size")
            chunk = optim.new_chunk(plan.optimizer, arrays[per * i])
            if isinstance(msg, Migrate):
                chunk.steps = msg.steps[i]
                for k, name in enumerate(names):
                    chunk.state[name] = np.array(arrays[per * i + 1 + k], dtype=np.float32)
            self.early[cid] = chunk
        wire.send(self.data, Done(plan_id=msg.plan_id, chunks=msg.chunks), to=ident)
        self._progress_migration()

    def _maybe_migrate(self) -> None:
        plan = self.pending
        if plan is None or not self.committed or self.migration is not None or self.agg.waiting:
            return
        if self.plan is not None and self.version != plan.clock:
            return
        me = self.member_id
        self.version = plan.clock
        outgoing: dict[int, list[int]] = defaultdict(list)
        for cid in sorted(self.chunks):
            if plan.owners[cid] != me:
                outgoing[plan.owners[cid]].append(cid)
        incoming = {c for c in owned_by(plan.owners, me) if c not in self.chunks}
        self.migration = _Migration({c for cs in outgoing.values() for c in cs}, incoming)
        for c in sorted(incoming & set(plan.restore)):
            restored = snapshot.read_chunk(plan.snapshot_dir, c)
            self.early[c] = restored.chunk
            lost = plan.clock - restored.version
            self.migration.lost_iterations = max(self.migration.lost_iterations, lost)
        names = optim.state_names(plan.optimizer)
        for owner, cids in outgoing.items():
            arrays = []
            for c in cids:
                arrays += [self.chunks[c].values, *(self.chunks[c].state[n] for n in names)]
            msg = Migrate(
                plan_id=plan.plan_id,
                chunks=cids,
                steps=[self.chunks[c].steps for c in cids],
                state_names=names,
            )
            wire.send(self._peer(plan.ps[owner]), msg, arrays)
        self._progress_migration()

    def _peer(self, address: str) -> zmq.Socket:
        if address not in self.peers:
            self.peers[address] = wire.new_dealer(self.ctx, address)
            self.poller.register(self.peers[address], zmq.POLLIN)
        return self.peers[address]

    def _on_peer(self, _ident: bytes | None, msg: _Msg, _arrays: list[np.ndarray]) -> None:
        if not isinstance(msg, Done) or self.migration is None:
            log.warning("PS %d: unexpected %s from a peer", self.member_id, msg.kind)
            return
        if self.pending is None or msg.plan_id != self.pending.plan_id:
            return
        for cid in msg.chunks:
            if cid in self.migration.outgoing:
                self.migration.outgoing.discard(cid)
                del self.chunks[cid]
        self._progress_migration()

    def _progress_migration(self) -> None:
        mig, plan = self.migration, self.pending
        if mig is None or plan is None or mig.outgoing:
            return
        if not mig.incoming <= set(self.early):
            return
        for cid in mig.incoming:
            self.chunks[cid] = self.early.pop(cid)
        self.early.clear()
        self.plan, self.pending, self.committed, self.migration = plan, None, False, None
        self.expected = set(plan.workers)
        if mig.incoming:
            self.snapshots.submit(plan.snapshot_dir, self.chunks, self.version)
        self.link.send(
            Migrated(
                member_id=self.member_id, plan_id=plan.plan_id, lost_iterations=mig.lost_iterations
            )
        )
        self._serve_pulls()

    # ---- control ------------------------------------------------------------

    def _on_control(self, _ident: bytes | None, msg: _Msg, _arrays: list[np.ndarray]) -> None:
        todo = self.link.handle(msg)
        if todo is not None:
            self._dispatch_control(todo)

    def _dispatch_control(self, msg: _Msg) -> None:
        if isinstance(msg, Prepare):
            self._on_prepare(msg.plan)
        elif isinstance(msg, Commit):
            if self.pending is not None and self.pending.plan_id == msg.plan_id:
                self.committed = True
                self._maybe_migrate()
        elif isinstance(msg, Abort):
            if (
                self.pending is not None
                and self.pending.plan_id == msg.plan_id
                and self.migration is None
            ):
                self.pending, self.committed = None, False
                self.early.clear()
        elif isinstance(msg, Resume):
            if self.plan is not None and self.member_id not in self.plan.ps:
                log.info("PS %d removed by plan %d: exiting", self.member_id, self.plan.plan_id)
                self.link.send(Leave(member_id=self.member_id, reason="removed"))
                self.running = False
        elif isinstance(msg, Stop):
            log.info("PS %d stopping: %s", self.member_id, msg.reason)
            self.running = False
        else:
            log.warning("PS %d: unexpected %s from the coordinator", self.member_id, msg.kind)

    def _on_prepare(self, plan: Plan) -> None:
        late = plan.clock < self.version or (plan.clock == self.version and bool(self.agg.waiting))
        busy = self.migration is not None
        ok = not late and not busy
        if ok:
            self.pending, self.committed = plan, False
            self.early.clear()
            # A dead worker never pushes again: stop waiting for it now, so the
            # iteration in progress completes with the others' gradients.
            self.expected -= set(plan.dead_workers)
        reason = "past the clock" if late else ("migrating" if busy else "")
        self.link.send(
            Ack(
                member_id=self.member_id,
                plan_id=plan.plan_id,
                ok=ok,
                version=self.version,
                reason=reason,
            )
        )
        if ok:
            self._maybe_update()

    def _rejoin_msg(self, member_id: int) -> Rejoin:
        return Rejoin(
            role="ps",
            member_id=member_id,
            address=self.address,
            pid=os.getpid(),
            version=self.version,
            plan=self.plan,
            owned=sorted(self.chunks),
        )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of a PS process."""
    parser = argparse.ArgumentParser(
        prog="python -m elastic_mxnet.server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--coordinator", default=os.environ.get("ELASTIC_MXNET_COORDINATOR"))
    parser.add_argument("--host", default="127.0.0.1", help="address to bind the data port on")
    parser.add_argument("--register-timeout", type=float, default=60.0, help="seconds")
    args = parser.parse_args(argv)
    if not args.coordinator:
        parser.error("--coordinator (or ELASTIC_MXNET_COORDINATOR) is required")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    server = ParameterServer(args.coordinator, args.host)
    started = time.monotonic()
    try:
        return server.run(args.register_timeout)
    except TimeoutError as exc:
        print(f"error: {exc} (after {time.monotonic() - started:.0f} s)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
