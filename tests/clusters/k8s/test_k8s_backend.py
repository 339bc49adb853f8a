"""KubernetesBackend against a local API server over real HTTP (kmock's emulator), with the test kubelet
running every pod's command, so a real elastic MXNet job trains behind the pods."""

from __future__ import annotations

import asyncio

import pytest
from k8s_support import small_job
from support import wait_for

from clusters.agent.views import job_id_of
from clusters.k8s import objects as ko

pytestmark = pytest.mark.slow

WRITES = ("create", "patch", "delete")


def writes(calls) -> int:
    return sum(calls[v] for v in WRITES)


def status(cluster, name: str) -> dict:
    """The DL2Job's status after a snapshot (the backend writes status when it reads the world)."""
    cluster.backend.snapshot()
    return cluster.job(name)["status"]


def node_of(cluster, name: str) -> str:
    return cluster.core.read_namespaced_pod(name, "default").spec.node_name


def test_submit_places_pods_on_the_allocated_nodes_scales_up_then_down(cluster):
    cluster.apply_job(small_job("mlp-a"))
    view, report = cluster.slot({"mlp-a": (1, 1)}, {"mlp-a": (["node-b"], ["node-a"])})
    assert [j.job_id for j in view.jobs] == [job_id_of("mlp-a")]  # submitted, not started: in the view
    assert report.errors == [] and report.actions[0].reason == "started"
    assert node_of(cluster, "mlp-a-ps-0") == "node-b" and node_of(cluster, "mlp-a-worker-0") == "node-a"
    assert node_of(cluster, "mlp-a-coordinator") == "node-b"  # beside its first PS
    for pod in cluster.pods("mlp-a"):
        assert pod.status.phase == "Running"
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    assert cluster.plan("mlp-a") == (1, 1)

    # scale up: the new pod on the allocation's node, Ready before the coordinator takes it in
    view, report = cluster.slot({"mlp-a": (1, 2)}, {"mlp-a": (["node-b"], ["node-a", "node-b"])})
    assert view.jobs[0].workers == 1 and view.jobs[0].worker_nodes == (0,)
    assert report.errors == [] and report.actions[0].created == ["mlp-a-worker-1"]
    assert node_of(cluster, "mlp-a-worker-1") == "node-b"
    assert cluster.plan("mlp-a") == (1, 2)

    # the same allocation again: reads only, no write at all (same slot or not)
    before = dict(cluster.backend.api.calls)
    view, report = cluster.slot({"mlp-a": (1, 2)})
    after = cluster.backend.api.calls
    assert report.actions == [] and view.jobs[0].workers == 2
    assert writes(after) - sum(before.get(v, 0) for v in WRITES) <= 1  # at most the slot's status history
    before = dict(after)
    cluster.backend.apply(cluster_alloc(cluster, {"mlp-a": (1, 2)}))
    assert writes(cluster.backend.api.calls) == sum(before.get(v, 0) for v in WRITES)

    # scale down: the coordinator first (the released worker exits on its own, code 0), then its pod goes
    epochs = view.jobs[0].done_epochs
    view, report = cluster.slot({"mlp-a": (1, 1)})
    (action,) = report.actions
    assert action.ok and action.target == (1, 1) and len(action.deleted) == 1
    released = action.deleted[0]
    assert cluster.kubelet.exits[released] == 0  # exited after the scale, not killed by the delete
    assert cluster.live("mlp-a", "worker") == sorted({"mlp-a-worker-0", "mlp-a-worker-1"} - {released})
    st = wait_for(
        "the status to show the scale-down",
        lambda: (
            (s := status(cluster, "mlp-a"))
            and any(e["change"] == "remove_worker" for e in s.get("scalingEvents", []))
            and s
        ),
    )
    assert all(e["lostIterations"] == 0 for e in st["scalingEvents"])  # no training step lost
    view = cluster.backend.snapshot()
    assert view.jobs[0].workers == 1 and view.jobs[0].done_epochs >= epochs
    assert st["workers"]["desired"] == 1 and st["phase"] == "Running"
    assert cluster.duplicates() == [] and cluster.orphans() == []


def cluster_alloc(cluster, alloc):
    from dl2ray.view import Allocation, Tasks

    return Allocation({job_id_of(j): Tasks(workers=w, ps=p) for j, (p, w) in alloc.items()})


def test_suspend_pauses_with_one_ps_and_resume_goes_on_from_there(cluster):
    cluster.apply_job(small_job("mlp-s"))
    cluster.slot({"mlp-s": (1, 2)})
    assert cluster.plan("mlp-s") == (1, 2)
    wait_for("some training", lambda: cluster.backend.snapshot().jobs[0].done_epochs > 0.5)

    cluster.patch_job("mlp-s", {"suspend": True})
    view, report = cluster.slot({"mlp-s": (1, 2)})  # whatever the scheduler says: suspended runs no workers
    assert view.jobs == ()  # not offered to the scheduler
    assert report.actions[0].target == (1, 0) and report.actions[0].ok
    assert cluster.live("mlp-s", "worker") == [] and cluster.live("mlp-s", "ps") == ["mlp-s-ps-0"]
    cluster.backend.snapshot()
    st = cluster.job("mlp-s")["status"]
    assert st["phase"] == "Suspended" and st["workers"]["ready"] == 0
    assert {c["type"]: c["status"] for c in st["conditions"]}["Suspended"] == "True"
    paused_at = st["epochsDone"]
    assert paused_at > 0.5

    cluster.patch_job("mlp-s", {"suspend": False})
    view, report = cluster.slot({"mlp-s": (1, 1)})
    assert [j.job_id for j in view.jobs] == [job_id_of("mlp-s")]
    assert report.actions[0].ok and cluster.plan("mlp-s") == (1, 1)
    wait_for("training to go on", lambda: cluster.backend.snapshot().jobs[0].done_epochs > paused_at)
    assert cluster.job("mlp-s")["status"]["phase"] == "Running"
    assert cluster.duplicates() == [] and cluster.orphans() == []


def test_agent_restart_adopts_running_jobs_without_touching_them(cluster):
    cluster.apply_job(small_job("mlp-r"))
    cluster.slot({"mlp-r": (1, 2)})
    wait_for("some training", lambda: cluster.backend.snapshot().jobs[0].done_epochs > 0)
    names = sorted(p.metadata.name for p in cluster.pods("mlp-r"))
    cluster.backend.close()
    cluster.backend = cluster.new_backend()  # the agent restarted: nothing carried over but the cluster
    view, report = cluster.slot({"mlp-r": (1, 2)})
    (job,) = view.jobs
    assert (job.ps, job.workers) == (1, 2) and job.done_epochs > 0
    assert report.actions == [] and writes(cluster.backend.api.calls) <= 1  # at most the slot's history
    assert sorted(p.metadata.name for p in cluster.pods("mlp-r")) == names
    assert cluster.kubelet.started.count("mlp-r-worker-0") == 1

    # a deleted DL2Job: its pods go too (the emulator has no garbage collector; the backend tidies)
    cluster.custom.delete_namespaced_custom_object(ko.GROUP, ko.VERSION, "default", ko.PLURAL, "mlp-r")
    cluster.backend.snapshot()
    assert cluster.pods("mlp-r") == [] and cluster.core.list_namespaced_service("default").items == []


def test_a_job_that_trains_to_its_end_before_its_start_is_seen_running_is_started_not_timed_out(
    cluster, monkeypatch
):
    # The race CI hit: a short job's coordinator ran its first plan, trained to the end and exited
    # between two of the reconciler's polls, so "running" was never read. Here no status ever answers.
    monkeypatch.setattr(cluster.backend.coordinators, "status", lambda address: None)
    cluster.apply_job(small_job("tiny-r", epochs=1, samples=32, sample_delay_s=0.0))
    _, report = cluster.slot({"tiny-r": (1, 1)})
    assert report.errors == []
    (action,) = report.actions
    assert action.ok and action.reason == "started"
    coordinator = cluster.core.read_namespaced_pod(ko.coordinator_name("tiny-r"), "default")
    assert coordinator.status.phase == "Succeeded"


async def _slow_answer():
    await asyncio.sleep(3.0)  # past the client's 2 s timeout
    return {"kind": "Status", "status": "Success"}


def test_api_faults_converge_with_no_duplicate_or_orphan_pod(cluster):
    emu = cluster.emu
    emu.react("post", "", "v1", "pods", 500, times=2)  # lost answers: the pods were created anyway
    emu.react("post", "", "v1", "pods", 409, times=1)
    emu.react("get", "", "v1", "pods", 429, times=2)
    emu.react("get", "", "v1", "nodes", 503, times=1)
    emu.react("patch", "dl2ray.io", "v1alpha1", "dl2jobs", _slow_answer, times=1)  # a timeout
    emu.react("post", "", "v1", "services", 502, times=1)
    cluster.apply_job(small_job("mlp-f"))
    _view, report = cluster.slot({"mlp-f": (1, 2)})
    assert report.errors == [], report.errors
    assert cluster.plan("mlp-f") == (1, 2)
    names = sorted(p.metadata.name for p in cluster.pods("mlp-f"))
    assert names == ["mlp-f-coordinator", "mlp-f-ps-0", "mlp-f-worker-0", "mlp-f-worker-1"]
    assert cluster.duplicates() == [] and cluster.orphans() == []
    assert all(cluster.kubelet.started.count(n) == 1 for n in names)  # one process per pod, ever
    retries = cluster.backend.api.retries
    # the pod creates and the status patch are the backend's alone; the 429/503 on lists may meet the kubelet
    assert retries["create"] >= 2 and retries["patch"] >= 1 and sum(retries.values()) >= 4, dict(retries)

    # faults on the way down: a lost delete answer, then 5xx
    emu.react("delete", "", "v1", "pods", 500, times=1)
    emu.react("delete", "", "v1", "pods", 503, times=1)
    _view, report = cluster.slot({"mlp-f": (1, 1)})
    assert report.errors == [] and report.actions[0].ok
    assert len(cluster.live("mlp-f", "worker")) == 1 and len(cluster.pods("mlp-f")) == 3
    assert cluster.duplicates() == [] and cluster.orphans() == []


def test_api_errors_that_are_not_retried_are_reported_and_the_next_slot_converges(cluster):
    cluster.emu.react("post", "", "v1", "pods", 403, times=1)
    cluster.apply_job(small_job("mlp-g"))
    _view, report = cluster.slot({"mlp-g": (1, 1)})
    assert len(report.errors) == 1 and "403" in report.errors[0]
    _view, report = cluster.slot({"mlp-g": (1, 1)})  # level-triggered: the next slot starts it
    assert report.errors == [] and cluster.plan("mlp-g") == (1, 1)
    assert cluster.duplicates() == [] and cluster.orphans() == []


def test_an_evicted_worker_is_dropped_then_replaced(cluster):
    cluster.apply_job(small_job("mlp-e"))
    cluster.slot({"mlp-e": (1, 2)})
    cluster.kubelet.evict("mlp-e-worker-1")
    wait_for(
        "the eviction to show",
        lambda: cluster.core.read_namespaced_pod("mlp-e-worker-1", "default").status.phase == "Failed",
    )
    # the pod is dropped at once (the view counts live pods), the coordinator drops the dead worker after
    # its heartbeat timeout (its plan); until then the backend leaves the job alone
    view = cluster.backend.snapshot()
    assert view.jobs[0].workers == 1
    wait_for("the coordinator to drop the worker", lambda: cluster.plan("mlp-e") == (1, 1))
    view = cluster.backend.snapshot()
    assert view.jobs[0].workers == 1
    assert "mlp-e-worker-1" not in [p.metadata.name for p in cluster.pods("mlp-e")]
    st = cluster.job("mlp-e")["status"]
    assert st["replaced"] == 1
    (event,) = [e for e in cluster.events() if e.reason == "MemberFailed"]
    assert "mlp-e-worker-1" in event.message and "Evicted" in event.message
    epochs = view.jobs[0].done_epochs
    view, report = cluster.slot({"mlp-e": (1, 2)})  # the scheduler asks for two again: a new pod
    assert report.actions[0].ok and report.actions[0].created == ["mlp-e-worker-1"]
    assert cluster.plan("mlp-e") == (1, 2)
    wait_for("training to go on", lambda: cluster.backend.snapshot().jobs[0].done_epochs > epochs)
    assert cluster.duplicates() == [] and cluster.orphans() == []


def test_an_invalid_dl2job_gets_a_condition_and_an_event_and_the_others_run(cluster):
    bad = ko.dl2job(small_job("bad-job"))
    bad["spec"]["workers"] = {"min": 3, "max": 2}
    cluster.apply_job(bad)
    unknown = ko.dl2job(small_job("bad-type"))
    unknown["spec"]["job_type"] = "no-such-model"
    cluster.apply_job(unknown)
    cluster.apply_job(small_job("good-job"))
    view, report = cluster.slot({"good-job": (1, 1)})
    assert [j.job_id for j in view.jobs] == [job_id_of("good-job")]
    assert report.errors == [] and cluster.plan("good-job") == (1, 1)
    for name, field in (("bad-job", "spec.workers"), ("bad-type", "spec.job_type")):
        st = cluster.job(name)["status"]
        assert st["phase"] == "Invalid"
        cond = {c["type"]: c for c in st["conditions"]}["Valid"]
        assert cond["status"] == "False" and cond["message"].startswith(field), cond
        assert cluster.pods(name) == []
    events = [e for e in cluster.events() if e.reason == "InvalidSpec"]
    assert sorted(e.involved_object.name for e in events) == ["bad-job", "bad-type"]
    assert any(e.message.startswith("spec.workers") for e in events)
    cluster.slot({"good-job": (1, 1)})  # seen again: reported once, not once per slot
    assert len([e for e in cluster.events() if e.reason == "InvalidSpec"]) == 2
