"""The Serve application's handlers in Serve's local testing mode (no cluster): decisions and hot reload."""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_support import SHIPPED, TESTBED

from dl2ray.schedulers.dl2 import DL2Scheduler
from serve.app import build
from serve.client import ServeScheduler
from serve.schemas import DecideRequest


def _request(view, scheduler: str = "dl2") -> DecideRequest:
    return DecideRequest.model_validate_json(ServeScheduler("http://unused", scheduler).body(view))


@pytest.fixture
def app(tmp_path):
    """The app in local testing mode on a copy of the shipped checkpoint, polled every 50 ms."""
    from ray import serve as ray_serve

    ckpt = tmp_path / "policy.pt"
    shutil.copyfile(SHIPPED, ckpt)
    handle = ray_serve.run(build({"config": str(TESTBED), "checkpoint": str(ckpt), "reload_every_s": 0.05}),
                           name="dl2ray-local", _local_testing_mode=True)
    yield handle, ckpt
    handle.close.remote().result()  # stops the weight watcher thread


def test_handlers_decide_like_the_core(app, views, testbed):
    handle, _ = app
    info = handle.policy.remote().result()
    assert info.version.startswith("policy.pt@") and info.config == "testbed"
    local = DL2Scheduler(str(SHIPPED), testbed)
    for view in views:
        resp = handle.decide.remote(_request(view)).result()
        mine = local.decide(view)
        assert [(a.job_id, a.workers, a.ps) for a in resp.allocation] == [
            (j, t.workers, t.ps) for j, t in mine.tasks.items()]
        assert resp.policy_version == info.version and resp.scheduler == "dl2" and resp.decision_ms > 0
    drf = handle.decide.remote(_request(views[-1], "drf")).result()
    assert drf.policy_version == "heuristic:drf" and drf.allocation
    assert handle.healthz.remote().result().policy_version == info.version


def test_hot_reload_mid_stream_fails_no_request(app, views, testbed, other_checkpoint):
    """Clients keep sending while the checkpoint file is replaced: every request succeeds, the version
    changes once, and every answer is the in-process decision of the version it names."""
    handle, ckpt = app
    old = handle.policy.remote().result().version
    expected = {}
    for path in (SHIPPED, other_checkpoint):
        sched = DL2Scheduler(str(path), testbed)
        expected[path] = [list(sched.decide(v).tasks.items()) for v in views]
    assert expected[SHIPPED] != expected[other_checkpoint]  # the two policies decide differently here
    requests = [_request(v) for v in views]
    stop, answers, errors = threading.Event(), [], []

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            try:
                resp = handle.decide.remote(requests[i % len(views)]).result()
                answers.append((time.monotonic(), i % len(views), resp))
            except Exception as exc:  # counted, asserted below
                errors.append(exc)
            i += 1

    with ThreadPoolExecutor(3) as pool:
        for k in range(3):
            pool.submit(client, k)
        while len(answers) < 30:
            time.sleep(0.01)
        tmp = ckpt.with_name("incoming.pt")
        shutil.copyfile(other_checkpoint, tmp)
        os.replace(tmp, ckpt)  # atomic, as the trainers write
        swapped = time.monotonic()
        deadline = swapped + 60
        while time.monotonic() < deadline and not any(r.policy_version != old for _, _, r in answers[-5:]):
            time.sleep(0.02)
        n = len(answers)
        while len(answers) < n + 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
    assert not errors
    versions = [r.policy_version for _, _, r in answers]
    new = handle.policy.remote().result().version
    assert new != old and new.startswith("policy.pt@") and set(versions) == {old, new}
    for _, i, r in answers:
        want = expected[SHIPPED if r.policy_version == old else other_checkpoint][i]
        assert [(a.job_id, (a.workers, a.ps)) for a in r.allocation] == [(j, tuple(t)) for j, t in want]
    # once the new weights answered, no later request went back to the old ones
    first_new = min(t for t, _, r in answers if r.policy_version == new)
    assert all(r.policy_version == new for t, _, r in answers if t > first_new + 1.0)
    assert handle.policy.remote().result().reloads == 1
