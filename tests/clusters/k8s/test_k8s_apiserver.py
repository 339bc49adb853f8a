"""The test API server's additions to kmock (tests/clusters/k8s/apiserver.py) over HTTP, and the status the
agent writes for a job whose coordinator failed, read through the API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import kubernetes
import pytest
from apiserver import cell, human_duration, json_path, selected
from emulator import Emulator, node
from k8s_support import NS, REPO, settings, small_job

from clusters.k8s import objects as ko
from clusters.k8s.api import KubeApi
from clusters.k8s.backend import KubernetesBackend
from dl2ray.config import load_config

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "<invalid>"), (-1, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (185, "3m5s"), (600, "10m"),
     (3 * 3600, "3h"), (3 * 3600 + 60 * 7, "3h7m"), (8 * 3600, "8h"), (50 * 3600, "2d2h"), (9 * 86400, "9d"),
     (3 * 365 * 86400 + 86400, "3y1d"), (9 * 365 * 86400, "9y")],
)
def test_ages_are_written_as_kubernetes_writes_them(seconds, text):
    assert human_duration(seconds) == text


def test_json_path_cells_and_selectors():
    obj = {"metadata": {"name": "a", "labels": {"app": "x"}}, "status": {"ps": {"ready": 2}}}
    obj["status"]["c"] = [{"t": "R"}]
    assert json_path(obj, ".status.ps.ready") == 2 and json_path(obj, ".status.c[0].t") == "R"
    assert json_path(obj, ".status.workers.ready") is None and json_path(obj, ".status.c[3].t") is None
    assert cell("integer", 2.0) == 2 and cell("number", 3) == 3.0 and cell("boolean", True) is True
    assert cell("string", 5) == "5" and cell("integer", None) is None and cell("integer", "x") is None
    then = (datetime.now(UTC) - timedelta(seconds=185)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cell("date", then) in ("3m5s", "3m6s") and cell("date", "yesterday") == "<invalid>"
    assert selected(obj, "app=x", "metadata.name=a") and selected(obj, "app,!other", "status.ps.ready==2")
    assert not selected(obj, "app!=x", None) and not selected(obj, None, "metadata.name!=a")


def _get(url: str, accept: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_crd_registers_its_resource_and_custom_resources_are_served_as_tables():
    emu = Emulator(dl2jobs=False)
    try:
        base = f"{emu.url}/apis/dl2ray.io/v1alpha1"
        code, body = _get(f"{base}/namespaces/{NS}/dl2jobs")
        assert code == 404 and body["reason"] == "NotFound"  # no CRD, no resource
        conf = kubernetes.client.Configuration()
        conf.host = emu.url
        client = kubernetes.client.ApiClient(conf)
        crd = ko.crd()
        kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(crd)
        code, disco = _get(base)
        (entry,) = [r for r in disco["resources"] if r["name"] == "dl2jobs"]
        assert (entry["kind"], entry["singularName"], entry["shortNames"]) == ("DL2Job", "dl2job", ["dl2j"])
        assert entry["namespaced"] is True and "list" in entry["verbs"]
        assert _get(f"{emu.url}/api/v1")[1]["groupVersion"] == "v1"

        custom = kubernetes.client.CustomObjectsApi(client)
        job = custom.create_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL,
                                                     ko.dl2job(small_job("t-job"), NS))
        assert job["metadata"]["uid"] and job["metadata"]["creationTimestamp"]
        custom.patch_namespaced_custom_object_status(ko.GROUP, ko.VERSION, NS, ko.PLURAL, "t-job", {
            "status": {"phase": "Running", "ps": {"ready": 1, "desired": 1}, "workers": {"ready": 3}}})

        code, plain = _get(f"{base}/namespaces/{NS}/dl2jobs")
        assert code == 200 and plain["kind"] == "DL2JobList" and plain["apiVersion"] == "dl2ray.io/v1alpha1"
        code, table = _get(f"{base}/namespaces/{NS}/dl2jobs", TABLE)
        assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
        names = [c["name"] for c in table["columnDefinitions"]]
        assert names == ["Name"] + [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
        row = dict(zip(names, table["rows"][0]["cells"], strict=True))
        assert (row["Name"], row["State"], row["PS"], row["Workers"]) == ("t-job", "Running", 1, 3)
        assert row["Epochs"] is None and row["Age"].endswith("s")
        assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
        code, one = _get(f"{base}/namespaces/{NS}/dl2jobs/t-job", TABLE)
        assert one["kind"] == "Table" and len(one["rows"]) == 1

        # selectors: equality and existence work, set-based ones are refused by name
        assert _get(f"{base}/namespaces/{NS}/dl2jobs?labelSelector=app.kubernetes.io/managed-by%3Ddl2ray")[1][
            "items"]
        assert _get(f"{base}/namespaces/{NS}/dl2jobs?fieldSelector=metadata.name%3Dother")[1]["items"] == []
        code, body = _get(f"{base}/namespaces/{NS}/dl2jobs?labelSelector=env%20in%20(a,b)")
        assert code == 400 and "env in (a" in body["message"]
    finally:
        emu.close()


def test_a_failed_coordinator_finishes_the_job_with_a_condition_and_one_warning_event(tmp_path):
    emu = Emulator()
    try:
        conf = kubernetes.client.Configuration()
        conf.host = emu.url
        client = kubernetes.client.ApiClient(conf)
        core = kubernetes.client.CoreV1Api(client)
        custom = kubernetes.client.CustomObjectsApi(client)
        core.create_node(node("node-a"))
        s = settings()
        catalogue = load_config(REPO / "configs" / "testbed.yaml").catalogue
        backend = KubernetesBackend(KubeApi(client, s.api, NS), s, catalogue)
        try:
            spec = small_job("f-job")
            job = custom.create_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL,
                                                         ko.dl2job(spec, NS))
            pod, _svc = ko.coordinator_objects(job, spec, 1, 1, image="x", pull="Never", python="python",
                                               port=5555, heartbeat_timeout_s=3, register_timeout_s=10)
            core.create_namespaced_pod(NS, pod)
            core.patch_namespaced_pod_status(pod["metadata"]["name"], NS, {
                "status": {"phase": "Failed", "reason": "OOMKilled"}})
            for _ in range(2):  # the second slot reports nothing new
                backend.snapshot()
            st = custom.get_namespaced_custom_object(ko.GROUP, ko.VERSION, NS, ko.PLURAL, "f-job")["status"]
            conds = {c["type"]: c for c in st["conditions"]}
            assert st["phase"] == "Failed"
            assert (conds["Finished"]["status"], conds["Finished"]["reason"]) == ("True", "Failed")
            assert (conds["Running"]["status"], conds["Created"]["status"]) == ("False", "True")
            events = [e for e in core.list_namespaced_event(NS).items if e.involved_object.name == "f-job"]
            assert [(e.type, e.reason) for e in events] == [("Warning", "Failed")]
            assert "f-job-coordinator failed: OOMKilled" in events[0].message
            assert events[0].involved_object.uid == job["metadata"]["uid"]
        finally:
            backend.close()
    finally:
        emu.close()
