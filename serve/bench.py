"""``dl2ray bench serve``: latency of the decision endpoint at a fixed rate, its highest rate, and overload.

One view (the config's cluster run with DRF until ``jobs`` jobs are present,
cut to the first ``jobs``), one request (JSON body, and the same request as a
serialised ``decide.proto`` message), sent by the **open-loop** load generator
:mod:`serve.loadgen` running in its own process (request i is due at
``t0 + i/rate``; its latency counts from that due time, so queueing is charged).

Measured in one run, each server started as its own process tree:

- ``in_process``: the decision alone, and the handler's steps without a network
  (parse + validate the JSON body, convert to a ClusterView, decide, serialise
  the answer; and the gRPC message's parse + conversion);
- ``uvicorn``: the FastAPI app on plain uvicorn (a subprocess);
- ``serve-MODE``: ``dl2ray serve --mode MODE`` (:data:`serve.launch.SERVE_MODES`)
  over HTTP, and ``serve-MODE-grpc`` over gRPC for the modes in ``grpc_modes``;
  ``MODE:R`` runs R replicas (``serve-MODE-xR``; the load goes to the URL the app
  announces, so only a mode with one address in front of its replicas —
  ``proxy``, ``haproxy`` — spreads it).

For every server: ``fixed_rate`` (``rps`` for ``seconds``); ``max_rate``: the
highest rate of a doubling-then-bisecting search whose p99 stays under 50 ms
with every request answered 200 and the rate achieved (within 5 %);
``overload``: ``overload_factor`` × that rate for ``probe_s`` × 2 seconds, with
the answers by status, the latest answer (refusals included) against the
server's bound, and whether the server still answers ``/healthz`` afterwards.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

P99_LIMIT_MS = 50.0
DIRECT_SPAN = 64  # ports a Serve server may use above its HTTP port (serve.launch.mode_env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(span: int = DIRECT_SPAN, rng: random.Random | None = None) -> int:
    """A port ``p`` with ``p … p + span`` free on loopback now (Serve's direct-ingress ranges go there)."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 29000)
        try:
            socks = []
            for p in range(base, base + span + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def _ms(xs) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64) * 1e3
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- the load generator, in its own process ---------------------------------------------------------


def load(url: str, body_file: Path, rates: list[float], seconds: float, warmup: float = 0.0,
         application: str | None = None) -> list[dict]:
    """``python -m serve.loadgen`` at each of ``rates`` in turn; its JSON summaries (+ the load average)."""
    cmd = [sys.executable, "-m", "serve.loadgen", url, "--body", str(body_file), "--seconds", str(seconds),
           "--warmup", str(warmup), "--timeout", "30"]
    for r in rates:
        cmd += ["--rate", str(r)]
    if application:
        cmd += ["--application", application]
    before = load_average()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    runs = json.loads(out)
    for r in runs:
        r["load_avg_before"], r["load_avg_after"] = before, load_average()
    return runs


def _good(r: dict) -> bool:
    p99 = r["latency_ok"]["p99_ms"]
    return (r["ok"] == r["requests"] and p99 is not None and p99 < P99_LIMIT_MS
            and r["achieved_rps"] >= 0.95 * r["rate"])


def max_rate(url: str, body_file: Path, start: float, probe_s: float, application: str | None) -> dict:
    """Highest sustained rate with p99 < 50 ms (doubling from ``start``, then bisecting 3 times)."""
    probes, lo, hi = [], 0.0, start
    while True:
        r = load(url, body_file, [hi], probe_s, application=application)[0]
        probes.append(r)
        if not _good(r):
            break
        lo, hi = hi, hi * 2
        if hi > 5000:
            break
    for _ in range(3):
        if hi - lo < 5:
            break
        mid = round((lo + hi) / 2)
        r = load(url, body_file, [mid], probe_s, application=application)[0]
        probes.append(r)
        lo, hi = (mid, hi) if _good(r) else (lo, mid)
    return {"max_rps_p99_under_50ms": lo, "probes": probes}


def overload(url: str, body_file: Path, rate: float, seconds: float, bound_ms: float,
             application: str | None) -> dict:
    """``rate`` for ``seconds``: answers by status, the latest answer against ``bound_ms``."""
    r = load(url, body_file, [rate], seconds, application=application)[0]
    five = {s: n for s, n in r["statuses"].items() if s.isdigit() and s.startswith("5") and s != "503"}
    late = r["latency_all"]["max_ms"]
    return {**r, "bound_ms": bound_ms, "other_5xx": sum(five.values()),
            "latest_answer_ms": late, "within_bound": late is not None and late <= bound_ms}


def measure(url: str, body_file: Path, rps: float, seconds: float, probe_s: float, factor: float,
            bound_ms: float, application: str | None = None) -> dict:
    fixed = load(url, body_file, [rps], seconds, warmup=2.0, application=application)[0]
    best = max_rate(url, body_file, rps, probe_s, application)
    rate = factor * max(best["max_rps_p99_under_50ms"], rps)
    return {"fixed_rate": fixed, "max_rate": best,
            "overload": overload(url, body_file, rate, 2 * probe_s, bound_ms, application)}


# -- the servers ------------------------------------------------------------------------------------


def _healthy(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        if _healthy(url):
            return
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # dl2ray serve / uvicorn shut down on SIGTERM (Serve and the Ray it started)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


UVICORN_MAIN = """
import json, sys, uvicorn
from serve.app import DecisionService, plain_app
settings, port = json.loads(sys.argv[1]), int(sys.argv[2])
uvicorn.run(plain_app(DecisionService(settings)), host="127.0.0.1", port=port, log_level="warning")
"""


@contextmanager
def uvicorn_server(settings_json: str) -> Iterator[dict[str, str]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", UVICORN_MAIN, settings_json, str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        yield {"http": url}
    finally:
        _stop(proc)


@contextmanager
def serve_server(config: Path, ckpt: Path, mode: str, log: Path,
                 replicas: int = 1, noop: bool = False) -> Iterator[dict[str, str]]:
    """``dl2ray serve --mode MODE --replicas R`` with gRPC, in its own process (its own Ray); its HTTP and
    gRPC URLs as the app announces them: the replica's own with direct ingress, HAProxy's, or the proxies'.
    ``noop``: the same app answering every request with one fixed allocation (``ServeSettings.noop``)."""
    port = free_port_block()
    cmd = [sys.executable, "-m", "dl2ray", "serve", "--config", str(config),
           "--checkpoint", str(ckpt), "--port", str(port), "--grpc-port", str(port + DIRECT_SPAN - 24),
           "--mode", mode, "--replicas", str(replicas), *(["--noop"] if noop else [])]
    env = {**os.environ, "RAY_ADDRESS": ""}  # always a Ray of its own, with this mode's options
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc)
        urls = _announced(log, proc)
        yield {"http": urls["http"][0], "grpc": urls["grpc"][0], "proxy": f"http://127.0.0.1:{port}"}
    finally:
        _stop(proc)


def _announced(log: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> dict[str, list[str]]:
    """The URLs ``dl2ray serve`` prints once the app runs (``the application answers at {...}``)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for line in log.read_text().splitlines():
            if line.startswith("the application answers at "):
                urls = json.loads(line.removeprefix("the application answers at "))
                if urls.get("http") and urls.get("grpc"):
                    return urls
        if proc.poll() is not None:
            raise RuntimeError(f"dl2ray serve exited with {proc.returncode}; see {log}")
        time.sleep(0.3)
    raise RuntimeError(f"dl2ray serve announced no URLs; see {log}")


# -- in-process ------------------------------------------------------------------------------------


def in_process(cfg, ckpt: Path, body: bytes, proto: bytes, repeats: int = 300) -> dict:
    """The decision alone, and the handler's steps without a network (the servers' exact code path)."""
    from serve.app import DecisionService
    from serve.grpc.messages import request_from_proto
    from serve.proto import decide_pb2
    from serve.schemas import DecideRequest

    service = DecisionService({"config": cfg, "checkpoint": str(ckpt), "reload_every_s": 0})
    steps: dict[str, list[float]] = {k: [] for k in ("parse", "decide_and_convert", "respond", "handler",
                                                     "grpc_parse")}
    sched = service.store.current.scheduler
    req0 = DecideRequest.model_validate_json(body)
    decide: list[float] = []
    try:
        for k in range(repeats + 5):
            t0 = time.perf_counter()
            req = DecideRequest.model_validate_json(body)
            t1 = time.perf_counter()
            resp = service.decide_now(req)
            t2 = time.perf_counter()
            resp.model_dump_json()
            t3 = time.perf_counter()
            request_from_proto(decide_pb2.DecideRequest.FromString(proto))
            t4 = time.perf_counter()
            if k >= 5:  # the first runs load the compiled loop and warm caches
                for name, dt in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t3 - t0, t4 - t3), strict=True):
                    steps[name].append(dt)
                decide.append(resp.decision_ms / 1e3)
        view_t = []
        from serve.convert import to_view

        for _ in range(repeats):
            t0 = time.perf_counter()
            v = to_view(req0.view, service.cfg.catalogue, service.cfg.cluster.default_placement,
                        service.max_jobs)
            view_t.append(time.perf_counter() - t0)
        del v, sched
    finally:
        service.close()
    p50 = {"parse": _ms(steps["parse"])["p50_ms"], "convert": _ms(view_t)["p50_ms"],
           "decide": _ms(decide)["p50_ms"], "respond": _ms(steps["respond"])["p50_ms"],
           "grpc_parse_and_validate": _ms(steps["grpc_parse"])["p50_ms"]}
    return {"decide": _ms(decide), "handler": _ms(steps["handler"]), "handler_steps_p50_ms": p50,
            "body_bytes": len(body), "proto_bytes": len(proto), "repeats": repeats}


# -- one run ---------------------------------------------------------------------------------------


def run(config: Path, ckpt: Path, rps: float, seconds: float, jobs: int, probe_s: float, seed: int,
        modes: list[tuple[str, int]], grpc_modes: list[str], factor: float = 3.0, bound_ms: float = 25.0,
        plot: Path | None = None, log_dir: Path | None = None, noop: bool = True,
        uvicorn: bool = True) -> dict:
    """One run (module docstring); ``noop``: after each Serve mode, its no-op floor
    (``serve-MODE-noop``: the same mode, replicas and load generator, every request parsed and answered
    with a fixed allocation) and the endpoint's ratios to it (``floor``)."""
    from dl2ray.cli.bench import busy_view
    from dl2ray.config import load_config
    from serve.app import ServeSettings
    from serve.client import ServeScheduler
    from serve.grpc.messages import request_to_proto

    cfg = load_config(config)
    view = busy_view(cfg, jobs, seed)
    client = ServeScheduler("http://unused")
    body = client.body(view)
    proto = request_to_proto(client.request(view)).SerializeToString()
    work = Path(tempfile.mkdtemp(prefix="dl2ray-bench-serve-"))
    log_dir = log_dir or work
    (work / "body.json").write_bytes(body)
    (work / "body.pb").write_bytes(proto)
    settings = ServeSettings(config=str(config.resolve()), checkpoint=str(ckpt.resolve()), reload_every_s=2.0,
                             overload_bound_ms=bound_ms)
    doc: dict = {"bench": "serve", "config": cfg.name, "jobs": jobs, "nodes": view.num_nodes,
                 "checkpoint": str(ckpt), "rps": rps, "seconds": seconds, "probe_seconds": probe_s,
                 "overload_factor": factor, "overload_bound_ms": bound_ms, "cores": os.cpu_count(),
                 "nice": os.nice(0), "load_avg_at_start": load_average(),
                 "in_process": in_process(str(config.resolve()), ckpt, body, proto), "servers": {}}

    def measured(name: str, url: str, body_file: Path, application: str | None = None) -> None:
        doc["servers"][name] = {"url": url, **measure(url, body_file, rps, seconds, probe_s, factor, bound_ms,
                                                      application)}
        print(f"bench serve: {name}: {json.dumps(summary_row(doc['servers'][name]))}", file=sys.stderr)

    if uvicorn:
        with uvicorn_server(settings.model_dump_json()) as urls:
            measured("uvicorn", urls["http"], work / "body.json")
            doc["servers"]["uvicorn"]["up_after"] = _healthy(urls["http"])
    for mode, replicas in modes:
        base = f"serve-{mode}" + (f"-x{replicas}" if replicas > 1 else "")
        for floor in (False, True) if noop else (False,):
            server = f"{base}-noop" if floor else base
            with serve_server(config, ckpt, mode, log_dir / f"{server}.log", replicas, floor) as urls:
                measured(server, urls["http"], work / "body.json")
                if mode in grpc_modes and not floor:
                    measured(f"{server}-grpc", urls["grpc"], work / "body.pb", application="dl2ray")
                for name in (server, f"{server}-grpc"):
                    if name in doc["servers"]:
                        doc["servers"][name]["up_after"] = _healthy(urls["proxy"]) and _healthy(urls["http"])
    doc["load_avg_at_end"] = load_average()
    doc["targets"] = {"p99_ms_at_100rps": 10.0, "max_rps_p99_under_50ms": 200.0,
                      "p99_over_noop_p99": 1.5, "max_rps_over_noop_max_rps": 0.8}
    doc["summary"] = {name: summary_row(s) for name, s in doc["servers"].items()}
    doc["floor"] = floor_ratios(doc["summary"])
    if plot is not None:
        plot_latency(doc, plot)
        doc["plot"] = str(plot)
    return doc


def floor_ratios(summary: dict[str, dict]) -> dict[str, dict]:
    """Each Serve server's p50, p99 and highest good rate over its no-op floor's (``NAME-noop``)."""
    out = {}
    for name, row in summary.items():
        floor = summary.get(f"{name}-noop")
        if floor is None:
            continue
        ratio = {}
        for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_rps_p99_under_50ms", "max_rps")):
            a, b = row.get(key), floor.get(key)
            ratio[f"{label}_over_noop"] = round(a / b, 3) if a is not None and b else None
        out[name] = {"noop": f"{name}-noop", **ratio}
    return out


def summary_row(s: dict) -> dict:
    f, o = s["fixed_rate"], s["overload"]
    return {"p50_ms": f["latency_ok"]["p50_ms"], "p99_ms": f["latency_ok"]["p99_ms"], "ok": f["ok"],
            "requests": f["requests"], "achieved_rps": f["achieved_rps"],
            "max_rps_p99_under_50ms": s["max_rate"]["max_rps_p99_under_50ms"],
            "overload_rps": o["rate"], "overload_statuses": o["statuses"],
            "overload_latest_answer_ms": o["latest_answer_ms"], "overload_p99_ms": o["latency_all"]["p99_ms"],
            "other_5xx": o["other_5xx"], "up_after": s.get("up_after")}


def plot_latency(doc: dict, path: Path) -> None:
    """p50 and p99 of the answers against the offered rate, one line per server (log latency axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for k, (name, s) in enumerate(doc["servers"].items()):
        runs = sorted([s["fixed_rate"], *s["max_rate"]["probes"], s["overload"]], key=lambda r: r["rate"])
        rates = [r["rate"] for r in runs]
        color = f"C{k}"
        ax.plot(rates, [r["latency_all"]["p99_ms"] for r in runs], "-o", color=color, label=f"{name} p99")
        ax.plot(rates, [r["latency_all"]["p50_ms"] for r in runs], ":", color=color, label=f"{name} p50")
    ax.axhline(10, color="grey", lw=0.8, ls="--")
    ax.axhline(P99_LIMIT_MS, color="grey", lw=0.8, ls="-.")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate, requests/s (open loop)")
    ax.set_ylabel("latency of the answers (200 and 503), ms")
    ax.set_title(f"decision endpoint, {doc['jobs']} jobs × {doc['nodes']} nodes, {doc['cores']} cores, "
                 f"load {doc['load_avg_at_start'][0]}→{doc['load_avg_at_end'][0]}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
