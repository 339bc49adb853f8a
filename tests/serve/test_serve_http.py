"""The endpoint over real HTTP (plain uvicorn on a free loopback port): decisions, metadata, bad requests."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import requests
from serve_support import SHIPPED, TESTBED

from dl2ray.errors import UserError
from dl2ray.evaluation.comparison import RunSpec, run_one
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.dl2 import DL2Scheduler
from serve.client import ServeError, ServeScheduler
from serve.convert import from_view


def test_served_allocation_equals_in_process_decide(endpoint, views, testbed):
    local = DL2Scheduler(str(SHIPPED), testbed)
    client = make_scheduler(f"serve:{endpoint.url}", testbed)
    for view in views:
        served, mine = client.decide(view), local.decide(view)
        assert list(served.tasks.items()) == list(mine.tasks.items())
        assert served.placement == mine.placement
    assert client.last_version == endpoint.service.store.current.version
    assert client.last_version.startswith("dl2-testbed.pt@")


def test_every_served_heuristic_decides_like_a_fresh_instance(endpoint, views, testbed):
    names = [n for n in requests.get(f"{endpoint.url}/v1/policy").json()["schedulers"] if n != "dl2"]
    assert {"drf", "fifo", "srtf", "tetris", "optimus"} <= set(names)
    for name in names:
        client = ServeScheduler(endpoint.url, name)  # the server decides under each view's placement
        for view in views:
            served, mine = client.decide(view), make_scheduler(name, testbed, view.placement).decide(view)
            assert list(served.tasks.items()) == list(mine.tasks.items()), name
            assert served.placement == mine.placement, name
        assert client.last_version == f"heuristic:{name}"


def test_served_schedulers_place_as_their_own_unless_the_view_names_a_placement(endpoint, views, testbed):
    """Every served scheduler's own placement is in PolicyInfo; ``serve:URL`` takes it as its own, and a
    request's view placement forces another on the server."""
    placements = requests.get(f"{endpoint.url}/v1/policy").json()["placements"]
    assert placements["optimus"] == "optimus" and placements["tetris"] == "tetris"
    assert placements["drf"] == "load_balancing"
    assert placements["dl2"] == DL2Scheduler(str(SHIPPED), testbed).placement
    client = make_scheduler(f"serve:{endpoint.url}?scheduler=optimus", testbed)
    assert client.placement == "optimus"
    view = views[-1]
    local = make_scheduler("optimus", testbed)
    assert client.decide(view).placement == local.decide(view).placement
    forced = make_scheduler(f"serve:{endpoint.url}?scheduler=optimus", testbed, "packing")
    local = make_scheduler("optimus", testbed, "packing")
    assert forced.decide(view).placement == local.decide(view).placement


def test_policy_health_and_openapi(endpoint):
    info = requests.get(f"{endpoint.url}/v1/policy").json()
    assert info["config"] == "testbed" and info["window"] == 20 and info["max_jobs"] == 200
    assert info["version"] == endpoint.service.store.current.version and info["reloads"] == 0
    assert info["job_types"][0] == "resnet-50"
    health = requests.get(f"{endpoint.url}/healthz").json()
    assert health == {"status": "ok", "policy_version": info["version"]}
    doc = requests.get(f"{endpoint.url}/openapi.json").json()
    assert {"/v1/decide", "/v1/policy", "/healthz"} <= set(doc["paths"])
    assert "DecideRequest" in doc["components"]["schemas"]
    page = requests.get(f"{endpoint.url}/docs")
    assert page.status_code == 200 and "openapi.json" in page.text


def _body(view, **edits) -> dict:
    body = {"view": from_view(view).model_dump(mode="json"), "scheduler": "dl2"}
    for path, value in edits.items():
        *keys, last = [int(k) if k.isdigit() else k for k in path.split("__")]
        node = body
        for k in keys:
            node = node[k]
        node[last] = value
    return body


BAD = [
    # (edits to a valid body, the loc FastAPI's 422 must name)
    ({"view__slot": "soon"}, ["body", "view", "slot"]),
    ({"view__jobs__0__workers": -1}, ["body", "view", "jobs", 0, "workers"]),
    ({"view__jobs__0__est_epochs": 0}, ["body", "view", "jobs", 0, "est_epochs"]),
    ({"view__nodes__0__capacity__gpu": "many"}, ["body", "view", "nodes", 0, "capacity", "gpu"]),
    ({"view__jobs__0__job_type": "gpt-5"}, ["body", "view", "jobs", 0, "job_type"]),
    ({"view__jobs__0__workers": 1, "view__jobs__0__worker_nodes": [0, 1]},
     ["body", "view", "jobs", 0, "worker_nodes"]),
    ({"view__jobs__0__workers": 1, "view__jobs__0__worker_nodes": [999]},
     ["body", "view", "jobs", 0, "worker_nodes", 0]),
    ({"view__jobs__0__workers": 99, "view__jobs__0__worker_nodes": []},
     ["body", "view", "jobs", 0, "workers"]),
    ({"view__nodes__0__free": {"cpu": 1e6, "gpu": 0, "mem": 0}}, ["body", "view", "nodes", 0, "free", "cpu"]),
    ({"view__jobs__1__job_id": "same"}, None),  # filled in below: a duplicate id
    ({"view__jobs__0__colour": "red"}, ["body", "view", "jobs", 0, "colour"]),
    ({"view__nodes": [{"capacity": {"cpu": 0, "gpu": 0, "mem": 0}}]}, ["body", "view", "nodes"]),
    ({"view__nodes__0__capacity__mem": 1e-300}, ["body", "view", "nodes", 0, "capacity", "mem"]),
    ({"view__slot_seconds": 0}, ["body", "view", "slot_seconds"]),
    ({"scheduler": "dl2:/etc/passwd"}, ["body", "scheduler"]),
    ({"scheduler": "serve"}, ["body", "scheduler"]),
]


@pytest.mark.parametrize(("edits", "loc"), BAD, ids=[",".join(e) for e, _ in BAD])
def test_bad_request_is_a_422_naming_the_field(endpoint, views, edits, loc):
    view = views[-1]
    if "view__jobs__1__job_id" in edits:
        edits, loc = {"view__jobs__1__job_id": view.jobs[0].job_id}, ["body", "view", "jobs", 1, "job_id"]
    r = requests.post(f"{endpoint.url}/v1/decide", json=_body(view, **edits))
    assert r.status_code == 422, r.text
    assert loc in [d["loc"] for d in r.json()["detail"]], r.json()
    assert requests.get(f"{endpoint.url}/healthz").status_code == 200


def test_more_jobs_than_the_endpoint_takes(endpoint, views):
    body = _body(views[-1])
    job = body["view"]["jobs"][0]
    body["view"]["jobs"] = [{**job, "job_id": i} for i in range(201)]
    r = requests.post(f"{endpoint.url}/v1/decide", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "view", "jobs"]


@pytest.mark.parametrize("raw", [b'{"view": ', b"[1, 2", b"\xff\xfe", b"\x07\xc8[\xd6V", b"null",
                                 b'{"view": {}}'])
def test_malformed_json_is_a_422(endpoint, raw):
    r = requests.post(f"{endpoint.url}/v1/decide", data=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body"


def test_oversized_body_is_a_413_and_the_server_stays_up(endpoint, views):
    limit = endpoint.service.settings.max_body_bytes
    r = requests.post(f"{endpoint.url}/v1/decide", data=b" " * (limit + 1),
                      headers={"content-type": "application/json"})
    assert r.status_code == 413
    # streamed without a Content-Length: counted while it arrives
    r = requests.post(f"{endpoint.url}/v1/decide", data=iter([b" " * (1 << 20)] * (limit // (1 << 20) + 1)),
                      headers={"content-type": "application/json"})
    assert r.status_code == 413
    ok = requests.post(f"{endpoint.url}/v1/decide", json=_body(views[0]))
    assert ok.status_code == 200 and ok.json()["policy_version"].startswith("dl2-testbed.pt@")


def test_client_errors_say_what_the_server_said(endpoint, views, testbed):
    job = dataclasses.replace(views[0].jobs[0], job_type="not-a-type")
    with pytest.raises(ServeError, match=r"422.*job_type"):
        ServeScheduler(endpoint.url).decide(dataclasses.replace(views[0], jobs=(job, *views[0].jobs[1:])))
    with pytest.raises(UserError, match="cannot reach"):
        make_scheduler("serve:http://127.0.0.1:9", testbed)
    with pytest.raises(UserError, match="not an http"):
        make_scheduler("serve:ftp://x", testbed)
    with pytest.raises(UserError, match="does not serve"):
        make_scheduler(f"serve:{endpoint.url}?scheduler=nope", testbed)


def test_a_whole_simulation_through_the_endpoint_equals_in_process(endpoint, testbed):
    served = run_one(testbed, RunSpec(f"serve:{endpoint.url}", 3), None)
    local = run_one(testbed, RunSpec(f"dl2:{SHIPPED}", 3), None)
    assert served.jct == local.jct and served.metrics == local.metrics


@pytest.mark.slow
def test_compare_cli_with_a_serve_scheduler(endpoint):
    out = subprocess.run(
        [sys.executable, "-m", "dl2ray", "compare", "--config", str(TESTBED), "--traces", "1", "--json",
         "--processes", "2", "--schedulers", f"dl2:{SHIPPED},serve:{endpoint.url}"],
        capture_output=True, text=True, timeout=300, check=True)
    rows = {r["scheduler"]: r for r in json.loads(out.stdout)["results"]}
    assert rows[f"serve:{endpoint.url}"]["avg_jct"] == rows[f"dl2:{SHIPPED}"]["avg_jct"]
