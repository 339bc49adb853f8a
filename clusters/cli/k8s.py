"""The Kubernetes commands (composition root): ``k8s render|manifests``, ``submit --k8s`` and
``cluster up`` with a Kubernetes config.

Only here are the kubeconfig, the config file, the backend and the agent wired
together. ``kubernetes`` is imported by :mod:`clusters.k8s.backend` only, and
only when a command needs the API server (``render`` and ``manifests`` do not).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from clusters.k8s import objects as ko
from clusters.k8s.config import K8sConfig, K8sSettings, load_k8s_config
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


def dump_all(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False, default_flow_style=False)


# ---- offline: render and manifests -------------------------------------------------------------------


def render_job(
    job: Path, settings: K8sSettings, ps: int | None, workers: int | None, nodes: list[str] | None
) -> list[dict[str, Any]]:
    """The DL2Job of a job spec file and the objects it becomes with ``ps``/``workers`` (default: the
    spec's minimum). The owner references carry a placeholder uid (the API server assigns the real one)."""
    spec = load_jobspec(job)
    ps = spec.ps_count.min if ps is None else ps
    workers = spec.workers.min if workers is None else workers
    for flag, n, b in (("--ps", ps, spec.ps_count), ("--workers", workers, spec.workers)):
        if not b.min <= n <= b.max:
            raise UserError(f"{flag} {n}: outside the job's bounds [{b.min}, {b.max}]")
    if nodes and len(nodes) not in (1, ps + workers):
        raise UserError(f"--node: give one node, or one per task ({ps + workers}), not {len(nodes)}")
    job_obj = ko.dl2job(spec, settings.namespace)
    owner = {**job_obj, "metadata": {**job_obj["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
    per_task = (nodes * (ps + workers) if len(nodes) == 1 else nodes) if nodes else None
    p = settings.pods
    return [
        job_obj,
        *ko.render(
            owner,
            spec,
            ps,
            workers,
            per_task,
            image=settings.image,
            pull=settings.image_pull_policy,
            python=p.python,
            port=p.coordinator_port,
            heartbeat_timeout_s=p.heartbeat_timeout_s,
            register_timeout_s=p.register_timeout_s,
        ),
    ]


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


def manifests(settings: K8sSettings, agent_image: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The files of ``configs/k8s/``: file name → objects."""
    ns = settings.namespace
    name = "dl2ray-agent"
    labels = {**ko.MANAGED_BY, "app.kubernetes.io/name": name}
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "rules": [
            {"apiGroups": [ko.GROUP], "resources": [ko.PLURAL], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [ko.GROUP], "resources": [f"{ko.PLURAL}/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "create", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ],
    }
    cluster_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}],
    }
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subject,
    }
    cluster_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subject,
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "data": {
            "k8s-cluster.yaml": yaml.safe_dump(
                {
                    "kubernetes": {
                        "experiment": "/app/configs/testbed.yaml",
                        "scheduler": "dl2:/app/models/dl2-testbed.pt",
                        "slot_seconds": settings.slot_seconds,
                        "namespace": ns,
                        "kubeconfig": None,
                        "image": settings.image,
                        "log_dir": "/tmp/dl2ray",
                    }
                },
                sort_keys=False,
            )
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two agents at once
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "containers": [
                        {
                            "name": "agent",
                            "image": agent_image or settings.image,
                            "imagePullPolicy": settings.image_pull_policy,
                            "command": [
                                "dl2ray",
                                "cluster",
                                "up",
                                "--config",
                                "/etc/dl2ray/k8s-cluster.yaml",
                            ],
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "1Gi"},
                                "limits": {"memory": "2Gi"},
                            },
                            "volumeMounts": [
                                {"name": "config", "mountPath": "/etc/dl2ray", "readOnly": True}
                            ],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "runAsNonRoot": True,
                                "runAsUser": 1000,
                            },
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
                },
            },
        },
    }
    example = ko.dl2job(
        load_jobspec(Path(__file__).resolve().parents[1] / "examples/jobs/mlp-small.yaml"), ns
    )
    return {
        "crd.yaml": [ko.crd()],
        "rbac.yaml": [sa, role, binding, cluster_role, cluster_binding],
        "agent.yaml": [config_map, deployment],
        "example-dl2job.yaml": [example],
    }


HEADER = "# Generated by `dl2ray k8s manifests --out configs/k8s` from clusters/ (do not edit by hand).\n"


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


def connect(cfg: K8sConfig):
    """The backend on the configured API server; UserError when it cannot be reached or configured."""
    from clusters.k8s.backend import ApiGiveUp, KubeApi, KubernetesBackend

    k = cfg.kubernetes
    path = cfg.kubeconfig_path()
    if path is not None and not path.is_file():
        raise UserError(f"kubernetes.kubeconfig: {path}: no such file")
    api = KubeApi.connect(k, None if path is None else str(path))
    backend = KubernetesBackend(api, k, cfg.experiment().catalogue, cfg.experiment().cluster.placement)
    try:
        backend.read()
    except (ApiGiveUp, OSError) as exc:
        backend.close()
        raise UserError(f"cannot reach the Kubernetes API server: {exc}") from None
    return backend


def submit_k8s(job: Path, config: Path, follow: bool, poll: float, suspend: bool = False) -> str:
    """``dl2ray submit --k8s``: create the DL2Job; follow its status (the final phase) when asked."""
    spec = load_jobspec(job)  # a bad spec exits 2 here, naming the field, before any API call
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
        cfg = cfg.model_copy(
            update={"kubernetes": cfg.kubernetes.model_copy(update={"slot_seconds": slot_seconds})}
        )
    from dl2ray.schedulers.base import make_scheduler

    make_scheduler(scheduler or cfg.kubernetes.scheduler, cfg.experiment())  # a bad scheduler exits 2 here
    from clusters.agent.loop import K8sAgent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    backend = connect(cfg)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent = K8sAgent(cfg, backend, scheduler)
        print(
            f"agent up: namespace {cfg.kubernetes.namespace}, scheduler {agent.spec}, "
            f"{len(backend.nodes.names)} nodes, adopted {agent.adopted} running jobs",
            flush=True,
        )
        agent.run(stop, max_slots)
    finally:
        backend.close()
