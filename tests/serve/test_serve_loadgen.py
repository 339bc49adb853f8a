"""The benchmark's load generator (its own process) against the app on plain uvicorn, and the plot."""

from __future__ import annotations

import json
import subprocess
import sys

from serve_support import free_port

from serve.bench import overload, plot_latency, summary_row
from serve.client import ServeScheduler
from serve.loadgen import percentiles


def _loadgen(url: str, body_file, *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "serve.loadgen", url, "--body", str(body_file), "--warmup", "0", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def test_open_loop_counts_every_request_by_status(endpoint, views, tmp_path):
    body = tmp_path / "body.json"
    body.write_bytes(ServeScheduler(endpoint.url).body(views[-1]))
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"view": 1}')
    (ok,) = _loadgen(endpoint.url, body, "--rate", "20", "--seconds", "1")
    # on a loaded machine the endpoint may refuse a few early (503, its overload guard): every request
    # is still counted, under its own status
    assert ok["requests"] == 20 and set(ok["statuses"]) <= {"200", "503"}
    assert sum(ok["statuses"].values()) == 20 and ok["ok"] == ok["statuses"]["200"] > 0
    assert 0 < ok["latency_ok"]["p50_ms"] <= ok["latency_ok"]["max_ms"]
    assert (ok["latency_refused"]["p50_ms"] is None) == ("503" not in ok["statuses"])
    (refused,) = _loadgen(endpoint.url, bad, "--rate", "10", "--seconds", "1")
    assert refused["statuses"] == {"422": 10} and refused["ok"] == 0
    (nobody,) = _loadgen(f"http://127.0.0.1:{free_port()}", body, "--rate", "5", "--seconds", "1")
    assert nobody["statuses"] == {"error": 5}


def test_percentiles_by_hand():
    p = percentiles([0.001 * k for k in range(1, 101)])  # 1 … 100 ms
    assert p == {"p50_ms": 50.5, "p90_ms": 90.1, "p99_ms": 99.01, "max_ms": 100.0}
    assert percentiles([])["p99_ms"] is None


def _run(rate: float, statuses: dict, p99: float) -> dict:
    lat = {"p50_ms": p99 / 2, "p90_ms": p99, "p99_ms": p99, "max_ms": p99}
    return {"rate": rate, "requests": sum(statuses.values()), "statuses": statuses,
            "ok": statuses.get("200", 0), "achieved_rps": rate, "latency_ok": lat, "latency_all": lat,
            "latency_refused": lat}


def test_summary_and_plot(tmp_path, monkeypatch):
    answers = _run(300.0, {"200": 10, "503": 20, "500": 1}, 40.0)
    monkeypatch.setattr("serve.bench.load", lambda *a, **k: [answers])
    over = overload("http://x", tmp_path / "b", 300.0, 1.0, 25.0, None)
    assert over["other_5xx"] == 1 and over["latest_answer_ms"] == 40.0 and not over["within_bound"]
    server = {"fixed_rate": _run(100.0, {"200": 100}, 9.0),
              "max_rate": {"max_rps_p99_under_50ms": 100.0, "probes": [_run(200.0, {"200": 200}, 80.0)]},
              "overload": over, "up_after": True}
    row = summary_row(server)
    assert row["p99_ms"] == 9.0 and row["max_rps_p99_under_50ms"] == 100.0 and row["other_5xx"] == 1
    doc = {"servers": {"serve-direct": server}, "jobs": 40, "nodes": 500, "cores": 2,
           "load_avg_at_start": [1.0], "load_avg_at_end": [2.0]}
    plot_latency(doc, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
