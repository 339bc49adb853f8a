"""A member's control connection to the coordinator: registration, heartbeats, rejoin.

Both PS and workers hold one :class:`MemberLink` (a DEALER). The owner polls
``link.sock``, passes each incoming message to :meth:`MemberLink.handle`
(which consumes heartbeat acks and re-registration, and returns what the owner
must act on), and calls :meth:`MemberLink.tick` often to send heartbeats.

When a restarted coordinator answers a heartbeat with ``unknown_member``, the
link re-registers with :class:`~elastic_mxnet.protocol.messages.Rejoin`, built by the
owner's ``rejoin`` callback from its current state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from elastic_mxnet.protocol import wire
from elastic_mxnet.protocol.messages import (
    Error,
    Heartbeat,
    HeartbeatAck,
    Register,
    Registered,
    Rejoin,
    _Msg,
)

log = logging.getLogger(__name__)


class Orphaned(RuntimeError):
    """The coordinator has not answered for longer than the orphan timeout."""


class RegistrationRefused(RuntimeError):
    """The coordinator refused to register this member (the reason is the message)."""


class MemberLink:
    """Control channel of one member (not thread-safe: one thread owns it)."""

    def __init__(
        self,
        ctx: zmq.Context,
        coordinator: str,
        register: Register,
        rejoin: Callable[[int], Rejoin],
    ) -> None:
        self.sock = wire.new_dealer(ctx, coordinator)
        self._register_msg = register
        self._rejoin = rejoin
        self.member_id: int | None = None
        self.heartbeat_interval_s = 0.1
        self.orphan_timeout_s = 30.0
        self.rtt_ms = 0.0
        self._next_beat = 0.0
        self._beat_sent_at: float | None = None
        self._last_heard = time.monotonic()

    def register(self, timeout_s: float) -> int:
        """Register and return the member id; raise on refusal or after ``timeout_s`` seconds."""
        wire.send(self.sock, self._register_msg)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.sock.poll(100):
                continue
            try:
                _, msg, _ = wire.recv(self.sock)
            except wire.RoutedProtocolError as exc:
                log.warning("bad message from coordinator: %s", exc)
                continue
            if isinstance(msg, Registered):
                self._accept(msg)
                return msg.member_id
            if isinstance(msg, Error):
                raise RegistrationRefused(msg.reason)
        raise TimeoutError(f"no answer to registration within {timeout_s} s")

    def handle(self, msg: _Msg) -> _Msg | None:
        """Consume link-level messages; return the others for the owner."""
        self._last_heard = time.monotonic()
        if isinstance(msg, HeartbeatAck):
            if self._beat_sent_at is not None:
                self.rtt_ms = (time.monotonic() - self._beat_sent_at) * 1e3
                self._beat_sent_at = None
            return None
        if isinstance(msg, Registered):
            self._accept(msg)
            return None
        if isinstance(msg, Error) and msg.code == "unknown_member" and self.member_id is not None:
            log.info("coordinator does not know member %d: rejoining", self.member_id)
            wire.send(self.sock, self._rejoin(self.member_id))
            return None
        return msg

    def tick(self, version: int) -> None:
        """Send a heartbeat when one is due; raise :class:`Orphaned` if the coordinator is gone."""
        now = time.monotonic()
        if now - self._last_heard > self.orphan_timeout_s:
            raise Orphaned(f"coordinator silent for {now - self._last_heard:.1f} s")
        if self.member_id is None or now < self._next_beat:
            return
        self._next_beat = now + self.heartbeat_interval_s
        if self._beat_sent_at is None or now - self._beat_sent_at > 1.0:
            self._beat_sent_at = now
        wire.send(
            self.sock, Heartbeat(member_id=self.member_id, version=version, rtt_ms=self.rtt_ms)
        )

    def send(self, msg: _Msg) -> None:
        """Send any message to the coordinator."""
        wire.send(self.sock, msg)

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket, waiting up to ``linger_ms`` for queued messages to go out."""
        self.sock.close(linger=linger_ms)

    def _accept(self, msg: Registered) -> None:
        self.member_id = msg.member_id
        self.heartbeat_interval_s = msg.heartbeat_interval_s
        self.orphan_timeout_s = msg.orphan_timeout_s
        self._last_heard = time.monotonic()
