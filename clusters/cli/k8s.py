"""The Kubernetes commands (composition root): ``k8s render|manifests``, ``submit --k8s`` and
``cluster up`` with a Kubernetes config.

Only here are the kubeconfig, the config file, the backend and the agent wired
together. ``kubernetes`` is imported by :mod:`clusters.k8s.api` only, and
only when a command needs the API server (``render`` and ``manifests`` do not).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from clusters.k8s.config import K8sConfig, K8sSettings, load_k8s_config
from clusters.k8s.manifests import HEADER, dump_all, manifests, render_job
from dl2ray.errors import UserError
from dl2ray.jobspec import load_jobspec

K8S_CONFIG = Path("configs/k8s-cluster.yaml")
K8sConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Kubernetes cluster config")]

k8s_app = typer.Typer(no_args_is_help=True, help="The Kubernetes adaptor: the objects a DL2Job becomes.")


def register_k8s(plugins) -> None:
    root = getattr(plugins, "root", None)
    if root is not None:
        root.add_typer(k8s_app, name="k8s")


def _config(path: Path) -> K8sConfig:
    if not path.is_file():
        raise UserError(f"--config: {path}: no such file")
    return load_k8s_config(path)


# ---- offline: render and manifests -------------------------------------------------------------------


@k8s_app.command("render")
def render(
    job: Annotated[Path, typer.Argument(help="job spec YAML (see examples/jobs/)")],
    config: K8sConfigOpt = K8S_CONFIG,
    ps: Annotated[int | None, typer.Option(help="PS to render (default: the spec's minimum)")] = None,
    workers: Annotated[
        int | None, typer.Option(help="workers to render (default: the spec's minimum)")
    ] = None,
    node: Annotated[list[str] | None, typer.Option(help="pin to this node (once, or once per task)")] = None,
) -> None:
    """Print (YAML) the DL2Job of JOB and the Service and pods it becomes when it runs."""
    settings = _config(config).kubernetes if config.is_file() or config != K8S_CONFIG else K8sSettings()
    print(dump_all(render_job(job, settings, ps, workers, node)), end="")


@k8s_app.command("manifests")
def manifests_cmd(
    out: Annotated[
        Path, typer.Option(help="folder to write crd.yaml, rbac.yaml, agent.yaml, example-dl2job.yaml")
    ],
    config: K8sConfigOpt = K8S_CONFIG,
) -> None:
    """Write the CRD, RBAC, agent Deployment and an example DL2Job (the files of configs/k8s/)."""
    settings = _config(config).kubernetes
    out.mkdir(parents=True, exist_ok=True)
    for fname, objs in manifests(settings).items():
        (out / fname).write_text(HEADER + dump_all(objs))
        print(out / fname)


# ---- online: submit and the agent ------------------------------------------------------------------------


def submit_k8s(job: Path, config: Path, follow: bool, poll: float, suspend: bool = False) -> str:
    """``dl2ray submit --k8s``: create the DL2Job; follow its status (the final phase) when asked."""
    spec = load_jobspec(job)  # a bad spec exits 2 here, naming the field, before any API call
    from clusters.k8s.backend import connect

    cfg = _config(config)
    backend = connect(cfg)
    try:
        res = backend.submit(spec, suspend)
        print(
            f"submitted DL2Job {spec.name} in {res['namespace']} (job id {res['job_id']}, "
            f"{spec.iterations} iterations)",
            flush=True,
        )
        phase = "Pending"
        while follow:
            st = backend.statuses().get(spec.name)
            if st is None:
                return "Deleted"
            phase = st.get("phase", "Pending")
            print(
                f"{phase}: {st.get('epochsDone', 0):.2f}/{spec.epochs:g} epochs, "
                f"{st.get('workers', {}).get('ready', 0)} workers, {st.get('ps', {}).get('ready', 0)} PS",
                flush=True,
            )
            if phase in ("Succeeded", "Failed", "Invalid"):
                break
            time.sleep(poll)
        return phase
    finally:
        backend.close()


def cluster_up_k8s(
    config: Path, scheduler: str | None, slot_seconds: float | None, max_slots: int | None = None
) -> None:
    """``dl2ray cluster up --config <kubernetes config>``: run the agent in this process until SIGTERM/Ctrl-C
    (it is the agent Deployment's command)."""
    cfg = _config(config)
    if slot_seconds is not None:
        cfg = cfg.with_agent(slot_seconds=slot_seconds)
    from dl2ray.schedulers.base import make_scheduler

    make_scheduler(cfg.scheduler_spec(scheduler), cfg.experiment())  # a bad scheduler exits 2 here
    from clusters.agent.loop import Agent
    from clusters.k8s.backend import connect
    from clusters.k8s.dashboard import start_http

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    backend = connect(cfg)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    http = None
    try:
        agent = Agent(cfg, backend, cfg.scheduler_spec(scheduler))
        http = start_http(agent, backend)  # the dashboard and /metrics, as the Ray agent has them
        print(
            f"agent up: namespace {cfg.kubernetes.namespace}, scheduler {agent.spec}, "
            f"{len(backend.nodes.names)} nodes, adopted {agent.adopted} running jobs"
            + (f", dashboard {http.url}" if http is not None else ""),
            flush=True,
        )
        agent.run(stop, max_slots)
    finally:
        if http is not None:
            http.stop()
        backend.close()
