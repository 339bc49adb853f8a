"""The Kubernetes agent's dashboard and metrics (issue 40, item 5): the real control loop over the
KubernetesBackend on the local API server, the Ray agent's HTTP server in front of it (real HTTP): the page's
JSON lists the DL2Jobs, their wait reasons and the shared cluster's queues; ``/metrics`` counts the jobs by
state and the queues' jobs. A policy that starts nothing keeps every pod out of it (no training needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import yaml
from emulator import node
from k8s_support import NS, Cluster, small_job
from prometheus_client.parser import text_string_to_metric_families

from clusters.agent.loop import Agent
from clusters.k8s import objects as ko
from clusters.k8s.config import K8sConfig
from clusters.k8s.dashboard import job_status, start_http
from dl2ray.tenancy import TenancyConfig
from dl2ray.view import Allocation, ClusterView

REPO = Path(__file__).resolve().parents[3]
TENANCY = {"queues": [{"name": "research", "nominal": {"cpu": 2, "gpu": 0, "mem": 4}},
                      {"name": "prod", "nominal": {"cpu": 2, "gpu": 0, "mem": 4}}]}


class StartsNothing:
    name = "starts-nothing"

    def decide(self, view: ClusterView) -> Allocation:
        return Allocation({})


@pytest.fixture
def shared(emulator, tmp_path):
    raw = yaml.safe_load((REPO / "configs" / "testbed.yaml").read_text())
    base = REPO / "configs"
    raw.update(jobtypes=str(base / raw["jobtypes"]), profile=str(base / raw["profile"]), tenancy=TENANCY)
    raw["speed"]["surfaces"] = str(base / raw["speed"]["surfaces"])
    experiment = tmp_path / "shared.yaml"
    experiment.write_text(yaml.safe_dump(raw))
    cluster = Cluster(emulator, tmp_path, [node(n, cpu="2", memory="4Gi") for n in ("node-a", "node-b")],
                      tenancy=TenancyConfig.model_validate(TENANCY))
    cfg = K8sConfig.model_validate({"kubernetes": {"experiment": str(experiment), "namespace": NS,
                                                   "log_dir": str(tmp_path / "log"),
                                                   "dashboard": {"port": 0}}})
    yield cluster, cfg
    cluster.close()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family, **labels: str) -> float:
    return sum(s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items()))


def test_the_kubernetes_agent_serves_the_dashboard_and_metrics_with_its_queues(shared) -> None:
    cluster, cfg = shared
    cluster.apply_job(small_job("in-prod", queue="prod"))
    cluster.apply_job(small_job("in-research", queue="research"))
    cluster.apply_job(small_job("nowhere", queue="nope"))
    agent = Agent(cfg, cluster.backend, "starts-nothing", policy=StartsNothing())
    http = start_http(agent, cluster.backend)
    assert http is not None
    try:
        agent.step()
        state = requests.get(f"{http.url}/api/state", timeout=30).json()
        jobs = {j["name"]: j for j in state["jobs"]}
        assert set(jobs) == {"in-prod", "in-research"}  # the invalid one has its condition and Event
        assert {j["state"] for j in jobs.values()} == {"pending"}
        assert jobs["in-prod"]["wait_reason"] == "scheduler gave it 0"
        assert [n["name"] for n in state["nodes"]] == ["node-a", "node-b"]
        queues = {q["name"]: q for q in state["queues"]}
        assert queues["prod"]["waiting"] == 1 and queues["prod"]["nominal"]["cpu"] == 2.0
        assert state["agent"]["agent"] == f"k8s:{NS}" and state["agent"]["slots_done"] == 1

        m = _families(requests.get(f"{http.url}/metrics", timeout=30).text)
        assert _value(m["dl2ray_agent_slots"]) == 1
        assert _value(m["dl2ray_jobs"], state="pending") == 2
        assert _value(m["dl2ray_queue_length"]) == 2
        assert _value(m["dl2ray_queue_jobs"], queue="prod", state="waiting") == 1
        assert _value(m["dl2ray_queue_nominal"], queue="research", resource="cpu") == 2
        page = requests.get(f"{http.url}/", timeout=30)
        assert page.status_code == 200 and 'id="queues"' in page.text
    finally:
        http.stop()
        agent.close()


def test_job_status_maps_the_phases_as_the_dashboard_reads_them(shared) -> None:
    cluster, _ = shared
    cluster.apply_job(small_job("held", queue="prod"), suspend=True)
    cluster.backend.snapshot()
    st = job_status(cluster.backend.jobs["held"])
    assert st["state"] == "paused" and st["spec"]["queue"] == "prod" and st["members"] == []
    assert st["submitted_at"] > 0 and st["events"] == [] and st["actions"] == []
    obj = cluster.job("held")
    assert obj["metadata"]["name"] == "held" and obj["kind"] == ko.KIND
