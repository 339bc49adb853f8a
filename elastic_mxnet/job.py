"""ElasticJob: the scheduler's handle on a running job (scale, status, stop).

job = ElasticJob("tcp://127.0.0.1:5555")
job.scale(ps=3)               # absolute targets; blocks until resumed or refused
job.status().members
job.stop()
"""

from __future__ import annotations

import time

import zmq

from elastic_mxnet.protocol import wire
from elastic_mxnet.protocol.messages import (
    Error,
    ScaleReply,
    ScaleRequest,
    StatusReply,
    StatusRequest,
    StopReply,
    StopRequest,
    _Msg,
)


class ScaleRefused(RuntimeError):
    """The coordinator refused or failed a request; the message is its reason."""


class ElasticJob:
    """Client of one job's coordinator. Not thread-safe; cheap to create."""

    def __init__(self, coordinator_address: str, timeout_s: float = 300.0) -> None:
        self.address = coordinator_address
        self.timeout_s = timeout_s
        self._ctx = zmq.Context()
        self._sock = wire.new_dealer(self._ctx, coordinator_address)

    def scale(
        self,
        ps: int | None = None,
        workers: int | None = None,
        at_iteration: int | None = None,
        timeout_s: float | None = None,
    ) -> ScaleReply:
        """Scale to ``ps`` PS and ``workers`` workers (``None``: unchanged).

        ``at_iteration`` pins the scaling clock to that iteration (refused if a
        worker already started it). Blocks until the workers resumed on the new
        plan. Raises :class:`ScaleRefused` with the coordinator's reason.
        """
        reply = self._call(
            ScaleRequest(ps=ps, workers=workers, at_iteration=at_iteration), timeout_s
        )
        if not isinstance(reply, ScaleReply) or not reply.ok:
            raise ScaleRefused(getattr(reply, "reason", str(reply)))
        return reply

    def status(self, timeout_s: float | None = 10.0) -> StatusReply:
        """Members, version (updates applied), samples/s, epochs done, scaling events."""
        reply = self._call(StatusRequest(), timeout_s)
        if not isinstance(reply, StatusReply):
            raise ScaleRefused(getattr(reply, "reason", str(reply)))
        return reply

    def stop(self, at_iteration: int | None = None, timeout_s: float | None = None) -> None:
        """Stop every worker at one iteration (``at_iteration`` or the next scaling clock)."""
        reply = self._call(StopRequest(at_iteration=at_iteration), timeout_s)
        if not isinstance(reply, StopReply) or not reply.ok:
            raise ScaleRefused(getattr(reply, "reason", str(reply)))

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> ElasticJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, msg: _Msg, timeout_s: float | None) -> _Msg:
        wire.send(self._sock, msg)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while (left := deadline - time.monotonic()) > 0:
            if self._sock.poll(int(min(left, 1.0) * 1000)):
                _, reply, _ = wire.recv(self._sock)
                if isinstance(reply, Error):
                    raise ScaleRefused(f"{reply.code}: {reply.reason}")
                return reply
        # A late reply would be read as the answer to the next call: start over.
        self._sock.close(linger=0)
        self._sock = wire.new_dealer(self._ctx, self.address)
        raise TimeoutError(f"no reply from the coordinator at {self.address} within the timeout")
