"""The Ray Serve application over real HTTP on a free loopback port, pulling weights from a GlobalPolicy.

One app for the whole module (Serve starts in seconds, not milliseconds): it starts on the shipped
checkpoint, then follows a GlobalPolicy actor (fresh networks) of the test's Ray session.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
from serve_support import SHIPPED, TESTBED, free_port
from support import wait_for

from dl2ray.schedulers.dl2 import DL2Scheduler
from serve.app import build
from serve.client import ServeError, ServeScheduler
from serve.proto import SERVICER

pytestmark = [pytest.mark.ray, pytest.mark.slow]



@pytest.fixture(scope="module")
def served(ray_session, testbed):
    from ray import serve as ray_serve

    from clusters.a3c.global_policy import A3COptions, GlobalPolicy

    name, namespace = "dl2ray-test-global", ray_session.get_runtime_context().namespace
    # fresh networks (seed 7), not the shipped ones: the pull visibly changes what is served
    gp = GlobalPolicy.options(name=name).remote(testbed, None, 7, None,
                                               A3COptions(agents=1, traces=1, val_every=None))
    ray_session.get(gp.stats.remote())
    port, grpc_port = free_port(), free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port},
                    grpc_options={"port": grpc_port, "grpc_servicer_functions": [SERVICER]})
    settings = {"config": str(TESTBED), "checkpoint": str(SHIPPED), "reload_every_s": 0.2,
                "global_policy": name, "global_namespace": namespace, "max_body_bytes": 1 << 20}
    ray_serve.run(build(settings), name="dl2ray-test", route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}", gp, f"grpc://127.0.0.1:{grpc_port}"
    finally:
        ray_serve.shutdown()
        ray_session.kill(gp, no_restart=True)


def _pulled(gp, ray_session, testbed) -> DL2Scheduler:
    """The GlobalPolicy's current weights, read in-process through the same checkpoint code."""
    _, data = ray_session.get(gp.checkpoint_bytes.remote())
    return DL2Scheduler.from_checkpoint_bytes(data, testbed)


def _decisions(scheduler, views) -> list:
    return [list(scheduler.decide(v).tasks.items()) for v in views]


def test_serves_over_http_and_follows_the_global_policy(served, views, testbed, ray_session):
    url, gp, _ = served
    version = lambda: requests.get(f"{url}/v1/policy").json()["version"]  # noqa: E731
    # The app started on the shipped checkpoint; the first pull replaces it with the actor's weights.
    wait_for("the first pull", lambda: version() == "global:dl2ray-test-global@0", poll_s=0.1)
    client = ServeScheduler(url)
    assert [list(client.decide(v).tasks.items()) for v in views] == _decisions(
        _pulled(gp, ray_session, testbed), views)
    assert client.last_version == "global:dl2ray-test-global@0"
    assert _decisions(client, views) != _decisions(DL2Scheduler(str(SHIPPED), testbed), views)

    # one Adam step of the global networks: the endpoint pulls the new weights and decides as they do
    _, weights = ray_session.get(gp.get_weights.remote())
    step = np.random.default_rng(0).normal(0, 1.0, weights.shape).astype(np.float32)
    assert ray_session.get(gp.apply_gradients.remote(step, 0)) == 1
    wait_for("the second pull", lambda: version() == "global:dl2ray-test-global@1", poll_s=0.1)
    assert _decisions(client, views) == _decisions(_pulled(gp, ray_session, testbed), views)
    assert client.last_version == "global:dl2ray-test-global@1"
    assert requests.get(f"{url}/v1/policy").json()["reloads"] == 2


def test_bad_and_oversized_requests_over_serve(served, views):
    url, _, _ = served
    body = json.loads(ServeScheduler(url).body(views[0]))
    body["view"]["jobs"][0]["job_type"] = "resnet-51"
    r = requests.post(f"{url}/v1/decide", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "view", "jobs", 0, "job_type"]
    r = requests.post(f"{url}/v1/decide", data=b"{" * ((1 << 20) + 1),
                      headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert requests.get(f"{url}/healthz").status_code == 200
    assert requests.get(f"{url}/openapi.json").json()["paths"]["/v1/decide"]["post"]


def test_grpc_through_serves_proxy_answers_like_http(served, views):
    """Serve's gRPC proxy → replica (the request message is pickled on the way: its module must import
    as serve.proto.decide_pb2); errors come back as status codes."""
    url, _, grpc_url = served
    over_http, over_grpc = ServeScheduler(url), ServeScheduler(grpc_url)
    for view in views:
        assert list(over_grpc.decide(view).tasks.items()) == list(over_http.decide(view).tasks.items())
    assert over_grpc.last_version == over_http.last_version
    with pytest.raises(ServeError, match="INVALID_ARGUMENT"):
        ServeScheduler(grpc_url, "no-such-heuristic").decide(views[0])
