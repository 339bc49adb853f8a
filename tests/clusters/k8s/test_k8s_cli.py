"""The entry points: ``dl2ray cluster up --config <kubernetes config>`` runs the agent,
``dl2ray submit --k8s`` creates a DL2Job that trains to the end; user errors exit 2 with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_support import REPO
from support import run_cli, wait_for

JOB = {
    "name": "tiny",
    "job_type": "resnext-110",
    "model": "mlp",
    "epochs": 3,
    "samples": 64,
    "global_batch": 16,
    "worker": {"cpu": 0.25, "gpu": 0, "mem": 0.25},
    "ps": {"cpu": 0.25, "gpu": 0, "mem": 0.25},
    "workers": {"min": 1, "max": 2},
    "ps_count": {"min": 1, "max": 1},
    "seed": 0,
}


def k8s_config(tmp: Path, kubeconfig: Path | str, **over) -> Path:
    raw = {
        "experiment": str(REPO / "configs" / "testbed.yaml"),
        "scheduler": "drf",
        "slot_seconds": 2,
        "namespace": "default",
        "kubeconfig": str(kubeconfig),
        "log_dir": str(tmp / "runs"),
        "api": {"timeout_s": 2, "attempts": 3, "backoff_s": 0.05, "backoff_max_s": 0.2},
        "pods": {"heartbeat_timeout_s": 3},
    }
    raw.update(over)
    path = tmp / "k8s.yaml"
    path.write_text(yaml.safe_dump({"kubernetes": raw}))
    return path


@pytest.mark.slow
def test_cluster_up_runs_the_agent_and_a_submitted_job_trains_to_the_end(cluster, tmp_path, capsys):
    config = k8s_config(tmp_path, cluster.emu.kubeconfig(tmp_path / "kubeconfig"))
    log = (tmp_path / "agent.log").open("wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "dl2ray", "cluster", "up", "--config", str(config)],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for("the agent to come up", lambda: b"agent up" in (tmp_path / "agent.log").read_bytes())
        job = tmp_path / "tiny.yaml"
        job.write_text(yaml.safe_dump(JOB))
        code, out, err = run_cli(
            capsys, "submit", "--k8s", str(job), "--config", str(config), "--poll", "0.5"
        )
        assert code == 0, (out, err, (tmp_path / "agent.log").read_text()[-3000:])
        assert "submitted DL2Job tiny" in out and out.strip().splitlines()[-1].startswith("Succeeded")
        st = cluster.job("tiny")["status"]
        assert st["phase"] == "Succeeded" and st["epochsDone"] == 3
        assert any(h["workers"] > 0 for h in st["history"])
        wait_for(
            "the finished job's members to go",
            lambda: all(p.metadata.labels["dl2ray.io/role"] == "coordinator" for p in cluster.pods("tiny")),
        )
        assert cluster.duplicates() == [] and cluster.orphans() == []
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)
        log.close()
    assert agent.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]


def test_submit_k8s_of_a_bad_spec_exits_2_naming_the_field(tmp_path, capsys):
    job = tmp_path / "bad.yaml"
    job.write_text(yaml.safe_dump({**JOB, "global_batch": 128}))
    config = k8s_config(tmp_path, tmp_path / "never-read")
    code, _out, err = run_cli(capsys, "submit", "--k8s", str(job), "--config", str(config))
    assert code == 2 and err.count("\n") == 1 and "global_batch" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("kubeconfig", "message"),
    [("missing", "kubernetes.kubeconfig"), ("unreachable", "cannot reach the Kubernetes API server")],
)
def test_cluster_up_user_errors_exit_2_with_one_line(tmp_path, capsys, kubeconfig, message):
    path = tmp_path / "kubeconfig"
    if kubeconfig == "unreachable":  # a port nobody listens on
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "x",
                    "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
                    "users": [{"name": "x", "user": {}}],
                    "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
                }
            )
        )
    config = k8s_config(tmp_path, path)
    code, _out, err = run_cli(capsys, "cluster", "up", "--config", str(config))
    assert code == 2, err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_the_shipped_k8s_config_loads():
    from clusters.k8s.config import is_k8s_config, load_k8s_config

    path = REPO / "configs" / "k8s-cluster.yaml"
    assert is_k8s_config(path) and not is_k8s_config(REPO / "configs" / "live-local.yaml")
    cfg = load_k8s_config(path)
    assert cfg.kubernetes.namespace == "default" and cfg.experiment().catalogue.names
