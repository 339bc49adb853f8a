"""What the dashboard and the metrics cost: the state's build and size, a scrape, and the per-slot and
per-request instruments.

    .venv/bin/python tests/bench/bench_dashboard.py [--jobs 10 --jobs 100] [--slots 100] [--json]

For each ``--jobs N``: the real control loop (DRF) steps ``--slots`` slots of an in-memory cluster of two
nodes (the fast test's :class:`TinyCluster`, its capacity scaled so that every job runs; every job gets a
history row per slot it runs and a scaling event per change); then, over the agent's real HTTP server
on loopback, ``GET /api/state`` and ``GET /metrics`` (median and p90 of 30 requests each, ms, each one
building its answer: the server's 1 s sharing is off here; the answer's bytes), and in-process the build
of the state alone and one :meth:`AgentMetrics.slot` call (the loop's added work per slot, µs). Serve:
the :class:`~serve.metrics.RequestTimer` middleware's cost per request, an in-process ASGI call of a
trivial app with and without it (µs, median of 5 rounds of 20,000 calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "clusters")]

import requests  # noqa: E402
from test_dashboard import ROOT, TinyCluster  # noqa: E402

from clusters.agent.dashboard import dashboard_state  # noqa: E402
from clusters.agent.http import AgentHttp, make_app  # noqa: E402
from clusters.agent.loop import Agent  # noqa: E402
from clusters.agent.metrics import AgentMetrics  # noqa: E402
from clusters.ray.config import LiveConfig  # noqa: E402
from serve.metrics import RequestTimer, ServeMetrics  # noqa: E402


def _ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_ms": round(statistics.median(s) * 1e3, 3),
            "p90_ms": round(s[int(0.9 * (len(s) - 1))] * 1e3, 3)}


def _get(url: str, n: int = 30) -> tuple[dict[str, float], int]:
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        r = requests.get(url, timeout=60)
        times.append(time.perf_counter() - t0)
        size = len(r.content)
        r.raise_for_status()
    return _ms(times), size


def agent_case(jobs: int, slots: int) -> dict:
    cluster = TinyCluster()
    cluster.capacity = cluster.capacity * max(1, jobs // 4)  # room for every job to run
    for i in range(jobs):
        cluster.add(f"job-{i}", epochs=1e6)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = LiveConfig.model_validate({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                                  "log_dir": tmp}})
        metrics = AgentMetrics(lambda: cluster.statuses().values())
        agent = Agent(cfg, cluster, "drf", metrics=metrics)
        for slot in range(slots):
            cluster.slot = slot
            agent.step()

        def state():
            return dashboard_state(agent, {"agent": "bench"}, cluster.statuses().values(),
                                   list(cluster.NODES))

        t0 = time.perf_counter()
        for _ in range(10):
            state().model_dump_json()
        build_ms = (time.perf_counter() - t0) / 10 * 1e3
        row = {"total_ms": 5.0, "view_ms": 1.0, "decide_ms": 3.0, "apply_ms": 1.0}
        decision = {"applied": "policy", "reason": ""}
        t0 = time.perf_counter()
        for _ in range(10_000):
            metrics.slot(row, decision, [True, True], None)
        slot_us = (time.perf_counter() - t0) / 10_000 * 1e6
        http = AgentHttp(make_app(state, metrics.scrape, max_age_s=0.0), "127.0.0.1", 0)  # every GET builds
        try:
            st, st_bytes = _get(f"{http.url}/api/state")
            sc, sc_bytes = _get(f"{http.url}/metrics")
        finally:
            http.stop()
            agent.close()
    history = sum(len(j["history"]) for j in cluster.jobs.values())
    return {"jobs": jobs, "slots": slots, "history_rows": history,
            "events": sum(len(j["events"]) for j in cluster.jobs.values()),
            "state_build_ms": round(build_ms, 3), "api_state": {**st, "bytes": st_bytes},
            "metrics_scrape": {**sc, "bytes": sc_bytes}, "metrics_slot_us": round(slot_us, 2)}


def serve_case(calls: int = 20_000, rounds: int = 5) -> dict:
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        return None

    overload = {"admitted": 0, "refused_arrival": 0, "refused_late": 0, "held": 0}
    timed = RequestTimer(app, ServeMetrics(lambda: overload, lambda: ("v", "s", 0, 0)))
    scope = {"type": "http", "path": "/v1/decide", "method": "POST", "headers": []}

    async def run(target) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            await target(scope, receive, send)
        return (time.perf_counter() - t0) / calls * 1e6

    plain = [asyncio.run(run(app)) for _ in range(rounds)]
    with_timer = [asyncio.run(run(timed)) for _ in range(rounds)]
    return {"calls": calls, "rounds": rounds, "plain_us": round(statistics.median(plain), 3),
            "with_timer_us": round(statistics.median(with_timer), 3),
            "timer_overhead_us": round(statistics.median(with_timer) - statistics.median(plain), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, action="append")
    p.add_argument("--slots", type=int, default=100)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    out = {"benchmark": "dashboard and metrics",
           "agent": [agent_case(n, a.slots) for n in (a.jobs or [10, 100])],
           "serve_request_timer": serve_case()}
    print(json.dumps(out) if a.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
