"""The objects dl2ray puts on Kubernetes, offline: every manifest and everything ``render`` prints validates
(kubernetes-validate, strict, two Kubernetes versions); the CRD schema is the JobSpec model's."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support import run_cli

from clusters.k8s import objects as ko
from clusters.k8s import queues as kq
from clusters.k8s.config import K8sSettings, load_k8s_config
from clusters.k8s.manifests import HEADER, dump_all, manifests, render_job
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec
from dl2ray.tenancy import QueueSpec, TenancyConfig

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = sorted((REPO / "configs" / "k8s").glob("*.yaml"))
VERSIONS = ["1.30.0", "1.35.0"]
EXAMPLE_JOB = REPO / "examples" / "jobs" / "mlp-small.yaml"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _crd_validator() -> jsonschema.Draft4Validator:
    """The DL2Job schema as the API server applies it (OpenAPI v3.0 is JSON Schema draft 4 + nullable)."""
    schema = copy.deepcopy(ko.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

    def nullable(node):
        if isinstance(node, dict):
            if node.pop("nullable", False):
                node["type"] = [node["type"], "null"]
            node.pop("x-kubernetes-preserve-unknown-fields", None)
            for key in ("x-kubernetes-list-type", "x-kubernetes-list-map-keys"):
                node.pop(key, None)
            for v in node.values():
                nullable(v)
        elif isinstance(node, list):
            for v in node:
                nullable(v)

    nullable(schema)
    return jsonschema.Draft4Validator(schema)


def validate(obj: dict, version: str) -> None:
    """Built-in kinds by kubernetes-validate (strict); DL2Jobs by the CRD schema and the JobSpec model."""
    if obj["kind"] == ko.KIND:
        _crd_validator().validate(obj)
        raw, _ = ko.spec_of(obj)
        JobSpec.model_validate(raw)
        return
    kubernetes_validate.validate(obj, version, strict=True)


def test_manifests_exist_and_match_the_code():
    names = {p.name for p in MANIFESTS}
    assert names == {"crd.yaml", "rbac.yaml", "agent.yaml", "example-dl2job.yaml"}
    settings = load_k8s_config(REPO / "configs" / "k8s-cluster.yaml").kubernetes
    for fname, objs in manifests(settings).items():
        assert (REPO / "configs" / "k8s" / fname).read_text() == HEADER + dump_all(objs), (
            f"configs/k8s/{fname} is stale: run `dl2ray k8s manifests --out configs/k8s`"
        )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_strictly(path, version):
    docs = _docs(path)
    assert docs
    for obj in docs:
        validate(obj, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_everything_render_prints_validates(capsys, version):
    code, out, err = run_cli(
        capsys, "k8s", "render", str(EXAMPLE_JOB), "--ps", "2", "--workers", "3", "--node", "node-a"
    )
    assert code == 0, err
    objs = [d for d in yaml.safe_load_all(out) if d]
    kinds = [o["kind"] for o in objs]
    assert kinds == ["DL2Job", "Service", "Pod", "Pod", "Pod", "Pod", "Pod", "Pod"]
    for obj in objs:
        validate(obj, version)
    pods = [o for o in objs if o["kind"] == "Pod"]
    names = [p["metadata"]["name"] for p in pods]
    assert names == [
        "mlp-small-coordinator",
        "mlp-small-ps-0",
        "mlp-small-ps-1",
        "mlp-small-worker-0",
        "mlp-small-worker-1",
        "mlp-small-worker-2",
    ]
    for pod in pods[1:]:
        labels = pod["metadata"]["labels"]
        assert labels[ko.LABEL_JOB] == "mlp-small"
        assert f"{labels[ko.LABEL_ROLE]}-{labels[ko.LABEL_INDEX]}" in pod["metadata"]["name"]
        (ref,) = pod["metadata"]["ownerReferences"]
        assert ref["kind"] == "DL2Job" and ref["controller"] is True and ref["name"] == "mlp-small"
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]
        assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi"}


def test_pod_command_lines_are_the_elastic_mxnet_entry_points():
    spec = JobSpec.model_validate(yaml.safe_load(EXAMPLE_JOB.read_text()))
    objs = render_job(EXAMPLE_JOB, K8sSettings(), 1, 1, None)
    cmd = {
        o["metadata"]["labels"][ko.LABEL_ROLE]: o["spec"]["containers"][0]["command"]
        for o in objs
        if o["kind"] == "Pod"
    }
    assert cmd["ps"] == ["python", "-m", "elastic_mxnet.server", "--host", "$(POD_IP)"]
    assert cmd["worker"] == ["python", "-m", "elastic_mxnet.demo_train", *spec.worker_args()]
    assert cmd["coordinator"][:3] == ["python", "-m", "clusters.k8s.coordinator"]
    worker = next(o for o in objs if o["metadata"]["name"] == "mlp-small-worker-0")
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["ELASTIC_MXNET_COORDINATOR"] == (
        "tcp://$(MLP_SMALL_COORDINATOR_SERVICE_HOST):$(MLP_SMALL_COORDINATOR_SERVICE_PORT)"
    )
    dockerfile = (REPO / "Dockerfile").read_text()
    for module in ("clusters.k8s.coordinator", "elastic_mxnet.server", "elastic_mxnet.demo_train"):
        assert module in dockerfile  # the image checks it can import every pod's entry point


def test_gpu_demand_is_requested_and_limited_in_whole_gpus():
    spec = JobSpec.model_validate(
        {**yaml.safe_load(EXAMPLE_JOB.read_text()), "worker": {"cpu": 2, "gpu": 1, "mem": 4}}
    )
    job = ko.dl2job(spec)
    pod = ko.member_pod(
        {**job, "metadata": {**job["metadata"], "uid": "u"}},
        spec,
        "worker",
        0,
        "gpu-1",
        image="i",
        pull="Never",
        python="python",
    )
    res = pod["spec"]["containers"][0]["resources"]
    assert res == {
        "requests": {"cpu": "2000m", "memory": "4096Mi", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workers", {"min": 0, "max": 4}),
        ("model", "resnet"),
        ("epochs", 0),
        ("optimizer", {"momentum": 1.0}),
        ("worker", {"cpu": -1, "gpu": 0, "mem": 1}),
        ("ps", {"cpu": 1, "gpu": 0}),
    ],
)
def test_crd_schema_and_model_reject_the_same_bad_specs(field, value):
    """One source of truth: what the pydantic model refuses, the CRD's OpenAPI schema refuses too."""
    obj = ko.dl2job(JobSpec.model_validate(yaml.safe_load(EXAMPLE_JOB.read_text())))
    obj["spec"][field] = value
    with pytest.raises(jsonschema.ValidationError):
        _crd_validator().validate(obj)
    raw, _ = ko.spec_of(obj)
    with pytest.raises(ValueError):
        JobSpec.model_validate(raw)


def test_crd_carries_suspend_status_and_printer_columns():
    version = ko.crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["suspend"] == {
        "type": "boolean",
        "default": False,
        "description": spec["properties"]["suspend"]["description"],
    }
    assert "name" not in spec["required"] and "job_type" in spec["required"]
    # priority is a DL2Job's priorityClassName, as a pod's priority class is
    fields = (set(JobSpec.model_fields) - {"priority"}) | {"suspend", "priorityClassName"}
    assert set(spec["properties"]) == fields
    assert version["subresources"] == {"status": {}}
    cols = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert cols["State"] == ".status.phase" and cols["Workers"] == ".status.workers.ready"
    assert cols["PS"] == ".status.ps.ready" and cols["Age"] == ".metadata.creationTimestamp"
    assert cols["Queue"] == ".spec.queue"


def test_a_dl2job_round_trips_its_queue_and_priority_class():
    spec = JobSpec.model_validate({"name": "a", "job_type": "resnext-110", "queue": "prod",
                                   "priority": "high"})
    obj = ko.dl2job(spec)
    assert (obj["spec"]["queue"], obj["spec"]["priorityClassName"]) == ("prod", "high")
    raw, _ = ko.spec_of(obj)
    assert JobSpec.model_validate(raw) == spec
    plain = ko.dl2job(JobSpec.model_validate({"name": "b", "job_type": "resnext-110"}))
    assert "queue" not in plain["spec"] and "priorityClassName" not in plain["spec"]  # one pool: nothing


def test_the_dl2queue_crd_is_cluster_scoped_with_quota_and_use_columns():
    crd = kq.queue_crd()
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["shortNames"] == ["dl2q"]
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["properties"]) == set(QueueSpec.model_fields) - {"name", "share"}
    assert spec["required"] == ["nominal"]
    cols = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert cols["GPU Quota"] == ".spec.nominal.gpu" and cols["GPU Used"] == ".status.used.gpu"
    assert cols["Waiting"] == ".status.waiting"
    q = QueueSpec.model_validate({"name": "prod", "nominal": {"cpu": 4, "gpu": 1}, "weight": 2})
    obj = kq.dl2queue(q)
    assert obj["metadata"]["name"] == "prod" and obj["spec"]["weight"] == 2 and "share" not in obj["spec"]
    with pytest.raises(UserError, match=r"^tenancy.queues.0.name: 'Prod_1' cannot name a DL2Queue"):
        kq.check_names(TenancyConfig.model_validate({"queues": [{"name": "Prod_1", "nominal": {"cpu": 1}}]}))


def test_rbac_is_least_privilege():
    rules = {
        (o["kind"], r["resources"][0]): set(r["verbs"])
        for o in _docs(REPO / "configs" / "k8s" / "rbac.yaml")
        if "rules" in o
        for r in o["rules"]
    }
    assert rules[("Role", "pods")] == {"get", "list", "watch", "create", "delete"}
    assert rules[("Role", "dl2jobs/status")] == {"get", "patch"}
    assert rules[("Role", "events")] == {"create"}
    assert rules[("ClusterRole", "nodes")] == {"get", "list", "watch"}  # read-only beyond the namespace
    assert rules[("ClusterRole", "dl2queues")] == {"get", "list", "watch", "create", "patch"}  # never delete
    assert rules[("ClusterRole", "dl2queues/status")] == {"get", "patch"}
    assert not any("*" in verbs for verbs in rules.values())


@pytest.mark.parametrize(
    ("q", "value"),
    [
        ("500m", 0.5),
        ("2", 2.0),
        ("16Gi", 16 * 2**30),
        ("1e3", 1000.0),
        ("128974848", 128974848.0),
        ("129M", 129e6),
        (None, 0.0),
    ],
)
def test_quantities(q, value):
    assert ko.quantity(q) == pytest.approx(value)


def test_render_of_a_bad_job_spec_exits_2_naming_the_field(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_JOB.read_text().replace("workers: {min: 1, max: 4}", "workers: {min: 5, max: 4}"))
    code, out, err = run_cli(capsys, "k8s", "render", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "workers" in err and "Traceback" not in err
