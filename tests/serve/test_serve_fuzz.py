"""Fuzzing: requests generated from the app's own OpenAPI document (schemathesis), and structurally valid
views over the catalogue's job types (hypothesis). The endpoint never answers 5xx and stays up."""

from __future__ import annotations

import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from serve_support import SHIPPED, TESTBED, Endpoint

from dl2ray.config import load_config


@pytest.fixture(scope="module")
def endpoint():
    """The app with admission control off: schemathesis may give up on a slow request (a huge view) and
    send the next while the replica still decides it, which the shipped app rightly refuses with a 503
    (overload is tested in test_serve_overload.py); here every request must be judged on its content."""
    ep = Endpoint({"config": str(TESTBED), "checkpoint": str(SHIPPED), "reload_every_s": 0,
                   "overload_bound_ms": 0})
    yield ep
    ep.close()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_openapi_fuzz_never_a_server_error(endpoint, mode):
    """Every operation of /openapi.json, with bodies that follow the document and bodies that break it:
    schemathesis' checks (no 5xx, documented status codes and response schemas, invalid data refused).

    Not "valid data accepted": the document cannot say which job types the catalogue has, which
    heuristics are served or that a node index must exist, so a schema-valid body may well be a 422."""
    schema = schemathesis.openapi.from_url(f"{endpoint.url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/decide", "/v1/policy", "/healthz"}
    for op in operations:
        if mode is GenerationMode.NEGATIVE and not list(op.body):
            continue  # nothing to break in a GET without parameters

        @given(case=op.as_strategy(mode))
        @settings(max_examples=40, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        run()
    assert requests.get(f"{endpoint.url}/healthz").status_code == 200


CFG = load_config("configs/testbed.yaml")
TYPES = CFG.catalogue.names
amount = st.one_of(st.just(0.0), st.floats(1e-3, 64))


@st.composite
def views(draw):
    n = draw(st.integers(1, 6))
    nodes = []
    for k in range(n):
        # the first node has CPUs: a cluster with no capacity at all is a 422 (test_http)
        cap = {"cpu": draw(st.floats(1, 64) if k == 0 else amount),
               "gpu": draw(st.sampled_from([0.0, 1.0, 2.0, 8.0])), "mem": draw(amount)}
        node = {"capacity": cap, "count": draw(st.integers(1, 3))}
        if draw(st.booleans()):
            node["free"] = {k: v * draw(st.sampled_from([0.0, 0.5, 1.0])) for k, v in cap.items()}
        nodes.append(node)
    total = sum(node["count"] for node in nodes)
    jobs = []
    for i in range(draw(st.integers(0, 45))):
        w = draw(st.integers(0, 3))
        job = {"job_id": draw(st.integers(100, 2**53)) if i == 0 else i,
               "job_type": draw(st.sampled_from(TYPES)),
               "arrival_slot": draw(st.integers(0, 50)), "slots_run": draw(st.integers(0, 200)),
               "est_epochs": draw(st.floats(1e-3, 1e6)), "done_epochs": draw(st.floats(0, 2e6)),
               "workers": w, "ps": draw(st.integers(0, 3)),
               "worker_nodes": draw(st.lists(st.integers(0, total - 1), min_size=w, max_size=w)) if w else []}
        if draw(st.booleans()):
            job["worker_demand"] = {"cpu": draw(amount), "gpu": draw(st.sampled_from([0.0, 1.0])),
                                    "mem": draw(amount)}
            job["ps_demand"] = {"cpu": draw(amount), "gpu": 0.0, "mem": draw(amount)}
            job["max_workers"], job["max_ps"] = draw(st.integers(3, 40)), draw(st.integers(3, 40))
        if draw(st.booleans()):
            job["requested_bundles"] = draw(st.integers(0, 50))
        if draw(st.booleans()):
            job["history"] = [{"slot": s, "ps": 1, "workers": 1,
                               "epochs": draw(st.one_of(st.just(0.0), st.floats(1e-3, 10))),
                               "seconds": draw(st.one_of(st.just(0.0), st.floats(1e-3, 1200))),
                               "loss": draw(st.floats(0, 5))}
                              for s in range(draw(st.integers(1, 4)))]
        jobs.append(job)
    return {"slot": draw(st.integers(0, 100)), "slot_seconds": draw(st.floats(1, 3600)), "nodes": nodes,
            "jobs": jobs, "placement": draw(st.sampled_from(["load_balancing", "packing", "optimus"]))}


def _demand(job: dict, role: str) -> np.ndarray:
    given = job.get(f"{role}_demand")
    if given is not None:
        return np.array([given["cpu"], given["gpu"], given["mem"]])
    t = CFG.catalogue.index(job["job_type"])
    return (CFG.catalogue.worker_demand if role == "worker" else CFG.catalogue.ps_demand)[t]


@given(view=views(), scheduler=st.sampled_from(["dl2", "drf", "fifo", "srtf", "tetris", "optimus"]))
@settings(max_examples=40, suppress_health_check=list(HealthCheck))
def test_valid_views_are_decided_within_capacity_and_caps(endpoint, view, scheduler):
    r = requests.post(f"{endpoint.url}/v1/decide", json={"view": view, "scheduler": scheduler})
    assert r.status_code == 200, r.text
    free = np.array([[*(n.get("free") or n["capacity"]).values()] for n in view["nodes"]
                     for _ in range(n["count"])])
    used = np.zeros_like(free)
    jobs = {j["job_id"]: j for j in view["jobs"]}
    for a in r.json()["allocation"]:
        job = jobs[a["job_id"]]
        t = CFG.catalogue.get(job["job_type"])
        assert a["workers"] <= job.get("max_workers", t.max_workers)
        assert a["ps"] <= job.get("max_ps", t.max_ps)
        assert len(a["worker_nodes"]) == a["workers"] and len(a["ps_nodes"]) == a["ps"]
        for node in a["worker_nodes"]:
            used[node] += _demand(job, "worker")
        for node in a["ps_nodes"]:
            used[node] += _demand(job, "ps")
    assert (used <= free + 1e-9).all()
