"""Queues on a live cluster (issue 40, item 4), over the real control loop on the small in-memory cluster of
test_dashboard.py: a borrower scaled down (not paused, not killed) the slot a queue's job arrives, each
queue's quota, use and borrowing as ``dl2ray queues list``, the dashboard and the metrics give them, the
``queue at quota`` reason, and a job naming a queue the cluster does not have refused with the field named
(the same on Ray: tests/clusters/test_queues_ray.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import run_cli
from test_dashboard import TinyCluster

from clusters.agent.dashboard import dashboard_state
from clusters.agent.loop import Agent
from clusters.agent.metrics import QUEUE_METRIC_NAMES
from clusters.agent.queues import at_quota, check_job_queue, queue_rows
from clusters.agent.waiting import AT_QUOTA, queue
from clusters.ray.config import LiveConfig
from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.jobspec import parse_jobspec
from dl2ray.tenancy import TenancyConfig

ROOT = Path(__file__).resolve().parents[2]

# the tiny cluster has 6 cores (4 + 2) and 16 GB: two queues of 3 cores and 8 GB each
TENANCY = {"queues": [{"name": "research", "nominal": {"cpu": 3, "gpu": 0, "mem": 8}},
                      {"name": "prod", "nominal": {"cpu": 3, "gpu": 0, "mem": 8}, "priority": "high"}],
           "priority_classes": [{"name": "normal", "value": 0}, {"name": "high", "value": 100}]}


@pytest.fixture
def shared_yaml(tmp_path: Path) -> Path:
    """configs/testbed.yaml with the two queues above, as a file (absolute paths)."""
    raw = yaml.safe_load((ROOT / "configs" / "testbed.yaml").read_text())
    base = ROOT / "configs"
    raw["jobtypes"] = str(base / raw["jobtypes"])
    raw["profile"] = str(base / raw["profile"])
    raw["speed"]["surfaces"] = str(base / raw["speed"]["surfaces"])
    raw["tenancy"] = TENANCY
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(raw))
    load_config(path)  # a valid experiment
    return path


def _agent(shared_yaml: Path, tmp_path: Path, cluster: TinyCluster) -> Agent:
    cfg = LiveConfig.model_validate({"live": {"experiment": str(shared_yaml), "scheduler": "drf",
                                              "log_dir": str(tmp_path / "log")}})
    return Agent(cfg, cluster)


def _add(cluster: TinyCluster, name: str, queue_name: str | None, **kw: Any) -> None:
    cluster.add(name, **kw)
    cluster.jobs[name]["spec"]["queue"] = queue_name


def _step(agent: Agent, cluster: TinyCluster) -> None:
    agent.step()
    cluster.slot += 1


def test_a_borrower_is_scaled_down_the_slot_a_queues_job_arrives(shared_yaml: Path, tmp_path: Path) -> None:
    cluster = TinyCluster()
    _add(cluster, "big", "research", epochs=100.0)
    agent = _agent(shared_yaml, tmp_path, cluster)
    _step(agent, cluster)
    _step(agent, cluster)
    rows = {r.name: r for r in agent.queues(cluster.statuses().values())}
    held = (cluster.jobs["big"]["ps"], cluster.jobs["big"]["workers"])
    assert rows["research"].used["cpu"] > 3 and rows["research"].borrowed["cpu"] > 0  # it borrows prod's
    assert rows["prod"].used["cpu"] == 0 and rows["research"].running == 1

    _add(cluster, "late", "prod", epochs=100.0)
    _step(agent, cluster)
    rows = {r.name: r for r in agent.queues(cluster.statuses().values())}
    big, late = cluster.jobs["big"], cluster.jobs["late"]
    assert big["state"] == "running" and big["workers"] >= 1  # shrunk, still training
    assert (big["ps"], big["workers"]) != held
    assert late["state"] == "running" and late["workers"] >= 1  # prod got its quota back in one slot
    assert rows["research"].borrowed == {"cpu": 0.0, "gpu": 0.0, "mem": 0.0}
    assert rows["research"].used["cpu"] <= 3 and rows["prod"].used["cpu"] > 0
    agent.close()


def test_queues_reach_the_dashboard_the_metrics_and_the_wait_reason(shared_yaml: Path,
                                                                    tmp_path: Path) -> None:
    cluster = TinyCluster()
    for name in ("r1", "r2", "r3"):
        _add(cluster, name, "research", epochs=100.0)
    agent = _agent(shared_yaml, tmp_path, cluster)
    agent.metrics.watch_queues(lambda: agent.queues(cluster.statuses().values()))
    _add(cluster, "p1", "prod", epochs=100.0)
    for _ in range(3):
        _step(agent, cluster)
    statuses = list(cluster.statuses().values())
    waits = queue(statuses, agent.last_decision)
    research = next(r for r in agent.queues(statuses) if r.name == "research")
    waiting = [n for n in ("r1", "r2", "r3") if n in waits]
    assert waiting and research.waiting == len(waiting) and research.running == 3 - len(waiting)
    assert all(waits[n]["reason"] == AT_QUOTA for n in waiting), waits
    assert "queue research uses" in waits[waiting[0]]["detail"]

    state = dashboard_state(agent, {"policy_version": None}, statuses)
    assert [q.name for q in state.queues] == ["research", "prod"]
    assert state.queues[0].nominal == {"cpu": 3.0, "gpu": 0.0, "mem": 8.0}
    text = agent.metrics.scrape().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(QUEUE_METRIC_NAMES) <= set(families)
    used = {(s.labels["queue"], s.labels["resource"]): s.value for s in families["dl2ray_queue_used"].samples}
    assert used[("research", "cpu")] == research.used["cpu"]
    jobs = {(s.labels["queue"], s.labels["state"]): s.value for s in families["dl2ray_queue_jobs"].samples}
    assert jobs[("research", "waiting")] == len(waiting) and jobs[("prod", "running")] == 1
    agent.close()


def test_queue_use_and_borrowing_follow_the_allocation() -> None:
    from clusters.agent.views import live_job_view
    from dl2ray.view import Allocation, ClusterView, Tasks

    tenancy = TenancyConfig.model_validate(TENANCY)
    cat = load_config(ROOT / "configs" / "testbed.yaml").catalogue
    spec = parse_jobspec({"name": "a", "job_type": "resnext-110", "queue": "research",
                          "worker": {"cpu": 1, "gpu": 0, "mem": 1}})
    view = ClusterView(0, 10.0, np.array([[8.0, 0, 32]]), np.array([[8.0, 0, 32]]),
                       (live_job_view("a", spec, cat, 0, 0.0, [], [], []),), cat)
    alloc = Allocation({view.jobs[0].job_id: Tasks(workers=3, ps=2)})
    rows = queue_rows(tenancy, view, alloc, [("research", False), (None, True), ("prod", True)])
    research, prod = rows
    assert research.used == {"cpu": 5.0, "gpu": 0.0, "mem": 5.0}
    assert research.borrowed == {"cpu": 2.0, "gpu": 0.0, "mem": 0.0}
    assert (research.jobs, research.running, research.waiting) == (2, 1, 1)  # None: the first queue
    assert (prod.jobs, prod.waiting) == (1, 1) and prod.used["cpu"] == 0
    assert at_quota(np.array([3.0, 0, 8]), np.array([2.5, 0, 1]), np.array([1.0, 0, 1]))
    assert not at_quota(np.array([3.0, 0, 8]), np.array([2.0, 0, 1]), np.array([1.0, 0, 1]))
    assert not at_quota(np.array([3.0, 0, 8]), np.array([2.0, 0, 1]), np.array([1.0, 0.0, 0.0]))


def test_an_unknown_queue_or_priority_is_refused_naming_the_field() -> None:
    tenancy = TenancyConfig.model_validate(TENANCY)
    job = {"name": "a", "job_type": "resnext-110"}
    check_job_queue(tenancy, parse_jobspec({**job, "queue": "prod", "priority": "high"}))
    known = r"\(known: research, prod"
    with pytest.raises(UserError, match=r"^queue: 'nope' is not a queue of this cluster " + known):
        check_job_queue(tenancy, parse_jobspec({**job, "queue": "nope"}))
    with pytest.raises(UserError, match=r"^priority: 'urgent' is not a priority class"):
        check_job_queue(tenancy, parse_jobspec({**job, "priority": "urgent"}))
    with pytest.raises(UserError, match=r"^queue: 'prod' given, but this cluster has no queues"):
        check_job_queue(None, parse_jobspec({**job, "queue": "prod"}))
    with pytest.raises(UserError, match=r"queue: String should match pattern"):
        parse_jobspec({**job, "queue": "no spaces"})


def test_submit_with_an_unknown_queue_exits_2_before_touching_ray(shared_yaml: Path, tmp_path: Path,
                                                                  capsys) -> None:
    live = tmp_path / "live.yaml"
    live.write_text(yaml.safe_dump({"live": {"experiment": str(shared_yaml), "scheduler": "drf",
                                             "log_dir": str(tmp_path / "log")}}))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "a", "job_type": "resnext-110"}))
    for flags, message in ((["--queue", "nope"], "queue: 'nope' is not a queue of this cluster"),
                           (["--queue", "prod", "--priority", "urgent"],
                            "priority: 'urgent' is not a priority")):
        code, _, err = run_cli(capsys, "submit", str(job), "--config", str(live), "--address", "127.0.0.1:1",
                               *flags)  # (an address nobody listens at: the refusal comes first)
        assert code == 2, err
        assert message in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err


def test_a_given_policy_decides_inside_the_queue_layer_and_a_learning_one_is_refused(
        shared_yaml: Path, tmp_path: Path) -> None:
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.schedulers.queued import Queued

    cfg = LiveConfig.model_validate({"live": {"experiment": str(shared_yaml),
                                              "log_dir": str(tmp_path / "l")}})
    drf = make_scheduler("drf", None)
    agent = Agent(cfg, TinyCluster(), "given", policy=drf)
    assert isinstance(agent.scheduler.policy, Queued) and agent.scheduler.policy.inner is drf
    agent.close()

    class Learning:
        name, version = "learning", 3

        def decide(self, view):
            raise AssertionError("never asked")

    with pytest.raises(UserError, match="learning on a cluster with queues"):
        Agent(cfg, TinyCluster(), "learning", policy=Learning())
