"""What the machine gives for the agents' work: the same pushes computed in N plain processes, no Ray.

``dl2ray bench a3c --plain`` puts one such row beside each Ray row. Process ``i`` builds the
:class:`~clusters.a3c.local.LocalLearner` that agent ``i`` of an N-agent run builds (the same
traces, random streams and twin salt), takes the same starting weights, computes one unmeasured
push (imports, first traces), waits until every process has, and then computes pushes for
``seconds``, keeping its own improvement in place of a master's reply (there is no master: nothing
is sent anywhere). The Ray row over this row is what the actors, the GlobalPolicy, the driver and
Ray's daemons cost; this row's own scaling from 1 to N processes is the machine's (cores, caches,
memory bandwidth) for this work.

Each process runs with ``OMP_NUM_THREADS=1`` and ``threads`` torch threads, as a Ray actor with one
CPU does (Ray sets ``OMP_NUM_THREADS`` to the actor's CPUs).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from clusters.a3c.local import LocalSettings
from dl2ray.config import ExperimentConfig


@dataclass(frozen=True)
class PlainJob:
    """What process ``agent_id`` computes: agent ``agent_id``'s learner, for ``seconds`` after one push."""

    cfg: ExperimentConfig
    init: str | None
    seed: int
    agent_id: int
    traces: list[int]
    settings: LocalSettings
    threads: int
    seconds: float


def plain_row(jobs: list[PlainJob], timeout_s: float) -> dict[str, Any]:
    """Run ``jobs`` in as many spawned processes at once; the row (``mode`` ``plain``) of ``bench a3c``.

    ``slots_per_s`` = all processes' slots / their measured wall time (averaged), as for the Ray rows.
    Raises RuntimeError naming the process when one fails or none reports within ``timeout_s``.
    """
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(len(jobs))
    results: Any = ctx.Queue()
    with _env(OMP_NUM_THREADS="1"):
        procs = [ctx.Process(target=_run, args=(job, start, results), daemon=True) for job in jobs]
        for p in procs:
            p.start()
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < len(jobs):
            try:
                agent, rep = results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in reports]
                if dead:
                    code = procs[dead[0]].exitcode
                    raise RuntimeError(f"plain process {dead[0]} exited with code {code}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"plain processes: no report within {timeout_s:.0f} s") from None
                continue
            if "error" in rep:
                raise RuntimeError(f"plain process {agent}: {rep['error']}")
            reports[agent] = rep
    finally:
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.terminate()
    reps = list(reports.values())
    wall = sum(r["seconds"] for r in reps) / len(reps)
    slots = sum(r["slots"] for r in reps)
    return {"agents": len(jobs), "mode": "plain", "slots": slots, "steps": sum(r["steps"] for r in reps),
            "updates": sum(r["pushes"] for r in reps), "seconds": round(wall, 3),
            "slots_per_s": round(slots / wall, 2), "load_avg": round(min(r["load"] for r in reps), 2)}


def _run(job: PlainJob, start: Any, results: Any) -> None:
    """One process: build, one unmeasured push, wait for the others, then push for ``job.seconds``."""
    try:
        import torch

        from clusters.a3c.local import local_learner
        from clusters.a3c.weights import networks, params_vector

        torch.set_num_threads(job.threads)
        policy, value = networks(job.cfg, job.init, job.seed)
        learner = local_learner(job.cfg, job.traces, job.seed, [job.agent_id, 0], job.settings,
                                salt=job.agent_id)
        learner.take(params_vector(policy, value))
        learner.compute(0)
        start.wait()
        load = os.getloadavg()[0]
        t0, slots, steps, pushes = time.perf_counter(), 0, 0, 0
        while pushes == 0 or time.perf_counter() - t0 < job.seconds:
            push = learner.compute(pushes + 1)
            slots, steps, pushes = slots + push.slots, steps + push.steps, pushes + 1
        results.put((job.agent_id, {"slots": slots, "steps": steps, "pushes": pushes, "load": load,
                                    "seconds": time.perf_counter() - t0}))
    except Exception as exc:  # reported to the parent, which raises it with the process named
        start.abort()
        results.put((job.agent_id, {"error": f"{type(exc).__name__}: {exc}"}))


@contextmanager
def _env(**values: str):  # type: ignore[no-untyped-def]
    """``os.environ`` with ``values`` set while the processes start (a spawned child copies it)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

