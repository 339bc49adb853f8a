"""The live cluster's commands: ``submit``, ``jobs``, ``cluster up|status|down|report`` (composition root).

Registered by :mod:`clusters.cli.plugin`. Only here are the Ray head process, the
agent actor, job spec files and the decision logs wired together.

Finding the cluster: ``--address`` if given; else ``RAY_ADDRESS`` (set by
``ray job submit`` for its entrypoint); else the ``cluster.json`` that
``dl2ray cluster up`` wrote into the config's ``log_dir``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from clusters.agent.queues import check_job_queue
from clusters.ray.auth import create_token, env_token_path, export_line, use_token
from clusters.ray.head import start_head, stop_head
from clusters.runtime import connected, ray_env
from dl2ray.errors import UserError
from dl2ray.jobspec import load_jobspec, parse_jobspec

if TYPE_CHECKING:
    from clusters.ray.config import LiveConfig

LIVE_CONFIG = Path("configs/live-local.yaml")
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="live cluster config")]
AddressOpt = Annotated[str | None, typer.Option(help="Ray address (default: RAY_ADDRESS, else cluster.json)")]
SubmitAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray address (default: RAY_ADDRESS, else cluster.json); http://HOST:PORT: submit through "
        "Ray's Jobs API (as `ray job submit`)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]

jobs_app = typer.Typer(no_args_is_help=True, help="Show and control the jobs the live agent runs.")
queues_app = typer.Typer(no_args_is_help=True, help="The queues of a shared live cluster (docs/tenancy.md).")
cluster_app = typer.Typer(no_args_is_help=True, help="Start, inspect and stop a live cluster and its agent.")


def register_live(plugins) -> None:
    """Add ``submit``, ``jobs``, ``queues``, ``cluster`` (top level), ``bench live`` and the ``demo --live``
    hook."""
    root = getattr(plugins, "root", None)
    if root is not None:
        root.command("submit")(submit)
        root.add_typer(jobs_app, name="jobs")
        root.add_typer(queues_app, name="queues")
        root.add_typer(cluster_app, name="cluster")
    from clusters.cli.demo import bench_live, bench_live_demo, demo_live

    plugins.groups["bench"].command("live")(bench_live)
    plugins.groups["bench"].command("live-demo")(bench_live_demo)
    from clusters.cli.live_bench import bench_live_reclaim, bench_live_scale

    plugins.groups["bench"].command("live-scale")(bench_live_scale)
    plugins.groups["bench"].command("live-reclaim")(bench_live_reclaim)
    if hasattr(plugins, "live_demo"):
        plugins.live_demo = demo_live


# ---- wiring ------------------------------------------------------------------


def _live_config(path: Path) -> LiveConfig:
    from clusters.ray.config import load_live_config

    if not path.is_file():
        raise UserError(f"--config: {path}: no such file")
    return load_live_config(path)


def _state_file(cfg) -> Path:
    return cfg.resolve(cfg.live.log_dir) / "cluster.json"


def _cluster_state(config: Path) -> dict[str, Any]:
    """What ``cluster up`` recorded in the config's ``cluster.json`` ({} if it did not)."""
    state = _state_file(_live_config(config)) if config.is_file() else None
    return json.loads(state.read_text()) if state is not None and state.is_file() else {}


def _token_of(state: dict[str, Any]) -> Path | None:
    """The token file ``cluster up`` recorded, if any (None: that head runs without token auth)."""
    path = state.get("auth", {}).get("token_path")
    return Path(path) if path else None


def _address(address: str | None, config: Path) -> str | None:
    """The Ray address to connect to; None means RAY_ADDRESS (Ray reads it itself). Also makes this process
    present the cluster's token (:mod:`clusters.ray.auth`): the one its environment names (a ``ray job
    submit`` entrypoint inherits it from the head), else the one ``cluster up`` recorded."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return None  # a connected driver (tests, scripts) is used as it is
    state = {} if env_token_path() is not None else _cluster_state(config)
    token = _token_of(state)
    if token is not None:
        use_token(token)
    if address:
        return address
    if os.environ.get("RAY_ADDRESS"):
        return None  # Ray reads RAY_ADDRESS itself
    if "address" not in state:
        state = _cluster_state(config)
    if "address" not in state:
        raise UserError("no Ray cluster: give --address, set RAY_ADDRESS, or run `dl2ray cluster up` first")
    return state["address"]


def _agent(name: str = "dl2ray-agent"):
    from clusters.ray.agent import find_agent

    return find_agent(name)


def start_agent(cfg: LiveConfig, scheduler: str | None = None, shadow: bool | None = None,
                learn: bool | None = None, epoch: float | None = None) -> Any:
    """The live agent with the config's (or the given) scheduler, shadow mode and online learning
    (``--learn``: the live A3C learner and its GlobalPolicy actor, started if none runs); the running
    agent if there is one. Needs a connected Ray driver."""
    from clusters.ray.agent import launch_agent

    live = cfg.live
    spec = cfg.scheduler_spec(scheduler)
    shadow = live.shadow if shadow is None else shadow
    if not (live.learn.enabled if learn is None else learn):
        return launch_agent(cfg, spec, shadow, epoch=epoch)
    if cfg.experiment().tenancy is not None:  # the agent refuses it too (clusters/agent/loop.py)
        raise UserError("--learn: learning on a cluster with queues (tenancy:) is not supported yet")
    from clusters.a3c.live import LearnFromLiveSlots, ensure_global_policy

    ensure_global_policy(cfg, spec)
    return launch_agent(cfg, spec, shadow, LearnFromLiveSlots(live.learn, spec), epoch)


# ---- submit ---------------------------------------------------------------------


def submit(
    job: Annotated[Path, typer.Argument(help="job spec YAML (see examples/jobs/)")],
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="follow the job to its end")] = True,
    address: SubmitAddressOpt = None,
    config: ConfigOpt = LIVE_CONFIG,
    poll: Annotated[float, typer.Option(min=0.1, help="seconds between progress polls")] = 1.0,
    k8s: Annotated[
        bool, typer.Option("--k8s", help="create a DL2Job on Kubernetes (--config: configs/k8s-cluster.yaml)")
    ] = False,
    queue: Annotated[str | None, typer.Option(
        "--queue", help="its queue on a shared cluster (default: the spec's, else the first queue)")] = None,
    priority: Annotated[str | None, typer.Option(
        "--priority", help="the job's priority class (default: the spec's, else its queue's)")] = None,
) -> None:
    """Submit a training job to the live agent; follow it (exit 0 finished, 1 failed or cancelled).
    With ``--address http://HEAD:PORT`` (the Jobs API) it goes as a Ray job whose entrypoint is
    ``dl2ray submit`` on the cluster, the same as ``ray job submit``. ``--queue``/``--priority`` set the
    spec's ``queue``/``priority`` (a queue the cluster does not have is refused, naming the known ones)."""
    if queue is not None or priority is not None:
        with_queue = _with_queue(job, queue, priority)
        try:
            submit(with_queue, follow, address, config, poll, k8s)
        finally:
            shutil.rmtree(with_queue.parent, ignore_errors=True)
        return
    if k8s:
        from clusters.cli.k8s import K8S_CONFIG, submit_k8s

        phase = submit_k8s(job, K8S_CONFIG if config == LIVE_CONFIG else config, follow, poll)
        raise typer.Exit(0 if not follow or phase == "Succeeded" else 1)
    spec = load_jobspec(job)  # a bad spec exits 2 here, naming the field, before touching Ray
    if config.is_file():  # an unknown queue or priority class too, when the config is at hand
        check_job_queue(_live_config(config).experiment().tenancy, spec)
    env_url = os.environ.get("RAY_ADDRESS", "")
    target = _address(address or (env_url if env_url.startswith(("http://", "https://")) else None), config)
    from clusters.cli.jobs_api import is_jobs_api, submit_job

    if is_jobs_api(target):
        raise typer.Exit(submit_job(job, str(target), env_token_path(), follow, poll))
    with connected(target) as ray:
        agent = _agent()
        res = ray.get(agent.submit.remote(spec.model_dump(mode="json")))
        if not res["ok"]:
            raise UserError(f"{job}: {res['error']}")
        print(
            f"submitted {spec.name} (job id {res['job']['job_id']}, type {spec.job_type}, "
            f"{spec.iterations} iterations)",
            flush=True,
        )
        if not follow:
            return
        state = _follow(ray, agent, spec.name, poll)
    raise typer.Exit(0 if state == "finished" else 1)


def _with_queue(job: Path, queue: str | None, priority: str | None) -> Path:
    """A copy of the spec file ``job`` (same name, in a new temporary folder) with its ``queue`` and
    ``priority`` set where given; the spec is checked (a bad one exits 2 naming the field)."""
    import tempfile

    import yaml

    spec = load_jobspec(job)
    changes = {k: v for k, v in (("queue", queue), ("priority", priority)) if v is not None}
    raw = parse_jobspec({**spec.model_dump(mode="json"), **changes}, f"{job} (--queue/--priority)")
    out = Path(tempfile.mkdtemp(prefix="dl2ray-queue-")) / job.name
    out.write_text(yaml.safe_dump(raw.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    return out


def _job_status(ray, agent, name: str, patience_s: float = 120.0) -> dict[str, Any] | None:
    """The job's status from the agent, waiting out an agent restart (Ray brings it back)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return ray.get(agent.job.remote(name), timeout=60)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise UserError("the agent did not answer for 2 minutes") from None
            time.sleep(1.0)


def _follow(ray, agent, name: str, poll: float) -> str:
    last: tuple = ()
    seen_events = 0
    while True:
        st = _job_status(ray, agent, name)
        if st is None:
            print(f"{name}: the job disappeared", flush=True)
            return "failed"
        q = st.get("queue")
        now = (st["state"], st["ps"], st["workers"], round(st["epochs_done"], 1), q and q["reason"])
        if now != last:
            wait = f"; waiting {q['position']} of {q['waiting']}: {q['reason']}" if q else ""
            print(
                f"{name}: {st['state']}, epochs {st['epochs_done']:.2f}/{st['est_epochs']:g}, "
                f"{st['ps']} PS, {st['workers']} workers{wait}",
                flush=True,
            )
            last = now
        for e in st["events"][seen_events:]:
            susp = max(e["suspension_ms"].values(), default=None)
            extra = f", worker suspension {susp:.1f} ms" if susp is not None else ""
            print(f"{name}: scaling event {e['change']} at iteration {e['clock']}{extra}", flush=True)
        seen_events = len(st["events"])
        if st["state"] in ("finished", "failed", "cancelled"):
            jct = (st["finished_at"] or time.time()) - st["submitted_at"]
            print(f"{name}: {st['state']} after {jct:.1f} s {st['reason']}".rstrip(), flush=True)
            return st["state"]
        time.sleep(poll)


# ---- jobs -------------------------------------------------------------------------


def _job_row(st: dict[str, Any]) -> dict[str, Any]:
    """One job's line: state, deployment, progress; for a waiting job its place in the queue and why."""
    end = st["finished_at"] or time.time()
    q = st.get("queue")
    return {
        "name": st["name"],
        "job_queue": (st.get("spec") or {}).get("queue"),
        "state": st["state"],
        "answering": st.get("answering", True),  # False: its host was slow, this is its last answer
        "type": st["job_type"],
        "ps": st["ps"],
        "workers": st["workers"],
        "epochs_done": round(st["epochs_done"], 3),
        "epochs": st["est_epochs"],
        "seconds": round(end - st["submitted_at"], 1),
        "events": len(st["events"]),
        "queue_position": q["position"] if q else None,
        "waiting": q["waiting"] if q else None,
        "wait_reason": q["reason"] if q else None,
        "wait_detail": q["detail"] if q else None,
    }


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """A job row for the table: the queue as ``position/waiting`` and the reason, the detail left out."""
    hidden = ("queue_position", "waiting", "wait_reason", "wait_detail")
    out = {k: v for k, v in row.items() if k not in hidden and k != "job_queue"}
    out = {"name": out.pop("name"), "queue": row.get("job_queue") or "", **out}
    out["waiting #"] = f"{row['queue_position']}/{row['waiting']}" if row["queue_position"] else ""
    out["waits because"] = row["wait_reason"] or ""
    return out


@jobs_app.command("list")
def jobs_list(address: AddressOpt = None, config: ConfigOpt = LIVE_CONFIG, json_out: JsonOpt = False) -> None:
    """Every job the agent knows: state, deployment, progress."""
    with connected(_address(address, config)) as ray:
        rows = [_job_row(s) for s in ray.get(_agent().jobs.remote())]
    if json_out:
        print(json.dumps({"jobs": rows}))
        return
    _table([_shown(r) for r in rows], "jobs")


@queues_app.command("list")
def queues_list(address: AddressOpt = None, config: ConfigOpt = LIVE_CONFIG,
                json_out: JsonOpt = False) -> None:
    """Each queue: its nominal quota, what its jobs hold after the last decision, what it borrows beyond
    its quota, its running and waiting jobs (clusters/agent/queues.py)."""
    with connected(_address(address, config)) as ray:
        rows = [r.model_dump(mode="json") for r in ray.get(_agent().queues.remote())]
    if json_out:
        print(json.dumps({"queues": rows}))
        return
    if not rows:
        print("this cluster has no queues (its experiment config has no tenancy:)")
        return

    def res(d: dict[str, float] | None) -> str:
        return "–" if d is None else ", ".join(f"{k} {v:g}" for k, v in d.items())

    _table([{"queue": r["name"], "cohort": r["cohort"], "weight": r["weight"], "nominal": res(r["nominal"]),
             "used": res(r["used"]), "borrowed": res(r["borrowed"]),
             "borrowing limit": res(r["borrowing_limit"]),
             "running": r["running"], "waiting": r["waiting"]} for r in rows], "queues")


@jobs_app.command("status")
def jobs_status(
    name: str, address: AddressOpt = None, config: ConfigOpt = LIVE_CONFIG, json_out: JsonOpt = False
) -> None:
    """One job in full: members (pid, node), scaling events with worker suspensions, per-slot history."""
    with connected(_address(address, config)) as ray:
        st = ray.get(_agent().job.remote(name))
    if st is None:
        raise UserError(f"no job named {name!r}")
    if json_out:
        print(json.dumps(st))
        return
    _table([_shown(_job_row(st))], name)
    if st.get("queue"):
        q = st["queue"]
        print(f"waiting: {q['position']} of {q['waiting']} waiting jobs; {q['reason']}: {q['detail']}")
    _table([{k: m[k] for k in ("name", "role", "state", "pid", "node")} for m in st["members"]], "members")
    _table(
        [
            {
                "change": e["change"],
                "iteration": e["clock"],
                "ms": round(e["duration_ms"], 1),
                "max suspension ms": round(max(e["suspension_ms"].values(), default=0.0), 1),
            }
            for e in st["events"]
        ],
        "scaling events",
    )


@jobs_app.command("cancel")
def jobs_cancel(
    name: str, address: AddressOpt = None, config: ConfigOpt = LIVE_CONFIG, json_out: JsonOpt = False
) -> None:
    """Stop a job now; its members end and its resources are freed."""
    with connected(_address(address, config)) as ray:
        res = ray.get(_agent().cancel.remote(name))
    if json_out:
        print(json.dumps(res))
    else:
        print(f"{name}: {res['reason']}")
    if not res["ok"]:
        raise typer.Exit(1)


def _table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in rows[0] if rows else ["(none)"]:
        table.add_column(str(col))
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    Console().print(table)


# ---- cluster ------------------------------------------------------------------------


@cluster_app.command("up")
def cluster_up(
    config: ConfigOpt = LIVE_CONFIG,
    scheduler: Annotated[
        str | None, typer.Option(help="override the config's scheduler (drf, dl2:PATH…)")
    ] = None,
    shadow: Annotated[
        bool | None, typer.Option("--shadow/--no-shadow", help="decide with the policy, apply the fallback")
    ] = None,
    learn: Annotated[bool | None, typer.Option("--learn/--no-learn", help="online learning (A3C)")] = None,
    slot_seconds: Annotated[float | None, typer.Option(min=0.1, help="override the slot length")] = None,
    address: Annotated[str | None, typer.Option(help="join this Ray cluster instead of starting one")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Start (or join) a Ray cluster and start the agent (named, detached, restartable); then return.
    With a Kubernetes config (top-level ``kubernetes:``) run the Kubernetes agent here until stopped."""
    from clusters.k8s.config import is_k8s_config

    if is_k8s_config(config):
        from clusters.cli.k8s import cluster_up_k8s

        cluster_up_k8s(config, scheduler, slot_seconds)
        return
    cfg = _live_config(config)
    if slot_seconds is not None:
        cfg = cfg.with_agent(slot_seconds=slot_seconds)
    from dl2ray.schedulers.base import make_scheduler

    spec = cfg.scheduler_spec(scheduler)
    make_scheduler(spec, cfg.experiment())  # a bad scheduler or checkpoint exits 2 here, not in the actor
    state_file = _state_file(cfg)
    state: dict[str, Any] = {}
    if address is None:
        if state_file.is_file():
            raise UserError(f"a cluster from {state_file} may be running: `dl2ray cluster down` first")
        token = create_token(state_file.with_name("auth_token"))
        state = start_head(
            cfg.live.ray.num_cpus, cfg.live.ray.dashboard_port, state_file.with_name("ray.log"), token
        )
        state["auth"] = {"mode": "token", "token_path": str(token)}
        address = state["address"]
        use_token(token)
    state.update(address=address, config=str(config.resolve()), scheduler=spec)
    try:
        with connected(address):
            start_agent(cfg, spec, shadow, learn)
    except BaseException:
        if "pid" in state:
            stop_head(state["pid"])
        raise
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps(state))
    if "auth" in state:
        state["export"] = export_line(Path(state["auth"]["token_path"]))
    if json_out:
        print(json.dumps(state))
        return
    print(
        f"cluster up: Ray at {address}"
        + (f", jobs API {state['dashboard']}" if "dashboard" in state else "")
        + f"; agent {cfg.live.agent_name} with {spec}"
    )
    if "export" in state:
        print(f"token authentication on; for `ray job submit` and other Ray clients:\n{state['export']}")


@cluster_app.command("status")
def cluster_status(
    address: AddressOpt = None, config: ConfigOpt = LIVE_CONFIG, json_out: JsonOpt = False
) -> None:
    """The agent (slot, scheduler, guardrail fallbacks, restarts, policy version) and its jobs."""
    with connected(_address(address, config)) as ray:
        agent = _agent()
        st = ray.get(agent.status.remote())
        jobs = [_job_row(s) for s in ray.get(agent.jobs.remote())]
        nodes = [
            {
                "node": n["NodeID"][:12],
                "cpu": n["Resources"].get("CPU", 0),
                "gpu": n["Resources"].get("GPU", 0),
                "mem_gb": round(n["Resources"].get("memory", 0) / 2**30, 1),
            }
            for n in ray.nodes()
            if n["Alive"]
        ]
    if json_out:
        print(json.dumps({**st, "nodes": nodes, "job_list": jobs}))
        return
    for k, v in st.items():
        print(f"{k}: {v}")
    _table(nodes, "nodes")
    if jobs:
        _table([_shown(r) for r in jobs], "jobs")


@cluster_app.command("down")
def cluster_down(config: ConfigOpt = LIVE_CONFIG, address: AddressOpt = None) -> None:
    """Stop the agent and every job (members end), then the Ray head that `cluster up` started."""
    cfg = _live_config(config)
    state_file = _state_file(cfg)
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    address = address or state.get("address")
    if address is None:
        raise UserError("no cluster to stop: no --address and no cluster.json")
    ray_env()  # before Ray's first import (below): Ray reads it then
    from clusters.ray.agent import teardown

    token = _token_of(state)
    if token is not None and token.is_file():
        use_token(token)
    with suppress(UserError), connected(address):
        teardown(cfg.live.agent_name, cfg.live.learn.global_policy)
    if "pid" in state:
        stop_head(state["pid"])
    if token is not None:
        token.unlink(missing_ok=True)
    state_file.unlink(missing_ok=True)
    print("cluster down")


@cluster_app.command("report")
def cluster_report(
    config: ConfigOpt = LIVE_CONFIG,
    json_out: JsonOpt = False,
    log_dir: Annotated[Path | None, typer.Option(help="decision log folder")] = None,
) -> None:
    """From the decision log: guardrail fallbacks, how the policy's allocations differed from the applied
    ones (shadow mode), control-loop timings."""
    from clusters.agent.report import live_report

    if log_dir is None:
        cfg = _live_config(config)
        log_dir = cfg.resolve(cfg.live.log_dir)
    doc = live_report(log_dir)
    if json_out:
        print(json.dumps(doc))
        return
    for k, v in doc.items():
        print(f"{k}: {v}")
