"""The agent's dashboard JSON, its page and its Prometheus metrics, over the real control loop and a real HTTP
server, on a small in-memory cluster (no Ray); its queue positions and wait reasons are those of
:func:`clusters.agent.waiting.queue` (checked by hand in test_waiting.py). (The Grafana dashboard's panels are
checked against scrapes in tests/serve/test_serve_metrics.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from clusters.agent.dashboard import DashboardState, dashboard_state
from clusters.agent.http import AgentHttp, make_app
from clusters.agent.loop import Agent
from clusters.agent.metrics import METRIC_NAMES, AgentMetrics
from clusters.agent.reports import ApplyReport, ScaleAction
from clusters.agent.views import job_id_of, live_job_view
from clusters.agent.waiting import FIRST_SLOT, NO_RESOURCES, STARTING, queue
from clusters.ray.config import LiveConfig
from dl2ray.config import load_config
from dl2ray.jobspec import parse_jobspec
from dl2ray.view import Allocation, ClusterView, Observation, Tasks

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = load_config(ROOT / "configs" / "testbed.yaml").catalogue


def _spec(name: str, epochs: float = 2.0, cpu: float = 1.0, workers_min: int = 1) -> dict[str, Any]:
    return parse_jobspec({"name": name, "job_type": "resnext-110", "model": "mlp", "epochs": epochs,
                          "samples": 64, "global_batch": 8, "worker": {"cpu": cpu, "gpu": 0, "mem": 1},
                          "workers": {"min": workers_min, "max": 4}}).model_dump(mode="json")


class TinyCluster:
    """A LiveBackend in memory: two nodes, jobs that train 0.5 epoch per worker per slot, a scaling event
    (with a worker pause) per change. Statuses have the fields the Ray job hosts report."""

    NODES = ("node-a", "node-b")

    def __init__(self) -> None:
        self.slot, self.epoch = 0, time.time() - 100.0
        self.capacity = np.array([[4.0, 0.0, 8.0], [2.0, 0.0, 8.0]])
        self.jobs: dict[str, dict[str, Any]] = {}

    def add(self, name: str, **kw: Any) -> None:
        self.jobs[name] = {
            "name": name, "job_id": job_id_of(name), "job_type": "resnext-110", "state": "pending",
            "reason": "",
            "spec": _spec(name, **kw), "submitted_at": time.time() - 50 + len(self.jobs), "started_at": None,
            "finished_at": None, "ps": 0, "workers": 0, "members": [], "epochs_done": 0.0,
            "est_epochs": _spec(name, **kw)["epochs"], "operation": None, "events": [], "history": [],
            "actions": [], "busy": False}

    def slot_now(self) -> int:
        return self.slot

    def slot_start(self, slot: int) -> float:
        return self.epoch + 10.0 * slot

    def adopt(self) -> int:
        return 0

    def snapshot(self) -> ClusterView:
        free = self.capacity.copy()
        views = []
        for st in sorted(self.jobs.values(), key=lambda s: s["submitted_at"]):
            if st["workers"]:  # train the last slot, record it
                st["epochs_done"] = min(st["epochs_done"] + 0.5 * st["workers"], st["est_epochs"])
                st["history"].append({"slot": self.slot - 1, "ps": st["ps"], "workers": st["workers"],
                                      "epochs": 0.5 * st["workers"], "seconds": 10.0, "loss": float("nan")})
                if st["epochs_done"] >= st["est_epochs"]:
                    st.update(state="finished", finished_at=time.time(), ps=0, workers=0, members=[])
            if st["state"] in ("finished", "failed", "cancelled"):
                continue
            if st["state"] == "paused":  # as on Ray: a paused job's kept PS is not the scheduler's to give
                free[0] -= np.array([1.0, 0.0, 1.0])
            hist = [Observation(h["slot"], h["ps"], h["workers"], h["epochs"], h["seconds"], h["loss"])
                    for h in st["history"]]
            spec = parse_jobspec(st["spec"])
            views.append(live_job_view(st["name"], spec, CATALOGUE, 0, st["epochs_done"],
                                       [0] * st["ps"], [0] * st["workers"], hist))
        return ClusterView(self.slot, 10.0, self.capacity, np.maximum(free, 0), tuple(views), CATALOGUE)

    def view_parts(self) -> dict[str, float]:
        return {}

    def apply(self, allocation: Allocation) -> ApplyReport:
        report = ApplyReport(self.slot)
        for st in self.jobs.values():
            t = allocation.tasks.get(st["job_id"], Tasks(0, 0))
            ended = st["state"] in ("finished", "failed", "cancelled")
            if ended or (t.ps, t.workers) == (st["ps"], st["workers"]):
                continue
            before = (st["ps"], st["workers"])
            st.update(ps=t.ps if t.workers else 0, workers=t.workers,
                      state="running" if t.workers else ("paused" if st["state"] == "running" else "pending"))
            st["members"] = [{"role": r, "node": "node-a", "state": "member"}
                             for r in ["ps"] * st["ps"] + ["worker"] * st["workers"]]
            st["actions"].append({"time": self.slot_start(self.slot) + 1.0, "ps": t.ps, "workers": t.workers,
                                  "ok": True, "reason": "scaled", "seconds": 0.4})
            st["events"].append({"plan_id": len(st["events"]) + 1, "change": f"{before}->{(t.ps, t.workers)}",
                                 "clock": 3 * self.slot, "duration_ms": 12.0, "suspension_ms": {"0": 0.8},
                                 "lost_iterations": 0})
            report.actions.append(ScaleAction(st["name"], before, (t.ps, t.workers), True, "scaled", 0.4))
        return report

    def submit(self, spec):
        raise NotImplementedError

    def cancel(self, name: str):
        raise NotImplementedError

    def statuses(self) -> dict[str, dict[str, Any]]:
        return json.loads(json.dumps(self.jobs))  # copies, as a remote call returns

    def close(self) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path):
    """The agent over :class:`TinyCluster` (DRF) after three slots, behind its real HTTP server."""
    cluster = TinyCluster()
    cluster.add("alpha", epochs=1.0)
    cluster.add("beta", epochs=50.0)
    cluster.add("huge", cpu=8.0)  # never fits: 9 cores asked (a PS and a worker), 6 in the cluster
    cfg = LiveConfig.model_validate({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                              "log_dir": str(tmp_path / "log")}})
    agent = Agent(cfg, cluster, "drf", metrics=AgentMetrics(lambda: cluster.statuses().values()))
    for slot in range(4):
        cluster.slot = slot
        agent.step()

    def state() -> DashboardState:
        return dashboard_state(agent, {"agent": "tiny", "slots_done": agent.slots_done},
                               cluster.statuses().values(), list(TinyCluster.NODES))

    http = AgentHttp(make_app(state, agent.metrics.scrape), "127.0.0.1", 0)
    yield http.url, agent, cluster
    http.stop()
    agent.close()


def test_the_state_endpoint_shows_jobs_allocations_queue_and_decisions(served) -> None:
    url, _, _ = served
    s = requests.get(f"{url}/api/state", timeout=30).json()
    DashboardState.model_validate(s)
    jobs = {j["name"]: j for j in s["jobs"]}
    assert [j["name"] for j in s["jobs"]] == ["alpha", "beta", "huge"]  # submission order
    assert jobs["alpha"]["state"] == "finished" and jobs["alpha"]["queue_position"] is None
    beta = jobs["beta"]
    assert beta["state"] == "running" and beta["workers"] >= 1
    assert beta["worker_nodes"] == ["node-a"] * beta["workers"]
    assert beta["timeline"] and beta["timeline"][0]["workers"] >= 1 and beta["events"][0]["pause_ms"] == 0.8
    assert beta["scale_calls"][0]["slot"] == pytest.approx(0.1)  # 1 s into slot 0 of 10 s
    huge = jobs["huge"]
    assert huge["queue_position"] == 1
    assert huge["wait_reason"] == NO_RESOURCES  # its 8-core worker fits on no node
    assert "one worker (cpu 8, gpu 0, mem 1 GB)" in huge["wait_detail"]
    assert s["slot"] == 3 and s["slot_seconds"] == 10.0 and s["policy"]["scheduler"] == "drf"
    assert [n["name"] for n in s["nodes"]] == ["node-a", "node-b"] and s["nodes"][1]["capacity"]["cpu"] == 2.0
    held = beta["ps"] + beta["workers"]  # 1 core each, all on node-a; alpha's ended with it
    assert s["nodes"][0]["used"]["cpu"] == held and s["nodes"][1]["used"]["cpu"] == 0.0
    assert [d["slot"] for d in s["decisions"]] == [0, 1, 2, 3]
    assert all(d["applied"] == "policy" for d in s["decisions"])
    assert "beta" in s["decisions"][-1]["policy_alloc"]  # allocations by job name
    assert s["federation"] is None


def test_the_timeline_keeps_the_latest_window_of_slots(served) -> None:
    _, agent, cluster = served
    full = dashboard_state(agent, {}, cluster.statuses().values())
    last = dashboard_state(agent, {}, cluster.statuses().values(), window=1)  # slot 3: slots 2 and later
    beta = {j.name: j for j in full.jobs}["beta"]
    kept = {j.name: j for j in last.jobs}["beta"]
    assert [h.slot for h in kept.timeline] == [h.slot for h in beta.timeline if h.slot >= 2]
    assert len(kept.timeline) < len(beta.timeline) and not kept.scale_calls and beta.scale_calls
    assert full.nodes[0].name == "node-0"  # without names the nodes are numbered


def test_the_page_is_served_and_reads_the_state_endpoint(served) -> None:
    url, _, _ = served
    page = requests.get(url, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'fetch("api/state"' in page.text and 'id="jobs"' in page.text and 'id="timeline"' in page.text
    assert requests.get(f"{url}/nope", timeout=30).status_code == 404


def test_a_state_that_cannot_be_read_is_a_503_and_the_server_stays_up(tmp_path: Path) -> None:
    def broken() -> DashboardState:
        raise ConnectionError("the cluster did not answer")

    http = AgentHttp(make_app(broken, lambda: b""), "127.0.0.1", 0)
    try:
        r = requests.get(f"{http.url}/api/state", timeout=30)
        assert r.status_code == 503 and "ConnectionError: the cluster did not answer" in r.json()["detail"]
        assert requests.get(f"{http.url}/healthz", timeout=30).json() == {"status": "ok"}
    finally:
        http.stop()


def _scrape(url: str) -> dict[str, Any]:
    text = requests.get(f"{url}/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family, sample_name: str, **labels: str) -> float:
    return sum(s.value for s in family.samples
               if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_the_metrics_count_the_loop_the_decisions_and_the_jobs(served) -> None:
    url, _, cluster = served
    m = _scrape(url)
    assert _value(m["dl2ray_agent_slots"], "dl2ray_agent_slots_total") == 4
    assert _value(m["dl2ray_agent_decisions"], "dl2ray_agent_decisions_total", applied="policy") == 4
    assert _value(m["dl2ray_agent_slot_seconds"], "dl2ray_agent_slot_seconds_count", phase="total") == 4
    assert _value(m["dl2ray_jobs"], "dl2ray_jobs", state="finished") == 1
    assert _value(m["dl2ray_jobs"], "dl2ray_jobs", state="running") == 1
    assert _value(m["dl2ray_queue_length"], "dl2ray_queue_length") == 1
    assert _value(m["dl2ray_job_completion_seconds"], "dl2ray_job_completion_seconds_count") == 1
    events = sum(len(st["events"]) for st in cluster.jobs.values())
    assert _value(m["dl2ray_scaling_events"], "dl2ray_scaling_events_total") == events > 0
    pauses = _value(m["dl2ray_scaling_pause_seconds"], "dl2ray_scaling_pause_seconds_bucket", le="0.001")
    assert pauses == events  # every pause was 0.8 ms
    assert _value(m["dl2ray_agent_scale_calls"], "dl2ray_agent_scale_calls_total", result="ok") == events
    assert _value(m["dl2ray_agent_policy_version"], "dl2ray_agent_policy_version") == -1
    assert {n.removesuffix("_total") for n in METRIC_NAMES} <= set(m)  # every family is exposed


def test_a_failed_step_and_a_fallback_are_counted(tmp_path: Path) -> None:
    class Raising:
        name = "raising"

        def decide(self, view):
            raise RuntimeError("policy bug")

    cluster = TinyCluster()
    cluster.add("alpha")
    cfg = LiveConfig.model_validate({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                              "log_dir": str(tmp_path / "log")}})
    agent = Agent(cfg, cluster, "raising", policy=Raising())
    agent.step()
    cluster.snapshot = lambda: (_ for _ in ()).throw(ConnectionError("down"))  # type: ignore[method-assign]
    agent.step()
    agent.close()
    m = {f.name: f for f in text_string_to_metric_families(agent.metrics.scrape().decode())}
    assert _value(m["dl2ray_agent_fallbacks"], "dl2ray_agent_fallbacks_total", reason="error") == 1
    assert _value(m["dl2ray_agent_decisions"], "dl2ray_agent_decisions_total", applied="fallback") == 1
    errors = m["dl2ray_agent_step_errors"]
    assert _value(errors, "dl2ray_agent_step_errors_total", error="ConnectionError") == 1


# ---- queue position and wait reason: clusters.agent.waiting's, as dl2ray jobs list shows them -----------


def test_the_queue_is_the_one_of_jobs_list_read_from_the_last_decision(served) -> None:
    url, agent, cluster = served
    cluster.add("late")  # submitted after the agent's last decision
    cluster.add("boot")
    cluster.jobs["boot"]["state"] = "running"  # no worker yet: its members are starting
    statuses = list(cluster.statuses().values())
    shown = {j.name: (j.queue_position, j.wait_reason, j.wait_detail)
             for j in dashboard_state(agent, {}, statuses).jobs}
    q = queue(statuses, agent.last_decision)
    assert shown == {"alpha": (None, None, None), "beta": (None, None, None),
                     **{n: (r["position"], r["reason"], r["detail"]) for n, r in q.items()}}
    assert shown["huge"][:2] == (1, NO_RESOURCES) and shown["late"][:2] == (2, FIRST_SLOT)
    assert shown["boot"][:2] == (3, STARTING)
    assert _value(_scrape(url)["dl2ray_queue_length"], "dl2ray_queue_length") == len(q) == 3


def test_the_state_is_built_at_most_once_per_max_age_whoever_asks() -> None:
    from clusters.agent.http import Latest

    calls = []
    latest = Latest(lambda: calls.append(1) or len(calls), max_age_s=3600.0)
    assert [latest() for _ in range(5)] == [1] * 5 and len(calls) == 1
    fresh = Latest(lambda: calls.append(1) or len(calls), max_age_s=0.0)
    assert fresh() < fresh()  # max_age 0: every call computes again


def test_a_bad_dashboard_setting_names_its_field(tmp_path: Path) -> None:
    from clusters.ray.config import load_live_config
    from dl2ray.config import ConfigError

    cases = (({"host": "not a host"}, "live.dashboard.host"), ({"port": 70000}, "live.dashboard.port"),
             ({"colour": "red"}, "live.dashboard.colour"))
    for bad, field in cases:
        path = tmp_path / "live.yaml"
        path.write_text(json.dumps({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                             "dashboard": bad}}))
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_live_config(path)
    ok = tmp_path / "ok.yaml"
    ok.write_text(json.dumps({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                       "dashboard": {"host": "0.0.0.0", "port": 0}}}))
    assert load_live_config(ok).live.dashboard.port == 0
