"""The live cluster's benchmarks: the control-loop overhead of the agent (``bench live``: view + decide +
apply per slot, for N running jobs), the scaling latency with and without warm members (``bench
live-scale``), a queue's reclaim on a shared cluster (``bench live-reclaim``: seconds from a job's arrival in
its queue to the borrower scaled back to its quota and the new job training), and the arithmetic of
``bench live-demo`` (the seeded submission times every scheduler gets, the JCT summary over repeated runs).

A local Ray instance (logical CPUs enough for every member), the agent actor
with the chosen scheduler, N tiny jobs capped at 1 PS + 1 worker (so that the
steady state has every job running and no member to start), then the agent's
own per-slot timings over ``slots`` slots, with the view's parts (nodes, host listing, reading the jobs)
and how many jobs' readings were in time (``readings``). Members sleep most of the time
(``sample_delay_s``), so the measured loop competes with little training work.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from clusters.runtime import ray_env
from dl2ray.jobspec import parse_jobspec

ROOT = Path(__file__).resolve().parents[2]
LIVE_CONFIG = ROOT / "configs" / "live-local.yaml"


def bench_spec(k: int) -> dict[str, Any]:
    return {
        "name": f"bench-{k}",
        "job_type": "resnext-110",
        "model": "mlp",
        "epochs": 10_000,
        "samples": 256,
        "global_batch": 32,
        "worker": {"cpu": 0.5, "gpu": 0, "mem": 0.1},
        "ps": {"cpu": 0.5, "gpu": 0, "mem": 0.1},
        "workers": {"min": 1, "max": 1},
        "ps_count": {"min": 1, "max": 1},
        "seed": k,
        "sample_delay_s": 0.02,
    }


def loop_overhead(counts: list[int], scheduler: str, slots: int, slot_seconds: float) -> dict[str, Any]:
    ray_env()
    import ray

    from clusters.ray.agent import launch_agent, teardown
    from clusters.ray.config import load_live_config

    rows = []
    for n in counts:
        cfg = load_live_config(LIVE_CONFIG)
        cfg = cfg.with_agent(slot_seconds=slot_seconds, log_dir=f"/tmp/dl2ray-bench-live-{os.getpid()}")
        ray.init(address="local", num_cpus=max(2 * n, 2), include_dashboard=False, log_to_driver=False)
        try:
            agent = launch_agent(cfg, cfg.scheduler_spec(scheduler), cfg.live.shadow)
            for k in range(n):
                res = ray.get(agent.submit.remote(parse_jobspec(bench_spec(k)).model_dump(mode="json")))
                assert res["ok"], res
            deadline = time.time() + 600
            while time.time() < deadline:  # ramp-up: every job started, nothing in flight
                jobs = ray.get(agent.jobs.remote())
                if all(j["state"] == "running" and j["workers"] == 1 and not j["busy"] for j in jobs):
                    break
                time.sleep(1.0)
            start = len(ray.get(agent.loop_timings.remote()))
            while len(ray.get(agent.loop_timings.remote())) < start + slots:
                time.sleep(slot_seconds / 2)
            timings = ray.get(agent.loop_timings.remote())[start : start + slots]
            load = os.getloadavg()[0]
            teardown(cfg.live.agent_name, cfg.live.learn.global_policy)
        finally:
            ray.shutdown()
        row: dict[str, Any] = {"jobs": n, "slots": len(timings), "load_avg": round(load, 2)}
        for key in ("view_ms", "decide_ms", "apply_ms", "total_ms"):
            row[key.replace("_ms", "")] = _ms_stats([t[key] for t in timings])
        parts = [k for k in dict.fromkeys(k for t in timings for k in t)
                 if k.startswith("view_") and k != "view_ms"]
        row["view_parts"] = {k[len("view_"):].replace("_ms", ""): _ms_stats([t[k] for t in timings if k in t])
                             for k in parts}
        row["readings"] = readings_summary(timings)
        rows.append(row)
    return {"scheduler": scheduler, "slot_seconds": slot_seconds, "cpus": os.cpu_count(), "results": rows}


def _ms_stats(vals: list[float]) -> dict[str, float]:
    return {"median_ms": round(float(np.median(vals)), 2), "p99_ms": round(float(np.percentile(vals, 99)), 2)}


def readings_summary(timings: list[dict[str, float]]) -> dict[str, Any]:
    """The jobs' readings over the measured slots (clusters/ray/readings.py): how many were pushed in time,
    late (left alone that slot), asked and waited for, asked without waiting; the fraction in time; the
    age of the pushed ones at the read (each slot's median, then their median and p99)."""
    counts = {k: int(sum(t.get(f"readings_{k}", 0.0) for t in timings)) for k in ("pushed", "late", "asked",
                                                                                 "resync")}
    read = counts["pushed"] + counts["late"]
    ages = [t["reading_age_ms"] for t in timings if "reading_age_ms" in t]
    return {**counts, "in_time": round(counts["pushed"] / read, 4) if read else None,
            "age": _ms_stats(ages) if ages else None}


# ---- scaling latency: decision -> first iteration on the new plan ------------------------------------


def scale_spec() -> dict[str, Any]:
    """One tiny job that goes between 1 and 2 workers (1 PS), long enough for every trial."""
    return {**bench_spec(0), "name": "bench-scale", "epochs": 100_000, "workers": {"min": 1, "max": 2},
            "ps_count": {"min": 1, "max": 1}, "sample_delay_s": 0.005}


def _latency_stats(vals: list[float]) -> dict[str, Any]:
    if not vals:
        return {"n": 0}
    return {"n": len(vals), "median": round(float(np.median(vals)), 4),
            "p95": round(float(np.percentile(vals, 95)), 4), "max": round(float(max(vals)), 4)}


def _wait(check, timeout_s: float = 600.0, poll_s: float = 0.05):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if value := check():
            return value
        time.sleep(poll_s)
    raise TimeoutError("the benchmark's job did not get there in time")


def _change(ray: Any, be: Any, host: Any, jid: int, workers: int) -> dict[str, Any]:
    """One decision applied through the backend; seconds from the decision (``apply``) to the first
    worker's report that it started the clock iteration on the new plan (``resumed_at``)."""
    from dl2ray.view import Allocation, Tasks

    be.snapshot()
    before = ray.get(host.status.remote())
    t0 = time.time()
    report = be.apply(Allocation({jid: Tasks(workers, 1)}))
    apply_s = time.time() - t0
    assert [a.ok for a in report.actions] == [True], report

    def resumed():
        st = ray.get(host.status.remote())
        new = [e for e in st.events[len(before.events):] if e.resumed_at is not None]
        return (st, new[-1]) if new else None

    st, event = _wait(resumed, poll_s=0.02)
    return {"first_iteration_s": event.resumed_at - t0, "apply_s": apply_s,
            "suspension_ms": max(event.suspension_ms.values()),
            "warm": st.warm_taken > before.warm_taken}


def scale_latency(pools: list[int], trials: int, cpus: int) -> dict[str, Any]:
    """Per pool size (0: no pool, every member cold): ``trials`` scale-ups (1 -> 2 workers) and scale-downs
    (2 -> 1) of one running job, each timed from the decision to the first iteration on the new plan."""
    ray_env()
    import ray

    from clusters.ray.agent import teardown
    from clusters.ray.backend import RayBackend
    from clusters.ray.config import load_live_config
    from clusters.ray.pool import ensure_pool
    from dl2ray.view import Allocation, Tasks

    cfg = load_live_config(LIVE_CONFIG)
    catalogue = cfg.experiment().catalogue
    rows = []
    for per_node in pools:
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        try:
            pool = ensure_pool(per_node)
            be = RayBackend(catalogue, slot_seconds=1.0, epoch=time.time(), apply_wait_s=600.0)
            spec = parse_jobspec(scale_spec())
            jid = be.submit(spec)["job_id"]
            host = be.hosts()[spec.name]
            ups: list[dict[str, Any]] = []
            downs: list[dict[str, Any]] = []
            refill: list[float] = []
            be.snapshot()  # start with 1 PS + 1 worker (no worker continues: no first-iteration report)
            assert [a.ok for a in be.apply(Allocation({jid: Tasks(1, 1)})).actions] == [True]
            _wait(lambda: ray.get(host.status.remote()).iteration or 0)  # noqa: B023
            for _ in range(trials):
                if pool is not None:
                    t = time.time()
                    _wait(lambda: ray.get(pool.stats.remote())["idle_ready"] >= per_node)  # noqa: B023
                    refill.append(time.time() - t)
                ups.append(_change(ray, be, host, jid, 2))
                downs.append(_change(ray, be, host, jid, 1))
            pool_stats = ray.get(pool.stats.remote()) if pool is not None else None
            be.remove(spec.name)
            teardown()
        finally:
            ray.shutdown()
        rows.append({
            "pool_per_node": per_node,
            "scale_up_first_iteration_s": _latency_stats([u["first_iteration_s"] for u in ups]),
            "scale_up_warm": sum(u["warm"] for u in ups),
            "scale_down_first_iteration_s": _latency_stats([d["first_iteration_s"] for d in downs]),
            "suspension_ms": _latency_stats([x["suspension_ms"] for x in ups + downs]),
            "pool_wait_before_trial_s": _latency_stats(refill),
            "pool_member_ready_s": _latency_stats(pool_stats["ready_s"]) if pool_stats else None,
            "load_avg": round(os.getloadavg()[0], 2),
        })
    return {"trials": trials, "cpus": cpus, "results": rows}


def bench_live_scale(
    pool: Annotated[list[int] | None, typer.Option(
        "--pool", min=0, max=32, help="warm members per node, one run each (0: no pool): --pool 2 --pool 0")
    ] = None,
    trials: Annotated[int, typer.Option(min=1, max=100, help="scale-ups and scale-downs per run")] = 8,
    cpus: Annotated[int, typer.Option(min=2, max=256, help="logical CPUs of the local Ray")] = 4,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Decision -> first iteration on the new plan, for scale-up and scale-down (seconds), and the workers'
    suspension (ms), with and without warm members."""
    doc = scale_latency(pool or [2], trials, cpus)
    if json_out:
        print(json.dumps(doc))
    else:
        for r in doc["results"]:
            print(r)


# ---- reclaim on a shared cluster: a queue's job arrives, the borrower gives its quota back -------------

SHARED_CONFIG = ROOT / "configs" / "live-shared.yaml"


def reclaim_specs(trial: int, lender: str, borrower: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The borrower (queue ``borrower``) and the arriving job (queue ``lender``, whose quota the borrower
    holds), tiny and long, alike: up to 2 PS + 3 workers of 0.3 cores (1.5 cores, more than a queue's
    1-core quota, so the arrival asks for its queue's whole quota and the borrower gives back all it
    borrowed)."""
    task = {"cpu": 0.3, "gpu": 0, "mem": 0.1}
    base = {**bench_spec(trial), "epochs": 100_000, "worker": task, "ps": task, "sample_delay_s": 0.005,
            "workers": {"min": 1, "max": 3}, "ps_count": {"min": 1, "max": 2}}
    return ({**base, "name": f"borrower-{trial}", "queue": borrower},
            {**base, "name": f"arrival-{trial}", "queue": lender, "seed": trial + 1000})


def _cores(job: dict[str, Any]) -> float:
    spec = job["spec"]
    return job["ps"] * spec["ps"]["cpu"] + job["workers"] * spec["worker"]["cpu"]


def reclaim_trial(ray: Any, agent: Any, trial: int, quota_cpu: float, lender: str = "prod",
                  borrower: str = "research", timeout_s: float = 600.0) -> dict[str, Any]:
    """One reclaim on the running ``agent`` (a connected driver): the borrower runs alone until it holds
    more than its queue's ``quota_cpu`` cores, then the other queue's job is submitted (time 0). Polled
    every 0.05 s: ``quota_back_s``, when the borrower's running deployment is back within its quota (hot
    scaling: no scale operation in flight); ``arrival_training_s``, when the new job runs with a worker;
    whether the borrower kept running through it (``borrower_paused``: it was paused instead) and trained
    on (``borrower_epochs_after``: its epochs grew after the reclaim). Both jobs are cancelled at the end."""
    first, second = reclaim_specs(trial, lender, borrower)
    jobs = lambda: {j["name"]: j for j in ray.get(agent.jobs.remote())}  # noqa: E731
    assert ray.get(agent.submit.remote(first))["ok"]
    b_name, a_name = first["name"], second["name"]
    _wait(lambda: (b := jobs()[b_name])["state"] == "running" and not b["busy"]
          and _cores(b) > quota_cpu + 1e-9, timeout_s, poll_s=0.2)
    borrowed = jobs()[b_name]
    t0 = time.time()
    res = ray.get(agent.submit.remote(second))
    assert res["ok"], res
    back_s = start_s = None
    paused = False
    while back_s is None or start_s is None:
        now = jobs()
        b, a = now[b_name], now.get(a_name)
        paused |= b["state"] != "running" or b["workers"] == 0
        if back_s is None and not b["busy"] and _cores(b) <= quota_cpu + 1e-9:
            back_s, after = time.time() - t0, b
        training = a is not None and a["state"] == "running" and a["workers"] > 0 and not a["busy"]
        if start_s is None and training:
            start_s = time.time() - t0
        if time.time() - t0 > timeout_s:
            raise TimeoutError(f"reclaim trial {trial}: quota back {back_s}, arrival training {start_s}")
        time.sleep(0.05)
    epochs = after["epochs_done"]
    grew = _wait(lambda: jobs()[b_name]["epochs_done"] > epochs, timeout_s, poll_s=0.2)
    for name in (b_name, a_name):
        ray.get(agent.cancel.remote(name))
    _wait(lambda: all(j["state"] in ("cancelled", "finished", "failed") for j in jobs().values()), timeout_s)
    return {"trial": trial, "quota_back_s": round(back_s, 3), "arrival_training_s": round(start_s, 3),
            "borrowed": [borrowed["ps"], borrowed["workers"]], "after": [after["ps"], after["workers"]],
            "borrower_paused": paused, "borrower_epochs_after": bool(grew)}


def idle_start(ray: Any, agent: Any, trial: int, lender: str = "prod", timeout_s: float = 600.0) -> float:
    """The control of :func:`reclaim_trial`'s ``arrival_training_s``: seconds from submitting its arriving
    job to an idle cluster to that job training (no borrower to scale down); the job is cancelled after."""
    spec = {**reclaim_specs(trial, lender, lender)[1], "name": f"alone-{trial}"}
    t0 = time.time()
    assert ray.get(agent.submit.remote(spec))["ok"]
    _wait(lambda: (j := ray.get(agent.job.remote(spec["name"]))) is not None and j["state"] == "running"
          and j["workers"] > 0 and not j["busy"], timeout_s)
    took = time.time() - t0
    ray.get(agent.cancel.remote(spec["name"]))
    _wait(lambda: ray.get(agent.job.remote(spec["name"]))["state"] == "cancelled", timeout_s)
    return took


def reclaim_latency(trials: int, slot_seconds: float, scheduler: str) -> dict[str, Any]:
    """``trials`` reclaims on a local Ray (2 CPUs) running configs/live-shared.yaml's agent, each after one
    start of the arriving job on the idle cluster (:func:`idle_start`, the control)."""
    ray_env()
    import ray

    from clusters.ray.agent import launch_agent, teardown
    from clusters.ray.config import load_live_config

    cfg = load_live_config(SHARED_CONFIG)
    cfg = cfg.with_agent(slot_seconds=slot_seconds, log_dir=f"/tmp/dl2ray-bench-reclaim-{os.getpid()}")
    tenancy = cfg.experiment().tenancy
    assert tenancy is not None
    quota = tenancy.queue("research").nominal.cpu
    ray.init(address="local", num_cpus=cfg.live.ray.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        agent = launch_agent(cfg, cfg.scheduler_spec(scheduler), cfg.live.shadow)
        rows = []
        for k in range(trials):
            alone = idle_start(ray, agent, k)
            rows.append({**reclaim_trial(ray, agent, k, quota), "idle_start_s": round(alone, 3)})
        teardown(cfg.live.agent_name, cfg.live.learn.global_policy)
    finally:
        ray.shutdown()
    return {"config": str(SHARED_CONFIG.relative_to(ROOT)), "scheduler": scheduler,
            "slot_seconds": slot_seconds, "trials": rows,
            "quota_back_s": _latency_stats([r["quota_back_s"] for r in rows]),
            "arrival_training_s": _latency_stats([r["arrival_training_s"] for r in rows]),
            "idle_start_s": _latency_stats([r["idle_start_s"] for r in rows]),
            "borrower_paused": sum(r["borrower_paused"] for r in rows),
            "load_avg": round(os.getloadavg()[0], 2)}


def bench_live_reclaim(
    trials: Annotated[int, typer.Option(min=1, max=50, help="reclaims, one after another")] = 5,
    slot_seconds: Annotated[float, typer.Option(min=0.5, max=60, help="the agent's slot length")] = 2.0,
    scheduler: Annotated[str, typer.Option(help="the scheduler inside the queue layer")] = "drf",
) -> None:
    """A queue's quota back on a shared live cluster: seconds from its job's arrival to the borrower scaled
    down within its own quota (hot, still training) and to the new job training (JSON on stdout; what Ray
    prints goes to stderr)."""
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        doc = reclaim_latency(trials, slot_seconds, scheduler)
    print(json.dumps(doc))


def arrival_schedule(n: int, mean_gap_s: float, seed: int) -> list[float]:
    """Submission offsets of ``n`` jobs, seconds from a run's start: the first at 0, then gaps drawn
    exponential with mean ``mean_gap_s`` (Poisson arrivals) from ``numpy.random.default_rng(seed)``,
    rounded to 0.1 s. The same arguments give the same offsets, for every scheduler and every run."""
    gaps = np.random.default_rng(seed).exponential(mean_gap_s, size=max(n - 1, 0)) if mean_gap_s > 0 else \
        np.zeros(max(n - 1, 0))
    return [round(float(x), 1) for x in np.concatenate([[0.0], np.cumsum(gaps)])][:n]


def _stats(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (0 for one value), min and max, seconds."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"n": int(a.size), "mean": round(float(a.mean()), 2),
            "std": round(float(a.std(ddof=1)) if a.size > 1 else 0.0, 2),
            "min": round(float(a.min()), 2), "max": round(float(a.max()), 2)}


def jct_summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scheduler, over its runs (each a ``run_live`` record): the average JCT of a run (mean, spread,
    every run's value), each job's JCT over the runs, jobs finished, scaling events per run, and how late
    the agent registered a job after its scheduled offset (``submit_lag_s``). JCTs of finished jobs only."""
    out: dict[str, dict[str, Any]] = {}
    for sched in dict.fromkeys(r["scheduler"] for r in runs):
        mine = [r for r in runs if r["scheduler"] == sched]
        avgs = [r["avg_jct_s"] for r in mine if r["avg_jct_s"] is not None]
        jobs = [j for r in mine for j in r["jobs"]]
        per_job = {name: _stats([j["jct_s"] for j in jobs if j["job"] == name and j["state"] == "finished"])
                   for name in dict.fromkeys(j["job"] for j in jobs)}
        lags = [j["submitted_s"] - j["offset_s"] for j in jobs if j.get("offset_s") is not None]
        out[sched] = {
            "runs": len(mine),
            "finished": f"{sum(r['finished'] for r in mine)}/{len(jobs)}",
            "avg_jct_s": {**_stats(avgs), "per_run": avgs},
            "job_jct_s": per_job,
            "all_jct_s": _stats([j["jct_s"] for j in jobs if j["state"] == "finished"]),
            "scaling_events_per_run": _stats([sum(j["scaling_events"] for j in r["jobs"]) for r in mine]),
            "submit_lag_s": _stats(lags),
        }
    return out
