"""An open-loop load generator for the decision endpoint, in its own process (``python -m serve.loadgen``).

Request ``i`` is due at ``t0 + i / rate``; it is sent at its due time whatever
happened to the earlier ones (open loop: a slow server is not given time to
catch up), on an idle kept-alive connection or a new one, and its latency
counts from that due time to the last byte of the answer, so queueing anywhere
— in the client, the kernel, a proxy or the replica — is charged, never hidden.

Protocols: ``http://HOST:PORT`` (HTTP/1.1, one request per connection at a
time, up to ``--connections`` connections, the body POSTed to ``/v1/decide``)
and ``grpc://HOST:PORT`` (one HTTP/2 channel, the body sent as the serialised
``dl2ray.serve.Decider/Decide`` request). The body is prepared by the caller
(``--body FILE``), so the generator does no encoding work per request.

It prints one JSON object: the rate offered and achieved, answers counted by
status (HTTP code, or gRPC code name), and latency percentiles in ms over the
answers (``ok``: status 200/OK only; ``refused``: 503/RESOURCE_EXHAUSTED;
``all``: every answer). A request with no answer within ``--timeout`` counts as
``timeout``; one whose connection failed as ``error``.

It imports nothing from the rest of the project, so its own cost stays a
small, known part of the machine (a thin asyncio client on uvloop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import numpy as np

GRPC_METHOD = "/dl2ray.serve.v1.Decider/Decide"
REFUSED = {"503", "RESOURCE_EXHAUSTED"}


def percentiles(seconds: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max of ``seconds``, in ms (None when empty)."""
    if not seconds:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    a = np.asarray(seconds) * 1e3
    q = np.percentile(a, [50, 90, 99])
    return {"p50_ms": round(float(q[0]), 3), "p90_ms": round(float(q[1]), 3),
            "p99_ms": round(float(q[2]), 3), "max_ms": round(float(a.max()), 3)}


class HTTPTarget:
    """Kept-alive HTTP/1.1 connections to one server; ``call()`` POSTs the body and returns the status."""

    def __init__(self, host: str, port: int, path: str, body: bytes, content_type: str,
                 max_connections: int) -> None:
        self.host, self.port = host, port
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
                f"Accept: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        self.request = head.encode() + body
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened, self.max_connections = 0, max_connections
        self.slots = asyncio.Semaphore(max_connections)

    async def call(self) -> str:
        async with self.slots:  # beyond max_connections in flight, a request waits here (and is charged)
            conn = self.idle.pop() if self.idle else None
            if conn is None:
                conn = await asyncio.open_connection(self.host, self.port)
                self.opened += 1
            reader, writer = conn
            try:
                writer.write(self.request)
                status, keep = await self._response(reader)
            except BaseException:
                writer.close()
                raise
            if keep:
                self.idle.append(conn)
            else:
                writer.close()
            return status

    @staticmethod
    async def _response(reader: asyncio.StreamReader) -> tuple[str, bool]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)[1].decode()
        length, keep = 0, True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                await HTTPTarget._chunked(reader)
                return status, keep
        if length:
            await reader.readexactly(length)
        return status, keep

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> None:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


class GRPCTarget:
    """One gRPC channel; ``call()`` sends the serialised request and returns the status code's name."""

    def __init__(self, host: str, port: int, body: bytes, metadata: tuple) -> None:
        import grpc

        self.grpc = grpc
        self.channel = grpc.aio.insecure_channel(f"{host}:{port}")
        self.method = self.channel.unary_unary(GRPC_METHOD)  # bytes in, bytes out: no decoding here
        self.body, self.metadata = body, metadata

    async def call(self) -> str:
        try:
            await self.method(self.body, metadata=self.metadata)
        except self.grpc.aio.AioRpcError as exc:
            return exc.code().name
        return "OK"

    async def close(self) -> None:
        await self.channel.close()


async def run(target, rate: float, seconds: float, timeout_s: float) -> dict:
    """Open-loop calls of ``target`` at ``rate``/s for ``seconds``; the summary (module docstring)."""
    n = max(1, int(rate * seconds))
    lat = np.full(n, np.nan)
    status: list[str] = [""] * n
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    t0 = clock() + 0.05

    async def one(i: int, due: float) -> None:
        try:
            status[i] = await asyncio.wait_for(target.call(), timeout_s)
        except TimeoutError:
            status[i] = "timeout"
        except (OSError, asyncio.IncompleteReadError, ValueError):
            status[i] = "error"
        lat[i] = clock() - due

    tasks = []
    for i in range(n):
        due = t0 + i / rate
        if (wait := due - clock()) > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(one(i, due)))
    sent_by = clock()
    await asyncio.gather(*tasks)
    wall = clock() - t0
    counts = Counter(status)
    ok = [float(x) for x, s in zip(lat, status, strict=True) if s in ("200", "OK")]
    refused = [float(x) for x, s in zip(lat, status, strict=True) if s in REFUSED]
    answered = [float(x) for x, s in zip(lat, status, strict=True) if s not in ("timeout", "error")]
    return {"rate": rate, "seconds": seconds, "requests": n, "statuses": dict(sorted(counts.items())),
            "ok": len(ok), "refused": len(refused), "offered_rps": round(n / max(sent_by - t0, 1e-9), 1),
            "achieved_rps": round(len(answered) / wall, 1), "latency_ok": percentiles(ok),
            "latency_refused": percentiles(refused), "latency_all": percentiles(answered),
            "send_lag_ms": round((sent_by - (t0 + (n - 1) / rate)) * 1e3, 3)}


def make_target(url: str, body: bytes, content_type: str, max_connections: int, application: str | None):
    parts = urlsplit(url)
    if parts.scheme == "http":
        return HTTPTarget(parts.hostname or "127.0.0.1", parts.port or 80, (parts.path.rstrip("/") or "")
                          + "/v1/decide", body, content_type, max_connections)
    if parts.scheme == "grpc":
        metadata = (("application", application),) if application else ()
        return GRPCTarget(parts.hostname or "127.0.0.1", parts.port or 9000, body, metadata)
    raise SystemExit(f"loadgen: {url}: give http://HOST:PORT or grpc://HOST:PORT")


async def main_async(args: argparse.Namespace) -> list[dict]:
    with open(args.body, "rb") as f:
        body = f.read()
    target = make_target(args.url, body, args.content_type, args.connections, args.application)
    out = []
    try:
        if args.warmup > 0:
            await run(target, min(args.rates[0], 50.0), args.warmup, args.timeout)
        for rate in args.rates:
            out.append(await run(target, rate, args.seconds, args.timeout))
    finally:
        await target.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m serve.loadgen", description=__doc__.split("\n")[0])
    p.add_argument("url", help="http://HOST:PORT or grpc://HOST:PORT")
    p.add_argument("--body", required=True, help="file with the request body (JSON, or the serialised proto)")
    p.add_argument("--rate", dest="rates", type=float, action="append", required=True,
                   help="requests per second (repeat for several runs, in order)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per rate")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds at min(rate, 50)/s first, not reported")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request counts as timeout")
    p.add_argument("--connections", type=int, default=256, help="most HTTP connections open at once")
    p.add_argument("--content-type", default="application/json")
    p.add_argument("--application", default=None, help="gRPC: Serve application name (metadata)")
    args = p.parse_args(argv)
    run_loop: Any
    try:
        from uvloop import run as run_loop
    except ImportError:  # plain asyncio is only slower
        run_loop = asyncio.run
    json.dump(run_loop(main_async(args)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
