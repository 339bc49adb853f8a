"""ElasticTrainer: a drop-in for ``gluon.Trainer`` whose job can gain and lose PS and workers.

Usage (any ``gluon.Block`` with initialised, float32 parameters)::

    trainer = ElasticTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                             global_batch_size=64, num_samples=len(X))
    while trainer.running(max_iterations=1000):
        idx = trainer.batch_indices()          # this worker's share of the global batch
        with autograd.record():
            loss = loss_fn(net(X[idx]), Y[idx])
        loss.backward()
        trainer.step(len(idx))
    trainer.close()

``running()`` is where scaling happens: at a plan's scaling clock it pauses
until the PS have migrated, switches to the new parameter map, rank and
worker count, and returns ``False`` once this worker is removed, the job is
stopped, or ``max_iterations`` is reached. ``step(batch_size)`` pushes this
worker's gradients (the sum over its ``batch_size`` samples, as
``loss.backward()`` on a per-sample loss gives) to every PS and pulls the
updated values; the PS divide by the global number of samples.

Parameters are matched by order (``collect_params()`` order), never by Gluon's
auto-generated names; parameters with ``grad_req='null'`` are not synchronised.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Literal

import numpy as np
import zmq

from elastic_mxnet._mx import mx
from elastic_mxnet.optim import spec_from_gluon
from elastic_mxnet.protocol import wire
from elastic_mxnet.protocol.assignment import owned_by
from elastic_mxnet.protocol.link import MemberLink, Orphaned
from elastic_mxnet.protocol.messages import (
    Abort,
    Ack,
    Commit,
    Done,
    Error,
    Init,
    Leave,
    Params,
    Plan,
    Prepare,
    Pull,
    Push,
    Register,
    Rejoin,
    Resume,
    Stop,
    Suspended,
    _Msg,
)
from elastic_mxnet.training.sharder import DataSharder

log = logging.getLogger(__name__)


class JobStopped(RuntimeError):
    """The coordinator stopped the job or this worker lost its coordinator."""


class _Control(threading.Thread):
    """Background owner of the worker's control link; shares plan state under ``cond``.

    ``started`` is the last iteration the training thread began. A Prepare is
    acknowledged only if its clock is ahead of ``started``; from then on the
    training thread pauses when it reaches the clock (see ``begin``).
    ``pending`` is a queue: a plan can be resumed (all PS migrated) before
    the training thread reaches its clock, and the next plan prepared
    meanwhile; each is applied in turn at its own clock.
    """

    def __init__(self, link: MemberLink) -> None:
        super().__init__(name="elastic-control", daemon=True)
        self.link = link
        self.cond = threading.Condition()
        self.started = -1
        self.pending: list[Plan] = []
        self.committed: int | None = None
        self.resumed: set[int] = set()
        self.dead_ps: set[int] = set()
        self.stop_reason: str | None = None
        self.outbox: deque[_Msg] = deque()
        self._closing = False

    def run(self) -> None:
        try:
            while not self._closing:
                if self.link.sock.poll(10):
                    while self.link.sock.poll(0):
                        self._receive()
                self._flush()
                self.link.tick(self.started)
            self._flush()  # a last Leave or Suspended
        except Orphaned as exc:
            self._set_stop(str(exc))
        except zmq.ZMQError as exc:
            if not self._closing:
                self._set_stop(f"control link failed: {exc}")

    def _flush(self) -> None:
        while self.outbox:
            self.link.send(self.outbox.popleft())

    def _receive(self) -> None:
        try:
            _, msg, _ = wire.recv(self.link.sock)
        except wire.RoutedProtocolError as exc:
            log.warning("bad message from coordinator: %s", exc)
            return
        self._dispatch(self.link.handle(msg))

    def _dispatch(self, msg: _Msg | None) -> None:
        if isinstance(msg, Prepare):
            self._on_prepare(msg.plan)
        elif isinstance(msg, Commit | Abort | Resume):
            with self.cond:
                if isinstance(msg, Commit):
                    self.committed = msg.plan_id
                elif isinstance(msg, Resume):
                    self.resumed.add(msg.plan_id)
                else:
                    self.pending = [p for p in self.pending if p.plan_id != msg.plan_id]
                self.cond.notify_all()
        elif isinstance(msg, Stop):
            self._set_stop(msg.reason)
        elif msg is not None:
            log.warning("worker: unexpected %s from the coordinator", msg.kind)

    def _on_prepare(self, plan: Plan) -> None:
        assert self.link.member_id is not None
        with self.cond:
            ok = plan.clock > max([self.started, *(p.clock for p in self.pending)])
            if ok:
                self.pending.append(plan)
                self.dead_ps |= set(plan.dead_ps)
                self.cond.notify_all()
            version = self.started
        reason = "" if ok else f"already started iteration {version}"
        self.link.send(
            Ack(
                member_id=self.link.member_id,
                plan_id=plan.plan_id,
                ok=ok,
                version=version,
                reason=reason,
            )
        )

    def _set_stop(self, reason: str) -> None:
        with self.cond:
            self.stop_reason = reason
            self.cond.notify_all()

    # ---- called by the training thread --------------------------------------

    def begin(self, iteration: int) -> Plan | None:
        """Start ``iteration`` unless a plan's clock is there: then return that plan (pause)."""
        with self.cond:
            if self.pending and self.pending[0].clock == iteration:
                return self.pending[0]
            self.started = iteration
            return None

    def wait(self, predicate, what: str) -> None:
        """Block until ``predicate()`` (evaluated under the lock) or the job stops."""
        with self.cond:
            while not predicate():
                if self.stop_reason is not None:
                    raise JobStopped(self.stop_reason)
                self.cond.wait(1.0)

    def close(self) -> None:
        self._closing = True
        self.join(timeout=5)


class ElasticTrainer:
    """Gluon-style trainer backed by the elastic PS; see the module docstring."""

    def __init__(
        self,
        params,
        optimizer: str = "sgd",
        optimizer_params: dict[str, float] | None = None,
        *,
        global_batch_size: int,
        num_samples: int,
        data_seed: int = 0,
        coordinator: str | None = None,
        register_timeout_s: float = 120.0,
    ) -> None:
        self._params = _trainable(params)
        self.shapes = [tuple(int(d) for d in p.shape) for p in self._params]
        self.sharder = DataSharder(num_samples, global_batch_size, data_seed)
        self._spec = spec_from_gluon(optimizer, optimizer_params)
        address = coordinator or os.environ.get("ELASTIC_MXNET_COORDINATOR")
        if not address:
            raise ValueError("no coordinator: pass coordinator= or set ELASTIC_MXNET_COORDINATOR")
        self._ctx = zmq.Context()
        reg = Register(
            role="worker",
            pid=os.getpid(),
            shapes=self.shapes,
            optimizer=self._spec,
            global_batch=global_batch_size,
            num_samples=num_samples,
        )
        link = MemberLink(self._ctx, address, reg, self._rejoin_msg)
        link.register(register_timeout_s)
        self.member_id: int = link.member_id  # type: ignore[assignment]
        self._control = _Control(link)
        self._control.start()
        self._flat = [np.empty(int(np.prod(s)), np.float32) for s in self.shapes]
        self._ps: dict[int, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self.plan: Plan | None = None
        self.iteration = -1
        self.rank = -1
        self.num_workers = 0
        self.active = True
        self.last_suspension_ms: float | None = None

    # ---- the training loop --------------------------------------------------

    def running(self, max_iterations: int | None = None) -> bool:
        """Start the next iteration (pausing at a scaling clock); False when training must end."""
        if not self.active:
            return False
        while self.plan is None:  # joining: the first plan that is not aborted
            self._control.wait(lambda: bool(self._control.pending), "first plan")
            with self._control.cond:
                first = self._control.pending[0]
            self.iteration = first.clock
            self._pause(first)
            if not self.active:
                return False
        if max_iterations is not None and self.iteration >= max_iterations:
            return False
        while (plan := self._control.begin(self.iteration)) is not None:
            self._pause(plan)
            if not self.active:
                return False
        return True

    def batch_indices(self) -> np.ndarray:
        """Sample indices of this worker at the current iteration (int64)."""
        return self.sharder.indices(self.iteration, self.rank, self.num_workers)

    def step(self, batch_size: int) -> None:
        """Push gradients summed over ``batch_size`` local samples; pull the updated parameters."""
        if self.plan is None or not self.active:
            raise RuntimeError("step() outside running(): the trainer has not joined or has ended")
        grads = [_grad(p) for p in self._params]
        plan = self.plan
        for ps_id in plan.ps:
            cids = owned_by(plan.owners, ps_id)
            arrays = [
                grads[plan.layout[c].param][plan.layout[c].start : plan.layout[c].stop]
                for c in cids
            ]
            msg = Push(
                worker=self.member_id, iteration=self.iteration, samples=batch_size, chunks=cids
            )
            wire.send(self._ps[ps_id], msg, arrays)
        self._gather(set(plan.ps), Params)
        self._set_data()
        self.iteration += 1

    def close(self) -> None:
        """Leave the job (finished or removed) and release sockets."""
        if self._control.is_alive():
            stayed = self.plan is None or self.member_id in self.plan.workers
            reason: Literal["finished", "removed"] = "finished" if stayed else "removed"
            self._control.outbox.append(Leave(member_id=self.member_id, reason=reason))
            self._control.close()
        for sock in self._ps.values():
            sock.close(linger=0)
        self._control.link.close(linger_ms=500)  # let the Leave out
        self._ctx.term()

    def __enter__(self) -> ElasticTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- scaling ------------------------------------------------------------

    def _pause(self, plan: Plan) -> None:
        t0 = time.perf_counter()
        ctl = self._control
        joining = self.plan is None
        self._connect(plan)
        if plan.init_from == self.member_id:
            ctl.wait(lambda: ctl.committed == plan.plan_id, "commit")
            self._send_init(plan)
        queued = lambda: any(p.plan_id == plan.plan_id for p in ctl.pending)  # noqa: E731
        ctl.wait(lambda: plan.plan_id in ctl.resumed or not queued(), "resume")
        with ctl.cond:
            if not queued():
                return  # aborted: begin() decides again
            ctl.pending = [p for p in ctl.pending if p.plan_id != plan.plan_id]
        self._apply(plan, joining)
        if not joining and self.active:
            self.last_suspension_ms = (time.perf_counter() - t0) * 1e3
            ctl.outbox.append(
                Suspended(
                    member_id=self.member_id,
                    plan_id=plan.plan_id,
                    suspension_ms=self.last_suspension_ms,
                )
            )

    def _apply(self, plan: Plan, joining: bool) -> None:
        self.plan = plan
        if plan.stop or self.member_id not in plan.workers:
            self.active = False
            return
        self.rank = plan.workers.index(self.member_id)
        self.num_workers = len(plan.workers)
        for ps_id in [p for p in self._ps if p not in plan.ps]:
            self._poller.unregister(self._ps[ps_id])
            self._ps.pop(ps_id).close(linger=0)
        need = list(range(len(plan.layout))) if joining else sorted(plan.restore)
        if need:
            for ps_id in plan.ps:
                cids = [c for c in owned_by(plan.owners, ps_id) if c in set(need)]
                if cids:
                    wire.send(
                        self._ps[ps_id],
                        Pull(worker=self.member_id, version=plan.clock, chunks=cids),
                    )
            targets = {plan.owners[c] for c in need}
            self._gather(targets, Params)
            self._set_data()

    def _connect(self, plan: Plan) -> None:
        for ps_id, address in plan.ps.items():
            if ps_id not in self._ps:
                sock = wire.new_dealer(self._ctx, address)
                self._ps[ps_id] = sock
                self._poller.register(sock, zmq.POLLIN)

    def _send_init(self, plan: Plan) -> None:
        flat = [p.data().asnumpy().astype(np.float32).ravel() for p in self._params]
        for ps_id in plan.ps:
            cids = owned_by(plan.owners, ps_id)
            arrays = [
                flat[plan.layout[c].param][plan.layout[c].start : plan.layout[c].stop] for c in cids
            ]
            wire.send(self._ps[ps_id], Init(plan_id=plan.plan_id, chunks=cids), arrays)
        self._gather(set(plan.ps), Done)

    def _gather(self, targets: set[int], kind: type) -> None:
        """Wait for one ``kind`` reply from each PS in ``targets`` (writing Params into ``_flat``).

        A PS declared dead by a prepared plan is given up on: its chunks keep
        their old values until the plan's restore pull.
        """
        by_sock = {self._ps[p]: p for p in targets}
        waiting = set(targets)
        while waiting - self._control.dead_ps:
            if self._control.stop_reason is not None:
                raise JobStopped(self._control.stop_reason)
            for sock, _ in self._poller.poll(50):
                _, msg, arrays = wire.recv(sock)
                if isinstance(msg, Error):
                    raise RuntimeError(f"PS {by_sock.get(sock)} refused: {msg.reason}")
                if not isinstance(msg, kind) or sock not in by_sock:
                    continue
                if isinstance(msg, Params):
                    for cid, arr in zip(msg.chunks, arrays, strict=True):
                        spec = (self.plan or self._control.pending[0]).layout[cid]
                        self._flat[spec.param][spec.start : spec.stop] = arr
                waiting.discard(by_sock[sock])

    def _set_data(self) -> None:
        for p, flat, shape in zip(self._params, self._flat, self.shapes, strict=True):
            p.set_data(mx.nd.array(flat.reshape(shape), dtype=np.float32))

    def _rejoin_msg(self, member_id: int) -> Rejoin:
        return Rejoin(
            role="worker",
            member_id=member_id,
            pid=os.getpid(),
            version=self._control.started,
            plan=self.plan,
            shapes=self.shapes,
            optimizer=self._spec,
            global_batch=self.sharder.global_batch,
            num_samples=self.sharder.num_samples,
        )


def _trainable(params) -> list:
    """Parameters to synchronise, by order: a ParameterDict, dict or iterable of Parameters."""
    items: Iterable = params.values() if hasattr(params, "values") else params
    out = [p for p in items if p.grad_req != "null"]
    if not out:
        raise ValueError("no trainable parameters (all have grad_req='null')")
    for p in out:
        if p.shape is None or any(int(d) <= 0 for d in p.shape):
            raise ValueError(
                f"parameter {p.name} has unknown shape {p.shape}: give layers their input sizes "
                "or run one forward pass before creating the ElasticTrainer"
            )
        if np.dtype(p.dtype) != np.float32:
            raise ValueError(
                f"parameter {p.name} is {np.dtype(p.dtype)}; only float32 is supported"
            )
    return out


def _grad(p) -> np.ndarray:
    """Flat float32 gradient of ``p`` summed over its contexts."""
    grads = p.list_grad()
    g = grads[0].asnumpy().ravel()
    for other in grads[1:]:
        g = g + other.asnumpy().ravel()
    return g.astype(np.float32, copy=False)
