"""The real ``kubectl`` against the test API server: applying configs/k8s/, and what ``kubectl get dl2jobs``
and ``kubectl describe dl2job`` show of the state, allocation, conditions and events the agent writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from emulator import Emulator, node
from k8s_support import NS, REPO, Cluster, small_job
from kubectl import Kubectl, requires_kubectl
from support import wait_for

from clusters.k8s import objects as ko
from clusters.k8s import queues as kq
from clusters.k8s.conditions import TYPES
from dl2ray.tenancy import TenancyConfig
from dl2ray.view import Allocation, Tasks

pytestmark = requires_kubectl

CONFIGS = REPO / "configs" / "k8s"
KIND = ko.KIND


@pytest.fixture()
def bare():
    """A test API server on which DL2Jobs exist only once the CRD is applied (as on a real cluster)."""
    emu = Emulator(dl2jobs=False)
    yield emu
    emu.close()


def kubectl_for(emu: Emulator, tmp: Path) -> Kubectl:
    return Kubectl(emu.kubeconfig(tmp / "kubeconfig"), tmp / "home")


@pytest.fixture()
def kube(bare, tmp_path):
    """kubectl on ``bare``, the CRD applied with it."""
    k = kubectl_for(bare, tmp_path)
    k.run("apply", "--validate=false", "-f", str(CONFIGS / "crd.yaml"))
    return k


@pytest.fixture()
def crd_cluster(bare, kube, tmp_path):
    """The test cluster (conftest's ``cluster``) on ``bare`` once the CRD is applied."""
    c = Cluster(bare, tmp_path, [node(n, cpu="2", memory="4Gi") for n in ("node-a", "node-b")])
    yield c
    c.close()


def applied(out: str) -> dict[str, str]:
    """``kubectl apply`` output → {kind/name: created | unchanged | configured}."""
    return dict(line.rsplit(" ", 1) for line in out.splitlines() if line.strip())


def job_yaml(tmp: Path, obj: dict) -> Path:
    path = tmp / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def conditions(cluster: Cluster, name: str) -> dict[str, dict]:
    """The DL2Job's conditions read through the API (not through kubectl)."""
    return {c["type"]: c for c in cluster.job(name)["status"]["conditions"]}


def reasons(cluster: Cluster, name: str) -> list[str]:
    """Reasons of the Events on DL2Job ``name``, read through the API, in the order they were created (the
    server's resourceVersion)."""
    events = [e for e in cluster.events() if (e.involved_object.name, e.involved_object.kind) == (name, KIND)]
    return [e.reason for e in sorted(events, key=lambda e: int(e.metadata.resource_version))]


def test_kubectl_applies_configs_k8s_and_applying_again_changes_nothing(bare, tmp_path):
    k = kubectl_for(bare, tmp_path)
    # no CRD, no resource: what a real API server answers too
    missing = k.run("get", "dl2jobs", check=False)
    assert missing.returncode != 0 and "dl2jobs" in missing.stderr

    out = applied(k.out("apply", "--validate=false", "-f", str(CONFIGS / "crd.yaml")))
    assert out == {"customresourcedefinition.apiextensions.k8s.io/dl2jobs.dl2ray.io": "created",
                   "customresourcedefinition.apiextensions.k8s.io/dl2queues.dl2ray.io": "created"}
    established = k.out("get", "crd", "dl2jobs.dl2ray.io", "-o",
                        "jsonpath={.status.conditions[?(@.type=='Established')].status}")
    assert established == "True"
    api = k.out("api-resources", "--api-group=dl2ray.io", "--no-headers").split()
    assert api == ["dl2jobs", "dl2j", "dl2ray.io/v1alpha1", "true", "DL2Job",
                   "dl2queues", "dl2q", "dl2ray.io/v1alpha1", "false", "DL2Queue"]

    out = applied(k.out("apply", "--validate=false", "-f", str(CONFIGS)))
    kinds = {key.split("/")[0] for key in out}
    assert kinds == {
        "configmap", "deployment.apps", "customresourcedefinition.apiextensions.k8s.io", "dl2job.dl2ray.io",
        "serviceaccount", "role.rbac.authorization.k8s.io", "rolebinding.rbac.authorization.k8s.io",
        "clusterrole.rbac.authorization.k8s.io", "clusterrolebinding.rbac.authorization.k8s.io",
    }
    assert [v for key, v in out.items() if not key.startswith("customresourcedefinition")] == ["created"] * 8
    # the same files again: nothing to change (kubectl computes an empty patch for every object)
    again = applied(k.out("apply", "--validate=false", "-f", str(CONFIGS)))
    assert set(again) == set(out) and set(again.values()) == {"unchanged"}

    # what was stored is what the files say, and the server filled in what an API server does
    deployment = json.loads(k.out("get", "deployment", "dl2ray-agent", "-o", "json"))
    docs = yaml.safe_load_all((CONFIGS / "agent.yaml").read_text())
    (expected,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"] == expected["spec"]
    assert deployment["metadata"]["uid"] and deployment["metadata"]["creationTimestamp"]
    rows = k.table("dl2jobs")
    assert [r["NAME"] for r in rows] == ["mlp-small"]
    assert list(rows[0]) == ["NAME", "STATE", "QUEUE", "PS", "WORKERS", "EPOCHS", "AGE"]
    wide = k.table("dl2j", "-o", "wide")
    assert list(wide[0]) == ["NAME", "STATE", "QUEUE", "PS", "WORKERS", "EPOCHS", "DESIRED PS",
                             "DESIRED WORKERS", "SUSPEND", "AGE"]


def test_kubectl_shows_an_invalid_job_and_a_suspended_one_with_conditions_and_events(
    crd_cluster, kube, tmp_path
):
    cluster, k = crd_cluster, kube
    bad = ko.dl2job(small_job("bad-job"), NS)
    bad["spec"]["workers"] = {"min": 3, "max": 2}
    held = ko.dl2job(small_job("held-job"), NS, suspend=True)
    for obj in (bad, held):
        k.run("apply", "--validate=false", "-f", str(job_yaml(tmp_path, obj)))
    view = cluster.backend.snapshot()
    assert view.jobs == ()  # neither is offered to the scheduler

    # through the API: every condition, the InvalidSpec event on the bad job only
    c = conditions(cluster, "bad-job")
    assert sorted(c) == sorted(TYPES)
    assert (c["Valid"]["status"], c["Valid"]["reason"]) == ("False", "InvalidSpec")
    assert c["Valid"]["message"].startswith("spec.workers")
    assert reasons(cluster, "bad-job") == ["InvalidSpec"] and reasons(cluster, "held-job") == []
    c = conditions(cluster, "held-job")
    assert c["Suspended"]["status"] == "True" and c["Running"]["reason"] == "Suspended"

    rows = {r["NAME"]: r for r in k.table("dl2jobs", "-o", "wide")}
    assert rows["bad-job"]["STATE"] == "Invalid" and rows["held-job"]["STATE"] == "Suspended"
    assert rows["held-job"]["SUSPEND"] == "true" and rows["held-job"]["WORKERS"] == "0"

    text = k.out("describe", "dl2job", "bad-job")
    assert "Conditions:" in text and "InvalidSpec" in text
    (line,) = [ln for ln in text.splitlines() if "InvalidSpec" in ln and "Warning" in ln]
    assert "dl2ray-agent" in line and "spec.workers: min (3) is above max (2)" in line
    # describe finds an object's events by field selector (involvedObject.uid, …): none of the other job's
    assert "Events:" in k.out("describe", "dl2job", "held-job")
    assert "InvalidSpec" not in k.out("describe", "dl2job", "held-job").split("Events:")[1]
    events = k.out("get", "events", "--field-selector", "involvedObject.name=bad-job", "-o",
                   "jsonpath={.items[*].reason}")
    assert events == "InvalidSpec"

    # fixed with kubectl apply: the next slot takes it
    bad["spec"]["workers"] = {"min": 1, "max": 2}
    k.run("apply", "--validate=false", "-f", str(job_yaml(tmp_path, bad)))
    view = cluster.backend.snapshot()
    assert [j.job_id for j in view.jobs] == [ko_job_id("bad-job")]
    assert conditions(cluster, "bad-job")["Valid"]["status"] == "True"
    assert k.table("dl2j", "bad-job")[0]["STATE"] == "Pending"


TENANCY = {"queues": [{"name": "research", "nominal": {"cpu": 2, "gpu": 0, "mem": 4}},
                      {"name": "prod", "nominal": {"cpu": 2, "gpu": 0, "mem": 4}, "priority": "high"}],
           "priority_classes": [{"name": "normal"}, {"name": "high", "value": 100}]}


def test_kubectl_shows_the_queues_and_a_job_of_an_unknown_queue_is_invalid(bare, kube, tmp_path):
    k = kube
    tenancy = TenancyConfig.model_validate(TENANCY)
    cluster = Cluster(bare, tmp_path, [node(n, cpu="2", memory="4Gi") for n in ("node-a", "node-b")],
                      tenancy=tenancy)
    try:
        good = ko.dl2job(small_job("in-prod", queue="prod", priority="high"), NS)
        assert good["spec"]["queue"] == "prod" and good["spec"]["priorityClassName"] == "high"
        assert "priority" not in good["spec"]
        nowhere = ko.dl2job(small_job("nowhere", queue="nope"), NS)
        urgent = ko.dl2job(small_job("urgent", queue="prod"), NS)
        urgent["spec"]["priorityClassName"] = "urgent"
        for obj in (good, nowhere, urgent):
            k.run("apply", "--validate=false", "-f", str(job_yaml(tmp_path, obj)))
        view = cluster.backend.snapshot()
        jobs = [(j.job_id, j.queue, j.priority) for j in view.jobs]
        assert jobs == [(ko_job_id("in-prod"), "prod", "high")]
        c = conditions(cluster, "nowhere")["Valid"]
        assert (c["status"], c["reason"]) == ("False", "InvalidSpec")
        assert c["message"].startswith("spec.queue: 'nope' is not a queue of this cluster (known: research, ")
        message = conditions(cluster, "urgent")["Valid"]["message"]
        assert message.startswith("spec.priorityClassName: 'urgent' is not a priority class"), message
        assert reasons(cluster, "nowhere") == ["InvalidSpec"]
        rows = {r["NAME"]: r for r in k.table("dl2jobs")}
        assert rows["in-prod"]["QUEUE"] == "prod" and rows["nowhere"]["STATE"] == "Invalid"

        # the agent's queues, after a decision that starts nothing, then after one giving in-prod 3 tasks
        cluster.backend.apply(Allocation({}))
        queues = {r["NAME"]: r for r in k.table("dl2queues")}
        assert set(queues) == {"research", "prod"}
        prod = queues["prod"]
        assert (prod["CPU QUOTA"], prod["CPU USED"], prod["WAITING"]) == ("2", "0", "1")
        kq.publish(cluster.backend.api, tenancy, cluster.backend.queue_rows(
            Allocation({ko_job_id("in-prod"): Tasks(workers=2, ps=1)})))
        prod = k.table("dl2q", "prod", "-o", "wide")[0]
        assert (prod["CPU USED"], prod["CPU BORROWED"], prod["MEM QUOTA"]) == ("0.75", "0", "4")
        # a spec edited by hand is set back to the config's; an unchanged status is not written again
        k.run("patch", "dl2queue", "prod", "--type=merge", "-p", json.dumps({"spec": {"weight": 5}}))
        assert k.table("dl2q", "prod", "-o", "wide")[0]["WEIGHT"] == "5"
        rows_now = cluster.backend.queue_rows(Allocation({ko_job_id("in-prod"): Tasks(workers=2, ps=1)}))
        assert kq.publish(cluster.backend.api, tenancy, rows_now) == 1  # the spec only
        assert k.table("dl2q", "prod", "-o", "wide")[0]["WEIGHT"] == "1"
    finally:
        cluster.close()


def ko_job_id(name: str) -> int:
    from clusters.agent.views import job_id_of

    return job_id_of(name)


@pytest.mark.slow
def test_a_job_seen_through_kubectl_while_the_agent_scales_pauses_suspends_and_finishes_it(
    crd_cluster, kube, tmp_path
):
    cluster, k, tmp = crd_cluster, kube, tmp_path
    k.run("apply", "--validate=false", "-f", str(job_yaml(tmp, ko.dl2job(small_job("mlp-k"), NS))))
    tiny = small_job("tiny-k", epochs=2, samples=64, sample_delay_s=0.0)
    k.run("apply", "--validate=false", "-f", str(job_yaml(tmp, ko.dl2job(tiny, NS))))
    assert {r["NAME"]: r["STATE"] for r in k.table("dl2jobs")} == {"mlp-k": "", "tiny-k": ""}

    _, report = cluster.slot({"mlp-k": (1, 1), "tiny-k": (1, 1)})
    assert report.errors == []
    # the reconciler wrote state and allocation at once: no need to wait for the next slot
    rows = {r["NAME"]: r for r in k.table("dl2jobs")}
    assert (rows["mlp-k"]["STATE"], rows["mlp-k"]["PS"], rows["mlp-k"]["WORKERS"]) == ("Running", "1", "1")
    c = conditions(cluster, "mlp-k")
    assert c["Created"]["status"] == "True" and c["Running"]["status"] == "True"
    assert reasons(cluster, "mlp-k") == ["Started"]
    valid_since = c["Valid"]["lastTransitionTime"]

    _, report = cluster.slot({"mlp-k": (1, 2), "tiny-k": (1, 1)})
    assert report.errors == []
    row = k.table("dl2j", "mlp-k", "-o", "wide")[0]
    assert (row["WORKERS"], row["DESIRED WORKERS"], row["PS"]) == ("2", "2", "1")
    assert reasons(cluster, "mlp-k")[-1] == "Scaled"
    assert "2 workers" in conditions(cluster, "mlp-k")["Running"]["message"]

    k.run("patch", "dl2job", "mlp-k", "--type", "merge", "-p", '{"spec": {"suspend": true}}')
    _, report = cluster.slot({"mlp-k": (1, 2), "tiny-k": (1, 1)})  # suspended: the allocation is not taken
    assert report.errors == []
    assert k.table("dl2j", "mlp-k")[0]["STATE"] == "Suspended"
    assert k.table("dl2j", "mlp-k")[0]["WORKERS"] == "0" and reasons(cluster, "mlp-k")[-1] == "Suspended"
    c = conditions(cluster, "mlp-k")
    assert c["Suspended"]["status"] == "True" and c["Running"]["reason"] == "Suspended"

    k.run("patch", "dl2job", "mlp-k", "--type", "merge", "-p", '{"spec": {"suspend": false}}')
    _, report = cluster.slot({"mlp-k": (1, 1), "tiny-k": (1, 1)})
    assert report.errors == [] and reasons(cluster, "mlp-k")[-1] == "Resumed"
    c = conditions(cluster, "mlp-k")
    assert c["Running"]["status"] == "True" and c["Suspended"]["status"] == "False"

    _, report = cluster.slot({"tiny-k": (1, 1)})  # mlp-k allocated nothing: paused with one PS
    assert report.errors == []
    c = conditions(cluster, "mlp-k")
    assert (c["Running"]["status"], c["Running"]["reason"]) == ("False", "Paused")
    assert k.table("dl2j", "mlp-k")[0]["STATE"] == "Running"  # paused is not suspended: the PS runs
    assert c["Valid"]["lastTransitionTime"] == valid_since  # it never flipped
    assert reasons(cluster, "mlp-k") == ["Started", "Scaled", "Suspended", "Resumed", "Paused"]

    def tiny_done():
        cluster.slot({"tiny-k": (1, 1)})
        return k.table("dl2j", "tiny-k")[0]["STATE"] == "Succeeded"

    wait_for("tiny-k to finish", tiny_done, timeout_s=180)
    row = k.table("dl2j", "tiny-k")[0]
    assert float(row["EPOCHS"]) == 2.0
    c = conditions(cluster, "tiny-k")
    assert (c["Finished"]["status"], c["Finished"]["reason"]) == ("True", "Succeeded")
    assert c["Running"]["status"] == "False"
    assert reasons(cluster, "tiny-k")[0] == "Started" and reasons(cluster, "tiny-k")[-1] == "Succeeded"
    text = k.out("describe", "dl2job", "tiny-k")
    for word in ("Finished", "Succeeded", "trained 2 epochs", "Started", "started with 1 PS and 1 workers"):
        assert word in text
    assert cluster.duplicates() == [] and cluster.orphans() == []
