"""Wire format validation, and receivers that answer bad messages and keep running."""

from __future__ import annotations

import os
import threading

import msgpack
import numpy as np
import pytest
import zmq

from elastic_mxnet.job import ElasticJob, ScaleRefused
from elastic_mxnet.protocol import wire
from elastic_mxnet.protocol.messages import (
    PROTOCOL_VERSION,
    Error,
    ProtocolError,
    Push,
    Register,
    StatusReply,
    decode,
    encode,
)
from elastic_mxnet.server import ParameterServer


def _frames(msg, arrays=()):
    return [bytes(f) for f in encode(msg, arrays)]


def test_round_trip_with_arrays():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.5], dtype=np.float64)
    msg, arrays = decode(_frames(Push(worker=3, iteration=7, samples=16, chunks=[0, 2]), [a, b]))
    assert isinstance(msg, Push) and msg.iteration == 7 and msg.v == PROTOCOL_VERSION
    assert np.array_equal(arrays[0], a) and np.array_equal(arrays[1], b)


@pytest.mark.parametrize(
    "frames, match",
    [
        ([], "empty"),
        ([b"\xc1not msgpack"], "msgpack"),
        ([msgpack.packb([1, 2])], "not a map"),
        ([msgpack.packb({"v": 99, "kind": "status"})], "version"),
        ([msgpack.packb({"v": 1, "kind": "no_such_kind"})], "invalid header"),
        ([msgpack.packb({"v": 1, "kind": "push", "worker": 1})], "invalid header"),
        ([msgpack.packb({"v": 1, "kind": "status", "extra": 1})], "invalid header"),
        (
            [
                msgpack.packb(
                    {"v": 1, "kind": "status", "arrays": [{"dtype": "float32", "shape": [4]}]}
                )
            ],
            "lists 1 arrays",
        ),
        (
            [
                msgpack.packb(
                    {"v": 1, "kind": "status", "arrays": [{"dtype": "float32", "shape": [4]}]}
                ),
                b"123",
            ],
            "does not match",
        ),
        (
            [
                msgpack.packb(
                    {"v": 1, "kind": "status", "arrays": [{"dtype": "object", "shape": [1]}]}
                ),
                b"1234",
            ],
            "invalid header",
        ),
    ],
)
def test_malformed_messages_are_rejected(frames, match):
    with pytest.raises(ProtocolError, match=match):
        decode(frames)


def _ask(ctx, address, frames):
    sock = wire.new_dealer(ctx, address)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no answer"
        return wire.recv(sock)[1]
    finally:
        sock.close(linger=0)


def test_coordinator_answers_bad_messages_and_stays_up(coordinator_thread):
    ctx = zmq.Context()
    address = coordinator_thread.address
    garbage = [
        [b"garbage"],
        [msgpack.packb({"v": 2, "kind": "status"})],
        _frames(Push(worker=0, iteration=0, samples=1, chunks=[])),
    ]
    for frames in garbage:
        reply = _ask(ctx, address, frames)
        assert isinstance(reply, Error), reply
    # a worker that registers without describing its model is refused, not crashed on
    reply = _ask(ctx, address, _frames(Register(role="worker", pid=os.getpid())))
    assert isinstance(reply, Error) and "shapes" in reply.reason
    with ElasticJob(address, timeout_s=10) as job:
        assert isinstance(job.status(), StatusReply)
        with pytest.raises(ScaleRefused, match="not running"):
            job.scale(ps=2)
    ctx.term()


def test_parameter_server_answers_bad_messages_and_stays_up(coordinator_thread):
    server = ParameterServer(coordinator_thread.address)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ctx = zmq.Context()
    try:
        for frames in ([b"\x00"], _frames(Push(worker=0, iteration=0, samples=1, chunks=[]))):
            reply = _ask(ctx, server.address, frames)
            assert isinstance(reply, Error)
        reply = _ask(ctx, server.address, _frames(Register(role="ps", address="x", pid=1)))
        assert isinstance(reply, Error) and "does not accept" in reply.reason
        assert thread.is_alive()
        with ElasticJob(coordinator_thread.address, timeout_s=10) as job:
            status = job.status()
        assert [m.role for m in status.members] == ["ps"]
    finally:
        server.running = False
        thread.join(timeout=10)
        ctx.term()
