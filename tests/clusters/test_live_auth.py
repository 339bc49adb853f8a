"""A live cluster as a Ray user meets it (slow; each test starts real Ray heads in processes of their own):
``cluster up`` keeps Ray's token authentication on, requests without the token are refused, ``ray job
submit --working-dir DIR -- dl2ray submit job.yaml`` works from a shell without the virtual environment,
every ``dl2ray`` command finds the token by itself; and one tiny ``bench live-demo`` run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import wait_for

from clusters.ray.auth import create_token, export_line

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def tiny_job(name: str, **change: Any) -> dict[str, Any]:
    raw = {"name": name, "job_type": "resnext-110", "model": "mlp", "epochs": 1, "samples": 128,
           "global_batch": 32, "worker": {"cpu": 0.25, "gpu": 0, "mem": 0.1}, "ps": {"cpu": 0.25, "gpu": 0,
           "mem": 0.1}, "workers": {"min": 1, "max": 1}, "ps_count": {"min": 1, "max": 1}, "seed": 1}
    return {**raw, **change}


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell: no Ray address or token settings, and the project's virtual environment not on
    PATH (not activated)."""
    drop = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN)
    return {**env, **extra}


def run(*cmd: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def dl2ray(*args: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return run(str(VENV_BIN / "dl2ray"), *args, env=env, cwd=cwd, timeout=timeout)


def test_the_token_file_is_the_users_alone_and_fresh_each_time(tmp_path: Path) -> None:
    path = create_token(tmp_path / "log" / "auth_token")
    first = path.read_text()
    assert len(first) == 64 and int(first, 16) >= 0  # 256 bits, hex
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    assert create_token(path).read_text() != first and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert export_line(path) == f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={path}"


@pytest.fixture
def cluster(tmp_path: Path):
    """``dl2ray cluster up`` from a user's shell with a config of its own (2-s slots, DRF); ``cluster down``
    at the end (by the pid it recorded)."""
    cfg = tmp_path / "live.yaml"
    cfg.write_text(yaml.safe_dump({"live": {
        "experiment": str(ROOT / "configs" / "testbed.yaml"), "scheduler": "drf", "slot_seconds": 2,
        "ray": {"num_cpus": 2, "dashboard_port": 8275}, "guardrail": {"time_budget_s": 30},
        "log_dir": str(tmp_path / "log")}}))
    env = user_env(RAY_raylet_start_wait_time_s="180")
    up = dl2ray("cluster", "up", "--config", str(cfg), "--json", env=env, cwd=tmp_path)
    assert up.returncode == 0, up.stderr[-3000:]
    state = json.loads(up.stdout)
    try:
        yield cfg, state, env
    finally:
        down = dl2ray("cluster", "down", "--config", str(cfg), env=env, cwd=tmp_path)
        assert down.returncode == 0, down.stderr[-3000:]
        assert not Path(state["auth"]["token_path"]).exists()  # the token goes with the cluster


@pytest.mark.slow
def test_token_auth_stays_on_and_ray_users_submit_with_relative_paths(cluster, tmp_path: Path) -> None:
    import requests

    cfg, state, env = cluster
    token_path = Path(state["auth"]["token_path"])
    assert state["auth"]["mode"] == "token" and token_path.parent == tmp_path / "log"
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    assert state["export"] == export_line(token_path)
    token = token_path.read_text().strip()
    url = state["dashboard"]
    # the Jobs API: refused without the token and with a wrong one, answered with it
    assert requests.get(f"{url}/api/jobs/", timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer " + "0" * 64}
    assert requests.get(f"{url}/api/jobs/", headers=wrong, timeout=60).status_code == 403
    assert requests.get(f"{url}/api/jobs/", headers={"Authorization": f"Bearer {token}"}, timeout=60).ok
    # the GCS: a driver with a wrong token is refused, with the right one it connects
    probe = f"from clusters.runtime import connect; print(len(connect({state['address']!r}).nodes()))"
    for tok, ok in (("0" * 64, False), (token, True)):
        p = run(sys.executable, "-c", probe, env=user_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=tok),
                cwd=tmp_path, timeout=300)
        assert (p.returncode == 0) == ok, p.stderr[-2000:]
        if not ok:
            assert "Unauthenticated" in p.stderr and "cannot connect to Ray" in p.stderr

    # `ray job submit` as Ray users write it: the printed export line, a working dir, a relative path,
    # `dl2ray` found on the cluster (this shell's PATH lacks the virtual environment)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.yaml").write_text(yaml.safe_dump(tiny_job("auth-a")))
    exported = dict(kv.split("=", 1) for kv in state["export"].removeprefix("export ").split())
    sub = run(str(VENV_BIN / "ray"), "job", "submit", "--address", url, "--working-dir", "work", "--",
              "dl2ray", "submit", "job.yaml", env={**env, **exported}, cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    assert "auth-a: finished after" in sub.stdout and "succeeded" in sub.stdout

    # `dl2ray submit --address URL`: through the Jobs API, the token found in cluster.json
    (tmp_path / "job-b.yaml").write_text(yaml.safe_dump(tiny_job("auth-b")))
    b = dl2ray("submit", "job-b.yaml", "--address", url, "--config", str(cfg), env=env, cwd=tmp_path)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    assert "submitted Ray job raysubmit_" in b.stdout and "auth-b: finished after" in b.stdout
    again = dl2ray("submit", "job-b.yaml", "--address", url, "--config", str(cfg), env=env, cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stdout  # the entrypoint's exit code

    # the other commands find the cluster and its token by themselves
    jobs = dl2ray("jobs", "list", "--config", str(cfg), "--json", env=env, cwd=tmp_path)
    assert jobs.returncode == 0, jobs.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(jobs.stdout)["jobs"]}
    assert rows["auth-a"]["state"] == rows["auth-b"]["state"] == "finished"
    assert rows["auth-a"]["wait_reason"] is None  # a finished job does not wait
    st = dl2ray("cluster", "status", "--config", str(cfg), "--json", env=env, cwd=tmp_path)
    assert st.returncode == 0 and json.loads(st.stdout)["jobs"] == {"finished": 2}, st.stderr[-3000:]


@pytest.mark.slow
def test_a_waiting_jobs_place_and_reason_reach_jobs_list_and_status(cluster, tmp_path: Path) -> None:
    cfg, _, env = cluster
    # 2 CPUs: the first job takes 1.5 of them, the second needs 1 for its minimum
    big = tiny_job("big", epochs=2000, sample_delay_s=0.01, worker={"cpu": 1.0, "gpu": 0, "mem": 0.1},
                   ps={"cpu": 0.5, "gpu": 0, "mem": 0.1})
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    (tmp_path / "next.yaml").write_text(yaml.safe_dump(tiny_job(
        "next", worker={"cpu": 0.5, "gpu": 0, "mem": 0.1}, ps={"cpu": 0.5, "gpu": 0, "mem": 0.1})))
    for f in ("big.yaml", "next.yaml"):
        p = dl2ray("submit", f, "--no-follow", "--config", str(cfg), env=env, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
    def waiting_for_room():
        p = dl2ray("jobs", "list", "--config", str(cfg), "--json", env=env, cwd=tmp_path)
        rows = {r["name"]: r for r in json.loads(p.stdout)["jobs"]} if p.returncode == 0 else {}
        ok = rows.get("big", {}).get("workers") == 1 and rows.get("next", {}).get("wait_reason") in (
            "no free resources", "min demand does not fit")
        return rows if ok else None

    rows = wait_for("next waits for room while big runs", waiting_for_room, timeout_s=600, poll_s=2)
    assert rows["next"]["queue_position"] == 1 and rows["next"]["waiting"] == 1
    assert rows["big"]["queue_position"] is None
    st = dl2ray("jobs", "status", "next", "--config", str(cfg), "--json", env=env, cwd=tmp_path)
    q = json.loads(st.stdout)["queue"]
    assert q["position"] == 1 and q["reason"] in ("no free resources", "min demand does not fit")
    table = dl2ray("jobs", "list", "--config", str(cfg), env=env, cwd=tmp_path)
    assert table.returncode == 0 and "1/1" in table.stdout  # the queue column of the table
    assert dl2ray("jobs", "cancel", "big", "--config", str(cfg), env=env, cwd=tmp_path).returncode == 0


@pytest.mark.slow
def test_one_tiny_fair_live_comparison(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("fair-a", "fair-b"):
        (jobs / f"{name}.yaml").write_text(yaml.safe_dump(tiny_job(name)))
    p = dl2ray("bench", "live-demo", "--schedulers", "drf", "--repeats", "2", "--jobs", str(jobs),
               "--slot-seconds", "2", "--stagger", "3", "--seed", "5", "--out", str(tmp_path / "out"),
               "--json",
               env=user_env(RAY_raylet_start_wait_time_s="180"), cwd=ROOT, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    offsets = doc["schedule"]["offsets_s"]
    assert offsets[0] == 0.0 and len(offsets) == 2
    assert [[j["offset_s"] for j in r["jobs"]] for r in doc["runs"]] == [offsets, offsets]  # the same times
    for r in doc["runs"]:
        assert r["finished"] == 2 and r["entrypoints"] == {}
        assert all(j["submitted_s"] >= j["offset_s"] for j in r["jobs"])  # never before its time
    s = doc["summary"]["drf"]
    assert s["runs"] == 2 and s["finished"] == "4/4" and len(s["avg_jct_s"]["per_run"]) == 2
    assert s["avg_jct_s"]["min"] <= s["avg_jct_s"]["mean"] <= s["avg_jct_s"]["max"]
