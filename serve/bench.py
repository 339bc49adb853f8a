"""``dl2ray bench serve``: latency of the decision endpoint at a fixed request rate, and where the time goes.

One view (the config's cluster run with DRF until ``jobs`` jobs are present,
cut to the first ``jobs``), one request body, sent by an **open-loop** load
generator: request i is due at ``t0 + i/rate`` and its latency is counted from
that due time (a slow answer delays the requests behind it, and that delay is
counted, not hidden). 16 client threads, one kept-alive HTTP/1.1 connection
each. Measured side by side in one run:

- ``in_process``: ``DL2Scheduler.decide(view)`` alone, and the handler's steps
  without HTTP (parse + validate the JSON body, convert to a ClusterView,
  decide, build + serialise the response);
- ``uvicorn``: the same FastAPI app and handler on plain uvicorn (a subprocess);
- ``serve``: the Ray Serve application (HTTP proxy → replica), as ``dl2ray serve`` runs it;
- ``max_rate``: for both servers, the highest rate of a doubling-then-halving
  search whose p99 stays under 50 ms with every request answered 200 and the
  rate achieved (within 5 %).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

P99_LIMIT_MS = 50.0
CLIENT_THREADS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ms(xs) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64) * 1e3
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}


def load(url: str, body: bytes, rate: float, seconds: float) -> dict:
    """Open-loop POSTs of ``body`` to ``url/v1/decide``, ``rate``/s for ``seconds``; latency from due time."""
    host, port = url.removeprefix("http://").split(":")
    n = int(rate * seconds)
    lat = np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int32)
    lock, nxt = threading.Lock(), [0]
    headers = {"content-type": "application/json"}
    t0 = time.perf_counter() + 0.05

    def worker() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                break
            due = t0 + i / rate
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            try:
                conn.request("POST", "/v1/decide", body, headers)
                r = conn.getresponse()
                r.read()
                status[i] = r.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                status[i] = -1
            lat[i] = time.perf_counter() - due
        conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(CLIENT_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = status == 200
    return {"rate": rate, "requests": n, "ok": int(ok.sum()), "achieved_rps": round(n / wall, 1),
            **_ms(lat[ok] if ok.any() else [np.nan])}


def max_rate(url: str, body: bytes, start: float, probe_s: float) -> dict:
    """Highest sustained rate with p99 < 50 ms (doubling from ``start``, then halving the gap 3 times)."""

    def good(rate: float) -> tuple[bool, dict]:
        r = load(url, body, rate, probe_s)
        return (r["ok"] == r["requests"] and r["p99_ms"] < P99_LIMIT_MS
                and r["achieved_rps"] >= 0.95 * rate), r

    probes, lo, hi = [], 0.0, start
    while True:
        ok, r = good(hi)
        probes.append(r)
        if not ok:
            break
        lo, hi = hi, hi * 2
        if hi > 5000:
            break
    for _ in range(3):
        if hi - lo < 5:
            break
        mid = round((lo + hi) / 2)
        ok, r = good(mid)
        probes.append(r)
        lo, hi = (mid, hi) if ok else (lo, mid)
    return {"max_rps_p99_under_50ms": lo, "probes": probes}


def in_process(cfg, ckpt: Path, view, repeats: int = 300) -> dict:
    """The decision alone, and the handler's steps without HTTP (same body as the servers get)."""
    from dl2ray.schedulers.dl2 import DL2Scheduler
    from serve.client import ServeScheduler
    from serve.convert import from_allocation, to_view
    from serve.schemas import DecideRequest, DecideResponse

    sched = DL2Scheduler(str(ckpt), cfg)
    body = ServeScheduler("http://unused").body(view)
    steps: dict[str, list[float]] = {k: [] for k in ("parse", "convert", "decide", "respond", "handler")}
    for k in range(repeats + 5):
        t0 = time.perf_counter()
        req = DecideRequest.model_validate_json(body)
        t1 = time.perf_counter()
        v = to_view(req.view, cfg.catalogue, cfg.cluster.placement, 10 * cfg.policy.window)
        t2 = time.perf_counter()
        alloc = sched.decide(v)
        t3 = time.perf_counter()
        DecideResponse(allocation=from_allocation(alloc), scheduler="dl2", policy_version="x",
                       decision_ms=0.0).model_dump_json()
        t4 = time.perf_counter()
        if k >= 5:  # the first runs load the compiled loop and warm caches
            for name, dt in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0), strict=True):
                steps[name].append(dt)
    return {"decide": _ms(steps["decide"]), "handler": _ms(steps["handler"]),
            "handler_steps_p50_ms": {k: _ms(v)["p50_ms"] for k, v in steps.items() if k != "handler"},
            "body_bytes": len(body), "repeats": repeats}


def _wait_ready(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    host, port = url.removeprefix("http://").split(":")
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


UVICORN_MAIN = """
import json, sys, uvicorn
from serve.app import DecisionService, plain_app
settings, port = json.loads(sys.argv[1]), int(sys.argv[2])
uvicorn.run(plain_app(DecisionService(settings)), host="127.0.0.1", port=port, log_level="warning")
"""


def _measure(url: str, body: bytes, rps: float, seconds: float, probe_s: float) -> dict:
    load(url, body, min(rps, 50.0), 2.0)  # warm-up: connections, compiled loop, caches
    return {"fixed_rate": load(url, body, rps, seconds), "max_rate": max_rate(url, body, rps, probe_s)}


def run(config: Path, ckpt: Path, rps: float, seconds: float, jobs: int, probe_s: float, seed: int) -> dict:
    from dl2ray.bench import busy_view
    from dl2ray.config import load_config
    from serve.app import ServeSettings
    from serve.client import ServeScheduler
    from serve.plugin import run_app, start_ray

    cfg = load_config(config)
    view = busy_view(cfg, jobs, seed)
    body = ServeScheduler("http://unused").body(view)
    settings = ServeSettings(config=str(config.resolve()), checkpoint=str(ckpt.resolve()), reload_every_s=2.0)
    doc: dict = {"bench": "serve", "config": cfg.name, "jobs": jobs, "nodes": view.num_nodes,
                 "checkpoint": str(ckpt), "rps": rps, "seconds": seconds, "cores": os.cpu_count(),
                 "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
                 "in_process": in_process(cfg, ckpt, view)}

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", UVICORN_MAIN, settings.model_dump_json(), str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        doc["uvicorn"] = _measure(url, body, rps, seconds, probe_s)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    started = start_ray()
    try:
        from ray import serve as ray_serve

        url = run_app(settings, "127.0.0.1", free_port(), name="dl2ray-bench", blocking=False)
        try:
            _wait_ready(url)
            doc["serve"] = _measure(url, body, rps, seconds, probe_s)
        finally:
            ray_serve.shutdown()
    finally:
        if started:
            import ray

            ray.shutdown()
    doc["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    doc["target_p99_ms_at_100rps"] = 10.0
    doc["summary"] = json.loads(json.dumps({
        k: {"p50_ms": doc[k]["fixed_rate"]["p50_ms"], "p99_ms": doc[k]["fixed_rate"]["p99_ms"],
            "max_rps_p99_under_50ms": doc[k]["max_rate"]["max_rps_p99_under_50ms"]}
        for k in ("uvicorn", "serve")}))
    return doc
