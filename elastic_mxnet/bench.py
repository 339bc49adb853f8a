"""Benchmark: worker suspension of hot scaling vs. checkpoint-restart interruption.

    python -m elastic_mxnet.bench --json [--sizes 1000000,25000000] [--events 5]
                                  [--baseline-events 2]

For each model size (an MLP with two hidden layers sized to the parameter
count), a hot-scaling job (1 PS, 2 workers, training until stopped) goes
through ``--events`` cycles of ``add_ps`` (1->2 PS), ``remove_ps`` (2->1),
``add_worker`` (2->3 workers) and ``remove_worker`` (3->2). For every event
the suspension is the largest over the continuing workers of the time from
reaching the scaling clock to starting the next iteration (measured by the
workers, reported to the coordinator). Extra workers are started up front as
standby members, so process start-up is not part of any event (as with a
scheduler that starts the pod, then scales).

The baseline does the same cycle ``--baseline-events`` times with MXNet's
``dist_sync`` kvstore by checkpoint, kill, relaunch, reload
(:mod:`elastic_mxnet.baseline`). Progress goes to stderr; with ``--json``
stdout is exactly one JSON object::

    {"results": [{"params": 1000000, "change": "add_ps", "hot_ms": ...,
                  "checkpoint_restart_ms": ..., "events": 5, ...}, ...], ...}

``hot_ms`` and ``checkpoint_restart_ms`` are medians (ms).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from elastic_mxnet.baseline import Segment, interruptions_ms
from elastic_mxnet.coordination.spawner import COORDINATOR_ENV
from elastic_mxnet.job import ElasticJob

CYCLE = [
    ("add_ps", {"ps": 2}),
    ("remove_ps", {"ps": 1}),
    ("add_worker", {"workers": 3}),
    ("remove_worker", {"workers": 2}),
]
BASELINE_CYCLE = [Segment(2, 2), Segment(1, 2), Segment(1, 3), Segment(1, 2)]
CONTINUING_WORKERS = 2
"""Workers present before and after every change of the cycle (each reports its suspension)."""
REPORTED = ["add_ps", "remove_ps", "add_worker", "remove_worker"]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _worker_cmd(params: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "elastic_mxnet.demo_train",
        "--model",
        "mlp-params",
        "--params",
        str(params),
        "--iterations",
        "0",
        "--global-batch",
        "32",
        "--samples",
        "256",
    ]


class _HotJob:
    """A launched job plus the standby workers this benchmark started; killed on exit."""

    def __init__(self, params: int, standby: int, workdir: Path) -> None:
        addr_file = workdir / "coordinator.addr"
        self.procs: list[subprocess.Popen] = []
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "elastic_mxnet.launch",
                    "--ps",
                    "1",
                    "--workers",
                    "2",
                    "--address-file",
                    str(addr_file),
                    "--",
                    *_worker_cmd(params),
                ],
                start_new_session=True,
                stdout=sys.stderr,
            )
        )
        while not addr_file.exists():
            if self.procs[0].poll() is not None:
                raise RuntimeError("launcher exited")
            time.sleep(0.05)
        self.address = addr_file.read_text()
        env = {**os.environ, COORDINATOR_ENV: self.address}
        for _ in range(standby):
            self.procs.append(
                subprocess.Popen(
                    _worker_cmd(params), env=env, start_new_session=True, stdout=sys.stderr
                )
            )
        self.job = ElasticJob(self.address, timeout_s=300)

    def close(self) -> None:
        self.job.close()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def hot_events(
    params: int, events: int, workdir: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per change: suspension (ms, max over continuing workers) and plan duration of every event.

    The plan duration (ms) runs from Prepare to Resume at the coordinator; most
    of it passes while the workers still train towards the clock.
    """
    out: dict[str, list[float]] = {name: [] for name, _ in CYCLE}
    plan_ms: dict[str, list[float]] = {name: [] for name, _ in CYCLE}
    job = _HotJob(params, events, workdir)
    try:
        _wait(
            job.job,
            lambda st: (
                st.state == "running"
                and st.version >= 3
                and sum(m.state == "standby" for m in st.members) >= events
            ),
            "job start",
        )
        for cycle in range(events):
            for name, target in CYCLE:
                reply = job.job.scale(**target)
                st = _wait(
                    job.job,
                    lambda st, pid=reply.plan_id: _suspensions(st, pid) >= CONTINUING_WORKERS,
                    f"suspension reports of plan {reply.plan_id}",
                )
                event = next(e for e in st.events if e.plan_id == reply.plan_id)
                out[name].append(max(event.suspension_ms.values()))
                plan_ms[name].append(event.duration_ms)
                log(
                    f"{params} params, cycle {cycle}: {name} suspended workers "
                    f"{out[name][-1]:.1f} ms (clock {event.clock}, plan {event.duration_ms:.0f} ms)"
                )
        job.job.stop()
    finally:
        job.close()
    return out, plan_ms


def _suspensions(st, plan_id: int) -> int:
    return next((len(e.suspension_ms) for e in st.events if e.plan_id == plan_id), 0)


def _wait(job: ElasticJob, predicate, what: str, timeout_s: float = 600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = job.status(timeout_s=30)
        if predicate(st):
            return st
        time.sleep(0.05)
    raise TimeoutError(f"benchmark timed out waiting for {what}")


def baseline_events(params: int, events: int, workdir: Path) -> dict[str, list[float]]:
    """Checkpoint-restart interruption (ms) per change over ``events`` cycles."""
    segments = [Segment(1, 2)] + BASELINE_CYCLE * events
    log(f"{params} params: checkpoint-restart baseline, {len(segments)} dist_sync launches")
    gaps = interruptions_ms(segments, params, workdir)
    out: dict[str, list[float]] = {name: [] for name in REPORTED}
    for i, gap in enumerate(gaps):
        out[REPORTED[i % len(REPORTED)]].append(gap)
        log(f"{params} params: {REPORTED[i % len(REPORTED)]} checkpoint-restart {gap:.0f} ms")
    return out


def run(sizes: list[int], events: int, baseline: int) -> dict:
    """All measurements; the JSON document printed by ``--json``."""
    from elastic_mxnet.training import models

    rows = []
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        for size in sizes:
            actual = models.num_params(models.build("mlp-params", size))
            work = Path(tmp) / str(size)
            work.mkdir()
            hot, plan_ms = hot_events(size, events, work)
            cold = baseline_events(size, baseline, work) if baseline else {}
            for name in REPORTED:
                hot_ms = statistics.median(hot[name])
                cr = statistics.median(cold[name]) if cold.get(name) else None
                rows.append(
                    {
                        "params": size,
                        "actual_params": actual,
                        "change": name,
                        "hot_ms": round(hot_ms, 3),
                        "checkpoint_restart_ms": None if cr is None else round(cr, 1),
                        "events": len(hot[name]),
                        "baseline_events": len(cold.get(name, [])),
                        "hot_max_ms": round(max(hot[name]), 3),
                        "plan_ms": round(statistics.median(plan_ms[name]), 1),
                        "speedup": None if cr is None else round(cr / max(hot_ms, 1e-3), 1),
                    }
                )
    return {"results": rows, "machine": {"cpus": os.cpu_count()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m elastic_mxnet.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--sizes", default="1000000,25000000", help="comma-separated parameter counts")
    p.add_argument("--events", type=int, default=5, help="hot-scaling cycles (events per change)")
    p.add_argument(
        "--baseline-events", type=int, default=2, help="checkpoint-restart cycles (0: skip)"
    )
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1000 or args.events < 1 or args.baseline_events < 0:
        p.error("--sizes >= 1000 each, --events >= 1, --baseline-events >= 0")
    result = run(sizes, args.events, args.baseline_events)
    if args.json:
        print(json.dumps(result))
    else:
        for row in result["results"]:
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
