"""Helpers of the Kubernetes tests: a cluster (emulator + test kubelet + backend) and what tests count."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import kubernetes
from emulator import Emulator, with_uid
from kubelet import TestKubelet

from clusters.agent.views import job_id_of
from clusters.k8s import objects as ko
from clusters.k8s.api import KubeApi
from clusters.k8s.backend import KubernetesBackend
from clusters.k8s.config import K8sSettings
from dl2ray.config import load_config
from dl2ray.jobspec import JobSpec
from dl2ray.tenancy import TenancyConfig
from dl2ray.view import Allocation, JobPlacement, Tasks

REPO = Path(__file__).resolve().parents[3]
NS = "default"


def small_job(name: str, **over) -> JobSpec:
    """A tiny MLP job that trains for a few seconds per epoch with one worker (0.25 cores per task)."""
    raw = {
        "name": name,
        "job_type": "resnext-110",
        "model": "mlp",
        "epochs": 40,
        "samples": 256,
        "global_batch": 32,
        "worker": {"cpu": 0.25, "gpu": 0, "mem": 0.25},
        "ps": {"cpu": 0.25, "gpu": 0, "mem": 0.25},
        "workers": {"min": 1, "max": 4},
        "ps_count": {"min": 1, "max": 2},
        "seed": 0,
        "sample_delay_s": 0.004,
    }
    raw.update(over)
    return JobSpec.model_validate(raw)


def settings(**over) -> K8sSettings:
    raw = {
        "namespace": NS,
        "slot_seconds": 5.0,
        "api": {"timeout_s": 2.0, "attempts": 6, "backoff_s": 0.05, "backoff_max_s": 0.5},
        "pods": {
            "ready_timeout_s": 60,
            "release_timeout_s": 20,
            "heartbeat_timeout_s": 3.0,
            "register_timeout_s": 60,
        },
    }
    raw.update(over)
    return K8sSettings.model_validate(raw)


class Cluster:
    """The emulator with nodes, a test kubelet, and a backend; counts what a test asserts on."""

    def __init__(self, emu: Emulator, tmp: Path, nodes: list[dict], tenancy: TenancyConfig | None = None,
                 **over) -> None:
        self.emu, self.tmp, self.tenancy = emu, tmp, tenancy
        conf = kubernetes.client.Configuration()
        conf.host = emu.url
        self.client = kubernetes.client.ApiClient(conf)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        for n in nodes:
            self.core.create_node(n)
        (tmp / "pods").mkdir(exist_ok=True)
        self.kubelet = TestKubelet(emu.url, NS, tmp / "pods").__enter__()
        self.catalogue = load_config(REPO / "configs" / "testbed.yaml").catalogue
        self.backend = self.new_backend(**over)

    def new_backend(self, **over) -> KubernetesBackend:
        """A fresh backend (an agent restart: nothing carried over but the cluster)."""
        s = settings(**over)
        conf = kubernetes.client.Configuration()
        conf.host = self.emu.url
        conf.retries = False
        api = KubeApi(kubernetes.client.ApiClient(conf), s.api, NS)
        return KubernetesBackend(api, s, self.catalogue, tenancy=self.tenancy)

    def close(self) -> None:
        self.backend.close()
        self.kubelet.close()

    # ---- kubectl ----

    def apply_job(self, spec: JobSpec | dict, suspend: bool = False) -> dict:
        obj = ko.dl2job(spec, NS, suspend) if isinstance(spec, JobSpec) else spec
        return self.custom.create_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL, with_uid(obj))

    def patch_job(self, name: str, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL, name, {"spec": spec})

    def job(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL, name)

    def pods(self, job: str | None = None) -> list:
        items = self.core.list_namespaced_pod(NS).items
        return [p for p in items if job is None or (p.metadata.labels or {}).get(ko.LABEL_JOB) == job]

    def live(self, job: str, role: str) -> list[str]:
        """Names of the job's pods of ``role`` that are not finished or failed."""
        return sorted(
            p.metadata.name
            for p in self.pods(job)
            if p.metadata.labels.get(ko.LABEL_ROLE) == role and p.status.phase not in ("Succeeded", "Failed")
        )

    def events(self) -> list:
        return self.core.list_namespaced_event(NS).items

    def duplicates(self) -> list[str]:
        """Pod names stored more than once, and pods of one job role index beyond one (there must be none)."""
        seen = Counter(
            (
                p.metadata.labels.get(ko.LABEL_JOB),
                p.metadata.labels.get(ko.LABEL_ROLE),
                p.metadata.labels.get(ko.LABEL_INDEX),
            )
            for p in self.pods()
        )
        return [str(k) for k, n in seen.items() if n > 1]

    def orphans(self) -> list[str]:
        """Pods whose DL2Job does not exist, or that carry no owner reference to it."""
        jobs = {
            j["metadata"]["name"]: j["metadata"].get("uid")
            for j in self.custom.list_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL)["items"]
        }
        out = []
        for p in self.pods():
            job = (p.metadata.labels or {}).get(ko.LABEL_JOB)
            refs = [r for r in p.metadata.owner_references or [] if r.kind == ko.KIND and r.controller]
            if job not in jobs or not refs or refs[0].uid != jobs[job]:
                out.append(p.metadata.name)
        return out

    # ---- one slot ----

    def slot(
        self, alloc: dict[str, tuple[int, int]], nodes: dict[str, tuple[list[str], list[str]]] | None = None
    ):
        """Snapshot, then apply ``{job: (ps, workers)}`` (optionally pinned: ``{job: (ps nodes, worker
        nodes)}``); returns (view, report)."""
        view = self.backend.snapshot()
        index = self.backend.nodes.index()
        tasks = {job_id_of(j): Tasks(workers=w, ps=p) for j, (p, w) in alloc.items()}
        placement = None
        if nodes:
            placement = {
                job_id_of(j): JobPlacement(tuple(index[n] for n in wn), tuple(index[n] for n in pn))
                for j, (pn, wn) in nodes.items()
            }
        report = self.backend.apply(Allocation(tasks, placement))
        return view, report

    def plan(self, job: str) -> tuple[int, int]:
        """(ps, workers) in the coordinator's plan, read afresh."""
        self.backend.read()
        return self.backend.jobs[job].plan()
