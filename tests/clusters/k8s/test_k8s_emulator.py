"""The benchmark's API server: the emulator with a bounded request log (FreshLog) keeps its objects."""

from __future__ import annotations

import json

import kubernetes
import pytest
from emulator import Emulator, node


@pytest.fixture()
def fresh():
    emu = Emulator(fresh_log_every=4)
    yield emu
    emu.close()


def pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"dl2ray.io/job": "j"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def test_objects_writes_and_deletes_survive_the_moves(fresh):
    conf = kubernetes.client.Configuration()
    conf.host = fresh.url
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(conf))
    core.create_node(node("n0"))
    for i in range(10):
        core.create_namespaced_pod("default", pod(f"p{i}"), _preload_content=False)
    for i in range(0, 10, 2):
        core.patch_namespaced_pod_status(f"p{i}", "default", {"status": {"phase": "Running"}})
    for i in range(0, 10, 5):
        core.delete_namespaced_pod(f"p{i}", "default", _preload_content=False)
    with pytest.raises(kubernetes.client.ApiException) as err:  # created once, still there: 409
        core.create_namespaced_pod("default", pod("p1"), _preload_content=False)
    assert err.value.status == 409

    items = json.loads(core.list_namespaced_pod("default", _preload_content=False).data)["items"]
    phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in items}
    assert phases == {f"p{i}": ("Running" if i % 2 == 0 else None) for i in range(10) if i % 5}
    assert core.read_node("n0").metadata.name == "n0"
    assert fresh.front is not None and fresh.front.moves >= 5  # 29 requests, a move every 4


def test_reactions_are_refused_with_a_fresh_log(fresh):
    with pytest.raises(RuntimeError, match="fresh_log_every"):
        fresh.react("post", "", "v1", "pods", 500, times=1)
