"""A federation's ``k8s`` member: ``federation up`` starts the Kubernetes agent loop (a Ray actor in the
learner's Ray, the session's) against the emulator's kubeconfig context; it schedules a DL2Job with the
federation's policy (serve-only: pulled weights, greedy decisions, applied) and the test kubelet runs the
pods; ``status`` shows the member, ``down`` stops it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from k8s_support import REPO, small_job
from support import wait_for

from clusters.agent.views import job_id_of

CHECKPOINT = REPO / "models" / "dl2-testbed-paper.pt"  # the policy configs/federation.yaml starts from


def _files(tmp: Path, kubeconfig: Path, address: str, mode: str) -> Path:
    k8s = {"kubernetes": {
        "experiment": str(REPO / "configs" / "testbed.yaml"), "slot_seconds": 2, "namespace": "default",
        "kubeconfig": str(kubeconfig), "log_dir": str(tmp / "k8s"),
        "api": {"timeout_s": 2, "attempts": 6, "backoff_s": 0.05, "backoff_max_s": 0.5},
        "pods": {"ready_timeout_s": 60, "release_timeout_s": 20, "heartbeat_timeout_s": 3},
        # hang protection only: under load the policy's first decision (cold compile) may take a minute
        "guardrail": {"fallback": "drf", "time_budget_s": 600}}}
    (tmp / "k8s.yaml").write_text(yaml.safe_dump(k8s))
    fed = {"name": "kf", "learner": {
        "config": str(REPO / "configs" / "testbed.yaml"), "init": str(CHECKPOINT), "out": str(tmp / "out"),
        "ray": {"address": address}, "http": {"enabled": False}},
        "members": [{"name": "kube", "mode": mode, "pull_interval_s": 1.0,
                     "backend": {"kind": "k8s", "context": "kmock", "config": str(tmp / "k8s.yaml")}}]}
    path = tmp / "fed.yaml"
    path.write_text(yaml.safe_dump(fed))
    return path


def _decisions(log_dir: Path) -> list[dict]:
    path = log_dir / "decisions.parquet"
    return pq.read_table(path).to_pylist() if path.is_file() else []


def _policy_slots(log_dir: Path, job_id: int) -> list[dict]:
    """Decision-log rows where the policy's allocation was applied and gave the job workers."""
    return [r for r in _decisions(log_dir) if r["applied"] == "policy"
            and json.loads(r["policy_alloc"] or "{}").get(str(job_id), [0, 0])[1] > 0]


@pytest.mark.ray
@pytest.mark.slow
def test_k8s_member_schedules_a_dl2job_with_the_federations_policy(ray_session, cluster, tmp_path):
    from clusters.federation.config import load_federation
    from clusters.federation.deploy import down, names, status, up
    from clusters.runtime import NAMESPACE

    ray = ray_session
    path = _files(tmp_path, cluster.emu.kubeconfig(tmp_path / "kubeconfig"),
                  ray.get_runtime_context().gcs_address, "serve-only")
    fed = load_federation(path)
    try:
        up(path, wait_s=240)
        actor = ray.get_actor("fed-kf-member-kube", namespace=NAMESPACE)
        cluster.apply_job(small_job("fedjob", epochs=20))
        job_id = job_id_of("fedjob")
        def decided() -> int:  # slots the agent has decided: the progress the waits count
            return len(_decisions(tmp_path / "k8s"))

        slots = wait_for("a slot where the policy's allocation started the job",
                         lambda: _policy_slots(tmp_path / "k8s", job_id), poll_s=1, progress=decided,
                         within=10)
        assert slots[0]["policy"] == "federation-serve-only"
        assert wait_for("its worker pods", lambda: cluster.live("fedjob", "worker"), progress=decided)
        st = ray.get(actor.status.remote())
        assert st["context"] == "kmock" and st["running"] and st["slots_done"] >= 1
        assert st["errors"] == {} and st["guardrail_fallbacks"] == {}
        assert st["policy"]["joins"] == 1 and st["policy"]["pushed"] == 0  # serve-only: pulls, never pushes
        m = status(path)["members"][0]
        assert m["backend"] == "k8s" and m["mode"] == "serve-only" and m["joins"] == 1
        assert m["last_contact_s"] is not None and m["updates"] == 0 and m["val_jct"] is None
        assert m["validation"].startswith("none: a live cluster")
        down(path)
        with pytest.raises(ValueError):
            ray.get_actor("fed-kf-member-kube", namespace=NAMESPACE)
        assert cluster.live("fedjob", "worker")  # the job's pods stay; the next agent adopts them
    finally:
        import contextlib

        for name in names(fed).values():
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
