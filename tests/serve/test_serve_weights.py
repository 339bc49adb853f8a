"""The weight store: a file that fails to load keeps the old weights; the next good file is served."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest
from serve_support import SHIPPED, TESTBED

from dl2ray.errors import UserError
from serve.app import DecisionService
from serve.client import ServeScheduler
from serve.schemas import DecideRequest
from serve.weights import CheckpointFile


def _wait(cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_broken_file_keeps_the_old_weights_then_the_next_good_one_is_served(tmp_path, views,
                                                                                other_checkpoint):
    ckpt = tmp_path / "policy.pt"
    shutil.copyfile(SHIPPED, ckpt)
    service = DecisionService({"config": str(TESTBED), "checkpoint": str(ckpt), "reload_every_s": 0.05})
    try:
        old = service.store.current.version
        request = DecideRequest.model_validate_json(ServeScheduler("http://unused").body(views[-1]))
        ckpt.write_bytes(b"not a checkpoint")
        _wait(lambda: service.store.failures >= 1)
        info = asyncio.run(service.policy())
        assert info.version == old and info.reloads == 0
        assert "not a dl2ray policy checkpoint" in info.last_error
        assert asyncio.run(service.decide(request)).policy_version == old  # still serving
        tmp = tmp_path / "incoming.pt"
        shutil.copyfile(other_checkpoint, tmp)
        os.replace(tmp, ckpt)
        _wait(lambda: service.store.reloads == 1)
        assert asyncio.run(service.decide(request)).policy_version == service.store.current.version != old
        # rewriting identical bytes is not a new version
        shutil.copyfile(other_checkpoint, tmp)
        os.replace(tmp, ckpt)
        time.sleep(0.3)
        assert service.store.reloads == 1
    finally:
        service.close()
    assert not service.store.watching  # close() stopped and joined the watcher thread


def test_versions_name_the_content(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    shutil.copyfile(SHIPPED, a)
    shutil.copyfile(SHIPPED, b)
    va, vb = CheckpointFile(a).poll(None), CheckpointFile(b).poll(None)
    assert va is not None and vb is not None
    assert va[0].split("@")[1] == vb[0].split("@")[1] and va[1] == SHIPPED.read_bytes()
    assert CheckpointFile(a).poll(va[0]) is None  # same content as the version served: nothing new


def test_a_checkpoint_for_another_config_is_refused_at_start(tmp_path):
    paper = SHIPPED.with_name("dl2-testbed-paper.pt")  # J = 20; the large config's window is 40
    with pytest.raises(UserError, match=r"checkpoint:.*state dim"):
        DecisionService({"config": "configs/large.yaml", "checkpoint": str(paper)})
    with pytest.raises(UserError, match="give a policy checkpoint"):
        DecisionService({"config": str(TESTBED)})
