"""Queues on live Ray (issue 40, item 4): configs/live-shared.yaml's agent on the session's local Ray
(2 CPUs), real elastic MXNet jobs. A job of one queue borrows the other queue's quota; when a job of that
queue arrives, the borrower is scaled down hot within its own quota and trains on (never paused), the new
job trains, and ``dl2ray queues list`` / ``jobs list`` show it; a job naming an unknown queue is refused.
The seconds are ``dl2ray bench live-reclaim``'s (docs/BENCHMARKS.md), not this test's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_cli

from clusters.cli.live_bench import reclaim_specs, reclaim_trial
from clusters.ray.config import load_live_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_agent(ray_session, tmp_path):
    from clusters.cli.live import start_agent
    from clusters.ray.agent import teardown

    cfg = load_live_config(ROOT / "configs" / "live-shared.yaml")
    cfg = cfg.with_agent(slot_seconds=2.0, log_dir=str(tmp_path / "live"),
                         guardrail=cfg.live.guardrail.model_copy(update={"time_budget_s": 600.0}))
    handle = start_agent(cfg)
    yield ray_session, handle, cfg
    teardown(cfg.live.agent_name)


@pytest.mark.ray
@pytest.mark.slow
def test_a_queues_job_gets_its_quota_back_from_a_borrower_that_trains_on(shared_agent, capsys) -> None:
    ray, agent, cfg = shared_agent
    tenancy = cfg.experiment().tenancy
    assert tenancy is not None
    quota = tenancy.queue("research").nominal.cpu

    bad = reclaim_specs(99, "prod", "research")[0] | {"queue": "nope"}
    res = ray.get(agent.submit.remote(bad))
    assert not res["ok"] and res["error"].startswith("queue: 'nope' is not a queue of this cluster")

    row = reclaim_trial(ray, agent, 0, quota)
    ps, workers = row["borrowed"]
    assert 0.3 * (ps + workers) > quota  # it borrowed
    ps, workers = row["after"]
    assert 0.3 * (ps + workers) <= quota and workers >= 1  # back within its quota, still training
    assert not row["borrower_paused"] and row["borrower_epochs_after"]
    assert row["quota_back_s"] > 0 and row["arrival_training_s"] > 0

    # the queues and the jobs' queues, as a user lists them
    code, out, err = run_cli(capsys, "queues", "list", "--config", str(ROOT / "configs" / "live-shared.yaml"),
                             "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["queues"]}
    assert set(rows) == {"research", "prod"} and rows["prod"]["nominal"]["cpu"] == 1.0
    code, out, err = run_cli(capsys, "jobs", "list", "--config", str(ROOT / "configs" / "live-shared.yaml"),
                             "--json")
    assert code == 0, err
    queues = {j["name"]: j["job_queue"] for j in json.loads(out)["jobs"]}
    assert queues == {"borrower-0": "research", "arrival-0": "prod"}
