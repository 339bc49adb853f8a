"""ZeroMQ plumbing: sending and receiving :mod:`messages` on ROUTER and DEALER sockets.

Every listening endpoint (coordinator, PS data port) is a ROUTER; every peer
talks to it through a DEALER. A ROUTER message carries the peer's routing id
as its first frame, which is how replies and pushes find their way back.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence

import numpy as np
import zmq

from elastic_mxnet.protocol.messages import Error, ProtocolError, _Msg, decode, encode


def new_dealer(ctx: zmq.Context, address: str, identity: bytes | None = None) -> zmq.Socket:
    """A DEALER connected to ``address`` (``tcp://host:port``); unsent messages dropped on close."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return sock


def bind_router(ctx: zmq.Context, host: str, port: int = 0) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on ``host:port`` (port 0: any free port) and its ``tcp://`` address."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    if port:
        sock.bind(f"tcp://{host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{host}:{port}"


def send(
    sock: zmq.Socket, msg: _Msg, arrays: Sequence[np.ndarray] = (), to: bytes | None = None
) -> None:
    """Send ``msg`` (to routing id ``to`` on a ROUTER)."""
    frames = encode(msg, arrays)
    if to is not None:
        frames = [to, *frames]
    sock.send_multipart(frames, copy=False)


def recv(sock: zmq.Socket, routed: bool = False) -> tuple[bytes | None, _Msg, list[np.ndarray]]:
    """Receive one message: ``(routing id or None, message, arrays)``.

    Raises :class:`RoutedProtocolError` (which carries the routing id) when the
    message does not validate, so the caller can answer with an error.
    """
    raw = sock.recv_multipart(copy=False)
    ident: bytes | None = None
    if routed:
        ident = raw[0].bytes
        raw = raw[1:]
    try:
        msg, arrays = decode([f.buffer for f in raw])
    except ProtocolError as exc:
        raise RoutedProtocolError(str(exc), ident) from None
    return ident, msg, arrays


class RoutedProtocolError(ProtocolError):
    """A :class:`ProtocolError` that remembers who sent the bad message."""

    def __init__(self, reason: str, ident: bytes | None) -> None:
        super().__init__(reason)
        self.ident = ident


def reply_error(sock: zmq.Socket, ident: bytes | None, code: str, reason: str) -> None:
    """Answer a bad or unexpected message; never raises (the peer may be gone)."""
    with contextlib.suppress(zmq.ZMQError):
        send(sock, Error(code=code, reason=reason), to=ident)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (for processes that must bind a known port)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
