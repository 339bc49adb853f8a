"""``dl2ray demo --live`` and the live benchmarks (``bench live-demo``, ``bench live-loop``).

The demo starts a local Ray head with token authentication (``ray start --head
--block``, stopped by pid at the end), the agent with the chosen scheduler,
submits four small jobs as Ray users do (``ray job submit --working-dir DIR --
dl2ray submit JOB.yaml``, which follows its job), samples every job's
deployment once a second, and writes a timeline plot (members per job over
time, scaling events marked) and each job's JCT. ``bench live-demo`` runs the
same under several schedulers, repeatedly, every run with the same seeded
submission times (docs/live.md, "The live comparison").
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from clusters.cli.live_bench import LIVE_CONFIG, ROOT
from clusters.runtime import ray_env
from dl2ray.errors import UserError
from dl2ray.jobspec import load_jobspec

DEMO_JOBS = ROOT / "examples" / "jobs" / "demo"


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def run_live(
    scheduler: str,
    out: Path,
    jobs: list[Path],
    slot_seconds: float,
    offsets_s: list[float],
    timeout_s: float = 900.0,
    use_job_submit: bool = True,
) -> dict[str, Any]:
    """One live run: a head with token authentication, the agent, the jobs, until all end; the run's record.

    Job ``k`` is submitted ``offsets_s[k]`` seconds after the run's start ``t0``: half a slot after the
    first slot boundary once the agent has decided one slot (its policy warmed up, the DL2 policy's
    first decision compiles its loop), so that every run sees the arrivals at the same times and in
    the same phase of the slots. ``use_job_submit``: each job goes as Ray users send it,
    ``ray job submit --working-dir DIR -- dl2ray submit FILE`` (the demo); else straight to the agent
    at its offset (the benchmark: no submitter process competing for the CPUs). ``submitted_s`` of
    each job in the record is when the agent registered it.
    """
    ray_env()  # before Ray's first import (below): Ray reads it then
    from clusters.ray.agent import launch_agent, teardown
    from clusters.ray.auth import child_env, create_token, use_token
    from clusters.ray.config import load_live_config
    from clusters.ray.head import start_head, stop_head
    from clusters.runtime import connected

    if len(offsets_s) != len(jobs):
        raise UserError(f"{len(jobs)} jobs but {len(offsets_s)} submission offsets")
    cfg = load_live_config(LIVE_CONFIG)
    out.mkdir(parents=True, exist_ok=True)
    cfg = cfg.with_agent(slot_seconds=slot_seconds, log_dir=str(out.resolve()))
    spec = cfg.scheduler_spec(scheduler)
    token = create_token(out / "auth_token")
    head = start_head(cfg.live.ray.num_cpus, cfg.live.ray.dashboard_port, out / "ray.log", token)
    use_token(token)
    samples: list[dict[str, Any]] = []
    submitters: list[subprocess.Popen] = []
    try:
        with connected(head["address"]) as ray:
            epoch = time.time()
            agent = launch_agent(cfg, spec, cfg.live.shadow, epoch=epoch)
            while ray.get(agent.status.remote())["slots_done"] < 1:
                time.sleep(0.2)
            t0 = epoch + (math.floor((time.time() - epoch) / slot_seconds) + 1.5) * slot_seconds
            replies = []
            for job, at in sorted(zip(jobs, offsets_s, strict=True), key=lambda x: x[1]):
                samples += _sample_until(ray, agent, t0, t0 + at)
                if use_job_submit:
                    submitters.append(_ray_job_submit(job, head["dashboard"], out, child_env(token)))
                else:  # not waiting for the reply: it comes once the job's host actor started (seconds)
                    replies.append((job, agent.submit.remote(load_jobspec(job).model_dump(mode="json"))))
            for job, ref in replies:
                res = ray.get(ref)
                if not res["ok"]:
                    raise UserError(f"{job}: {res['error']}")
            names = [_job_name(j) for j in jobs]
            samples += _sample_until_done(ray, agent, t0, len(names), time.time() + timeout_s)
            final = ray.get(agent.jobs.remote())
            status = ray.get(agent.status.remote())
            entry = _entrypoint_states(head["dashboard"], out, jobs, token) if use_job_submit else {}
            teardown(cfg.live.agent_name, cfg.live.learn.global_policy)
    finally:
        for p in submitters:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        stop_head(head["pid"])
    rec = _record(spec, final, status, samples, t0, entry)
    offset_of = dict(zip(names, offsets_s, strict=True))
    for j in rec["jobs"]:
        j["offset_s"] = offset_of.get(j["job"])
    return rec


def _ray_job_submit(job: Path, dashboard: str, out: Path, env: dict[str, str]) -> subprocess.Popen:
    """``ray job submit --working-dir DIR -- dl2ray submit FILE`` (a folder holding only the spec, a
    relative path, the ``dl2ray`` on the head's ``PATH``), without waiting; its output in ``out``."""
    folder = out / "submit" / job.stem
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(job, folder / job.name)
    cmd = [_bin("ray"), "job", "submit", "--address", dashboard, "--working-dir", str(folder), "--no-wait",
           "--", "dl2ray", "submit", job.name]
    log = open(out / f"submit-{job.stem}.log", "wb")  # noqa: SIM115 (closed with the process)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    finally:
        log.close()


def _job_name(path: Path) -> str:
    from dl2ray.jobspec import load_jobspec

    return load_jobspec(path).name


def _sample_until(ray, agent, t0: float, until: float) -> list[dict[str, Any]]:
    """Samples (once a second from ``t0`` on) until the time ``until``."""
    samples: list[dict[str, Any]] = []
    while time.time() < until:
        if time.time() >= t0:
            samples += _sample(ray, agent, t0)
        time.sleep(max(min(1.0, until - time.time()), 0.0))
    return samples


def _sample_until_done(ray, agent, t0: float, n: int, deadline: float) -> list[dict[str, Any]]:
    """Samples once a second until all ``n`` jobs ended (or the ``deadline`` passed)."""
    samples: list[dict[str, Any]] = []
    while time.time() < deadline:
        now = _sample(ray, agent, t0)
        samples += now
        if len(now) == n and all(s["state"] in ("finished", "failed", "cancelled") for s in now):
            break
        time.sleep(1.0)
    return samples


def _sample(ray, agent, t0: float) -> list[dict[str, Any]]:
    now = time.time() - t0
    return [
        {
            "t": round(now, 2),
            "job": s["name"],
            "state": s["state"],
            "ps": s["ps"],
            "workers": s["workers"],
            "epochs": s["epochs_done"],
            "events": len(s["events"]),
        }
        for s in ray.get(agent.jobs.remote())
    ]


def _entrypoint_states(
    dashboard: str, out: Path, jobs: list[Path], token: Path, wait_s: float = 60.0
) -> dict[str, str]:
    """The Ray job status of each ``ray job submit`` entrypoint (``dl2ray submit``, which exits 0 only
    when its job finished): SUCCEEDED, FAILED, ... (waits up to ``wait_s`` for them to end)."""
    import re

    from ray.job_submission import JobSubmissionClient

    from clusters.ray.auth import auth_headers

    client = JobSubmissionClient(dashboard, headers=auth_headers(token))
    ids = {}
    for j in jobs:
        m = re.search(
            r"Job '(raysubmit_\w+)' submitted successfully",
            (out / f"submit-{j.stem}.log").read_text(errors="replace"),
        )
        ids[j.stem] = m.group(1) if m else None
    deadline = time.time() + wait_s
    res: dict[str, str] = {}
    while True:
        res = {
            k: str(client.get_job_status(v)).split(".")[-1] if v else "NOT SUBMITTED" for k, v in ids.items()
        }
        if time.time() > deadline or all(v not in ("PENDING", "RUNNING") for v in res.values()):
            return res
        time.sleep(1.0)


def _record(
    spec: str, final: list[dict], status: dict, samples: list[dict], t0: float, entry: dict[str, str]
) -> dict[str, Any]:
    jobs = []
    for st in final:
        susp = [max(e["suspension_ms"].values()) for e in st["events"] if e["suspension_ms"]]
        jobs.append(
            {
                "job": st["name"],
                "state": st["state"],
                "jct_s": round((st["finished_at"] or time.time()) - st["submitted_at"], 2),
                "submitted_s": round(st["submitted_at"] - t0, 2),
                "scaling_events": len(st["events"]) - 1,  # the first is the start
                "suspension_ms_median": round(float(np.median(susp)), 2) if susp else None,
                "suspension_ms_max": round(float(np.max(susp)), 2) if susp else None,
                "events": [
                    {"change": e["change"], "iteration": e["clock"], "suspension_ms": e["suspension_ms"]}
                    for e in st["events"]
                ],
            }
        )
    jcts = [j["jct_s"] for j in jobs if j["state"] == "finished"]
    return {
        "scheduler": spec,
        "jobs": jobs,
        "avg_jct_s": round(float(np.mean(jcts)), 2) if jcts else None,
        "finished": len(jcts),
        "agent": status,
        "entrypoints": entry,
        "timeline": samples,
    }


def plot_timeline(record: dict[str, Any], path: Path) -> None:
    """Members (PS + workers) per job over time; a marker at every change of deployment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    names = sorted({s["job"] for s in record["timeline"]})
    for k, name in enumerate(names):
        pts = [s for s in record["timeline"] if s["job"] == name and s["state"] in ("running", "paused")]
        if not pts:
            continue
        t = [p["t"] for p in pts]
        w = [p["workers"] + 0.04 * k for p in pts]
        (line,) = ax.step(t, w, where="post", label=f"{name} workers")
        ax.step(
            t,
            [p["ps"] - 0.04 * k for p in pts],
            where="post",
            linestyle=":",
            color=line.get_color(),
            label=f"{name} PS",
        )
        changes = [
            p for a, p in itertools.pairwise(pts) if (a["ps"], a["workers"]) != (p["ps"], p["workers"])
        ]
        ax.plot(
            [p["t"] for p in changes], [p["workers"] + 0.04 * k for p in changes], "o", color=line.get_color()
        )
    ax.set_xlabel("seconds since the first submission")
    ax.set_ylabel("tasks")
    ax.set_title(f"live cluster, scheduler {record['scheduler'].split('/')[-1]}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def demo_jobs() -> list[Path]:
    jobs = sorted(DEMO_JOBS.glob("*.yaml"))
    if len(jobs) != 4:
        raise UserError(f"{DEMO_JOBS}: expected the four demo job specs")
    return jobs


def demo_live(out: Path, model: Path, slot_seconds: float = 5.0, stagger_s: float = 10.0) -> None:
    """``dl2ray demo --live``: the shipped DL2 policy on four real jobs (module docstring)."""
    ray_env()  # before Ray's first import: Ray reads it then
    if not model.is_file():
        raise UserError(f"--model: {model}: no such checkpoint")
    jobs = demo_jobs()
    offsets = [k * stagger_s for k in range(len(jobs))]
    rec = run_live(f"dl2:{model.resolve()}", out / "live", jobs, slot_seconds, offsets)
    (out / "live" / "run.json").write_text(json.dumps(rec, indent=1) + "\n")
    plot_timeline(rec, out / "live" / "timeline.png")
    _print(rec)
    print(f"timeline: {out / 'live' / 'timeline.png'}; record: {out / 'live' / 'run.json'}")


def _print(rec: dict[str, Any]) -> None:
    print(
        f"scheduler {rec['scheduler']}: {rec['finished']} of {len(rec['jobs'])} jobs finished, "
        f"average JCT {rec['avg_jct_s']} s; guardrail fallbacks {rec['agent']['guardrail_fallbacks']}"
    )
    for j in rec["jobs"]:
        print(
            f"  {j['job']}: {j['state']}, JCT {j['jct_s']} s, {j['scaling_events']} scaling events, "
            f"worker suspension median {j['suspension_ms_median']} ms (max {j['suspension_ms_max']} ms)"
        )


def bench_live_demo(
    schedulers: Annotated[
        str, typer.Option(help="comma-separated schedulers, each on the same submissions")
    ] = ("dl2:models/dl2-testbed.pt,drf"),
    out: Annotated[Path, typer.Option(help="output folder (one subfolder per run)")] = Path("runs/live-demo"),
    jobs: Annotated[
        Path, typer.Option(help="folder of job specs (*.yaml), submitted in name order")
    ] = DEMO_JOBS,
    slot_seconds: Annotated[float, typer.Option(min=0.5)] = 5.0,
    stagger: Annotated[
        float, typer.Option(min=0.0, help="mean seconds between submissions (exponential gaps)")
    ] = 10.0,
    seed: Annotated[int, typer.Option(help="seed of the submission times")] = 0,
    repeats: Annotated[int, typer.Option(min=1, help="runs per scheduler")] = 3,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The same submissions (seeded times from each run's start) under each scheduler, ``repeats`` runs
    each, interleaved: per-run and per-job JCTs, and each scheduler's mean and spread."""
    from clusters.cli.live_bench import arrival_schedule, jct_summary

    ray_env()  # before Ray's first import: Ray reads it then
    names = [x.strip() for x in schedulers.split(",") if x.strip()]
    if not names:
        raise UserError("--schedulers: give at least one scheduler")
    files = sorted(jobs.glob("*.yaml")) if jobs.is_dir() else []
    if not files:
        raise UserError(f"--jobs: {jobs}: no job specs (*.yaml)")
    for f in files:
        load_jobspec(f)  # a bad spec exits 2 here, before any head starts
    from clusters.ray.config import load_live_config
    from dl2ray.schedulers.base import make_scheduler

    cfg = load_live_config(LIVE_CONFIG)
    for s in names:
        make_scheduler(cfg.scheduler_spec(s), cfg.experiment())  # a bad scheduler too
    offsets = arrival_schedule(len(files), stagger, seed)
    runs = []
    for r in range(repeats):
        for k, s in enumerate(names):
            folder = out / f"r{r}-{k}-{s.split(':')[0]}"
            rec = run_live(s, folder, files, slot_seconds, offsets, use_job_submit=False)
            plot_timeline(rec, folder / "timeline.png")
            (folder / "run.json").write_text(json.dumps(rec, indent=1) + "\n")
            rec.pop("timeline")
            rec["repeat"] = r
            runs.append(rec)
            if not json_out:
                _print(rec)
    schedule = {"seed": seed, "mean_gap_s": stagger, "offsets_s": offsets, "jobs": [f.name for f in files]}
    summary = jct_summary(runs)
    doc = {
        "slot_seconds": slot_seconds,
        "schedule": schedule,
        "repeats": repeats,
        "summary": summary,
        "runs": runs,
    }
    (out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")
    if json_out:
        print(json.dumps(doc))
    else:
        for sched, row in summary.items():
            print(f"{sched}: {row}")


def bench_live(
    jobs: Annotated[
        list[int] | None, typer.Option("--jobs", help="running-job counts, e.g. --jobs 4 --jobs 16")
    ] = None,
    scheduler: Annotated[
        str, typer.Option(help="scheduler (make_scheduler name)")
    ] = "dl2:models/dl2-testbed.pt",
    slots: Annotated[int, typer.Option(min=3, help="measured slots per job count")] = 20,
    slot_seconds: Annotated[float, typer.Option(min=0.5)] = 2.0,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Control-loop overhead per slot (view + decide + apply) with N running jobs: median and p99 (ms)."""
    from clusters.cli.live_bench import loop_overhead

    counts = jobs or [4, 16]
    doc = loop_overhead(counts, scheduler, slots, slot_seconds)
    if json_out:
        print(json.dumps(doc))
    else:
        for r in doc["results"]:
            print(r)
