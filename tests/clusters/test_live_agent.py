"""The live agent actor on the session's local Ray: configs/live-local.yaml (its DL2 policy behind the
guardrail) scheduling real jobs; killed mid-run, it restarts, adopts the running jobs and starts no
duplicate members; bad job specs are refused naming the field while everything else goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_cli, wait_for
from test_live import small_spec

from clusters.ray.config import load_live_config

ROOT = Path(__file__).resolve().parents[2]
PAPER_CHECKPOINT = ROOT / "models" / "dl2-testbed-paper.pt"


@pytest.fixture
def agent(ray_session, tmp_path, request):
    from clusters.cli.live import start_agent
    from clusters.ray.agent import teardown

    cfg = load_live_config(ROOT / "configs" / "live-local.yaml")
    mode = getattr(request, "param", "")
    learning = mode.startswith("learn")
    learn = cfg.live.learn.model_copy(update={"enabled": learning, "steps_per_update": 4})
    # "learn": the paper's architecture; "learn-shape": the shipped shape policy (dl2-testbed.pt)
    scheduler = f"dl2:{PAPER_CHECKPOINT}" if mode == "learn" else cfg.live.scheduler
    cfg = cfg.model_copy(
        update={"live": cfg.live.model_copy(update={"learn": learn, "shadow": mode == "shadow",
                                                     "scheduler": scheduler})}
    )
    cfg = cfg.model_copy(
        update={
            "live": cfg.live.model_copy(
                update={
                    "slot_seconds": 2.0,
                    "log_dir": str(tmp_path / "live"),
                    # hang protection only: a loaded machine must not turn a decision into a fallback
                    "guardrail": cfg.live.guardrail.model_copy(update={"time_budget_s": 600.0}),
                }
            )
        }
    )
    handle = start_agent(cfg)
    yield ray_session, handle, tmp_path / "live"
    teardown(cfg.live.agent_name)


def _slots(ray, handle) -> int:
    """Slots the agent has stepped (the progress its waits count)."""
    try:
        return ray.get(handle.status.remote(), timeout=60)["slots_done"]
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return -1  # restarting


def _epochs(ray, handle) -> float:
    return sum(j["epochs_done"] for j in ray.get(handle.jobs.remote()))


def _asked(actions: list[dict]) -> int:
    """Members a job's scale calls asked for beyond the deployment they found: each call's positive
    steps of (ps, workers) over the last successful one (a failed call leaves the deployment as it was)."""
    ps = workers = asked = 0
    for a in actions:
        asked += max(a["ps"] - ps, 0) + max(a["workers"] - workers, 0)
        if a["ok"]:
            ps, workers = a["ps"], a["workers"]
    return asked


@pytest.mark.ray
@pytest.mark.slow
def test_agent_killed_mid_run_restarts_adopts_jobs_without_duplicates(agent) -> None:
    ray, handle, log_dir = agent
    specs = [small_spec("adopt-a", epochs=16), small_spec("adopt-b", epochs=16, seed=4)]
    for spec in specs:
        assert ray.get(handle.submit.remote(spec.model_dump(mode="json")))["ok"]
    wait_for(
        "both jobs to run",
        lambda: all(
            j["state"] == "running" and j["workers"] > 0 and not j["busy"]
            for j in ray.get(handle.jobs.remote())
        ),
        progress=lambda: _slots(ray, handle),
    )
    pid = ray.get(handle.pid.remote())

    ray.kill(handle, no_restart=False)
    st = wait_for("the agent to come back", lambda: _status_after_restart(ray, handle, pid))
    assert st["restarted"] == 1 and st["adopted"] == 2

    slots = st["slots_done"]
    wait_for("two slots of the restarted agent", lambda: _slots(ray, handle) >= slots + 2,
             progress=lambda: _slots(ray, handle))
    for j in ray.get(handle.jobs.remote()):
        if j["state"] == "running" and not j["busy"] and j["operation"] is None:
            assert len(j["members"]) == j["ps"] + j["workers"], j["members"]  # no extra member actors

    # a bad spec is refused with the field named; the agent and the jobs go on
    bad = specs[0].model_dump(mode="json") | {"name": "huge", "worker": {"cpu": 64, "gpu": 0, "mem": 1}}
    res = ray.get(handle.submit.remote(bad))
    assert not res["ok"] and res["error"].startswith("worker: demand")

    done = wait_for(
        "every job to finish",
        lambda: (
            (jobs := ray.get(handle.jobs.remote())) and all(j["state"] == "finished" for j in jobs) and jobs
        ),
        progress=lambda: _epochs(ray, handle),
    )
    assert sorted(j["name"] for j in done) == ["adopt-a", "adopt-b"]
    for j in done:
        assert j["spawned"] <= _asked(j["actions"]), j["actions"]  # no member started twice
        assert all(e["lost_iterations"] == 0 for e in j["events"])
        assert not any(e["change"].startswith("recover") for e in j["events"])
    st = ray.get(handle.status.remote())
    assert st["errors"] == {} and st["slots_done"] >= 1
    assert (log_dir / "decisions.parquet").is_file()


def _status_after_restart(ray, handle, old_pid: int):
    try:
        if ray.get(handle.pid.remote(), timeout=10) == old_pid:
            return None  # ray.kill is asynchronous: the old process may still answer
        return ray.get(handle.status.remote(), timeout=30)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return None


def test_submit_refuses_a_bad_spec_with_exit_2_before_touching_ray(tmp_path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text(
        (ROOT / "examples" / "jobs" / "mlp-small.yaml").read_text().replace("epochs: 12", "epochs: 0")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "dl2ray", "submit", str(bad), "--address", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "epochs: Input should be greater than 0" in proc.stderr and "Traceback" not in proc.stderr


def test_submit_without_a_cluster_says_so(tmp_path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dl2ray",
            "submit",
            str(ROOT / "examples/jobs/mlp-small.yaml"),
            "--config",
            str(tmp_path / "none.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert proc.returncode == 2 and "no Ray cluster" in proc.stderr


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("agent", ["learn"], indirect=True)
def test_learning_agent_pushes_live_gradients_to_the_global_policy(agent) -> None:
    ray, handle, log_dir = agent
    spec = small_spec("learner", epochs=12)
    assert ray.get(handle.submit.remote(spec.model_dump(mode="json")))["ok"]
    gp = ray.get_actor("dl2ray-global-policy", namespace="dl2ray")
    st = wait_for(
        "two live gradients applied",
        lambda: (s := ray.get(handle.status.remote()))["learn"]["pushed"] >= 2 and s,
        progress=lambda: _slots(ray, handle),
    )
    assert st["policy_version"] >= 1  # the agent decides with weights pulled after its pushes
    stats = ray.get(gp.stats.remote())
    assert stats["per_agent"].get(1000, 0) >= 2 and stats["updates"] >= 2
    assert (log_dir / "global-policy.pt").is_file()
    assert ray.get(handle.cancel.remote("learner"))["ok"]
    assert ray.get(handle.job.remote("learner"))["state"] == "cancelled"


def test_live_learning_needs_a_dl2_checkpoint_of_either_architecture() -> None:
    from clusters.a3c.live import _policy_path
    from dl2ray.errors import UserError

    assert _policy_path(f"dl2:{PAPER_CHECKPOINT}") == PAPER_CHECKPOINT
    assert _policy_path(f"dl2:{ROOT / 'models' / 'dl2-testbed.pt'}") == ROOT / "models" / "dl2-testbed.pt"
    with pytest.raises(UserError, match=r"--learn needs the dl2 scheduler"):
        _policy_path("drf")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("agent", ["learn-shape"], indirect=True)
def test_learning_agent_improves_the_shipped_shape_policy_from_live_jobs(agent) -> None:
    """The shipped policy decides live MXNet jobs greedily; the twin of what the cluster showed gives
    the pushes; the global policy's version advances, nothing is refused, no job is lost."""
    ray, handle, log_dir = agent
    specs = [small_spec(f"shape-{i}", epochs=8) for i in range(2)]
    for spec in specs:
        assert ray.get(handle.submit.remote(spec.model_dump(mode="json")))["ok"]
    gp = ray.get_actor("dl2ray-global-policy", namespace="dl2ray")
    st = wait_for(
        "two live pushes of the shape policy applied",
        lambda: (s := ray.get(handle.status.remote()))["learn"]["pushed"] >= 2 and s,
        progress=lambda: _slots(ray, handle),
    )
    assert st["learn"]["errors"] == 0 and st["learn"]["twin_traces"] >= 2
    assert st["policy_version"] >= 1  # the agent decides with the weights its pushes brought back
    stats = ray.get(gp.stats.remote())
    assert stats["per_agent"].get(1000, 0) >= 2 and stats["refused"] == {}
    assert (log_dir / "global-policy.pt").is_file()
    done = wait_for("both jobs finished", lambda: all(
        ray.get(handle.job.remote(s.name))["state"] == "finished" for s in specs),
        progress=lambda: _slots(ray, handle))
    assert done


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("agent", ["shadow"], indirect=True)
def test_shadow_mode_applies_drf_and_logs_what_the_policy_would_have_done(agent, capsys) -> None:
    from clusters.agent.report import live_report

    ray, handle, log_dir = agent
    spec = small_spec("shadowed", epochs=8)
    assert ray.get(handle.submit.remote(spec.model_dump(mode="json")))["ok"]
    wait_for(
        "the job to finish",
        lambda: ray.get(handle.job.remote("shadowed"))["state"] == "finished",
        progress=lambda: _epochs(ray, handle),
    )
    st = ray.get(handle.status.remote())
    assert st["shadow"] and st["guardrail_fallbacks"] == {}
    rep = live_report(log_dir)
    assert rep["decisions"] >= 2 and rep["applied_policy"] == 0
    assert rep["applied_fallback"] == rep["decisions"] == rep["compared_slots"]
    assert rep["fallback_reasons"] == {"shadow": rep["decisions"]}

    # the CLI on the same cluster (this process's driver)
    code, out, _ = run_cli(capsys, "jobs", "list", "--json")
    assert code == 0 and [(j["name"], j["state"]) for j in json.loads(out)["jobs"]] == [
        ("shadowed", "finished")
    ]
    code, out, _ = run_cli(capsys, "jobs", "status", "shadowed", "--json")
    assert code == 0 and json.loads(out)["events"][0]["change"] == "start"
    code, out, _ = run_cli(capsys, "cluster", "status", "--json")
    assert code == 0 and json.loads(out)["shadow"] is True
    code, out, _ = run_cli(capsys, "cluster", "report", "--json", "--log-dir", str(log_dir))
    assert code == 0 and json.loads(out)["applied_fallback"] >= rep["decisions"]
    code, out, _ = run_cli(capsys, "jobs", "cancel", "shadowed", "--json")
    assert code == 1 and "finished" in json.loads(out)["reason"]
    code, _, err = run_cli(capsys, "jobs", "status", "nosuchjob")
    assert code == 2 and "no job named 'nosuchjob'" in err
