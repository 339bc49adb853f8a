"""Checkpoint round trip, dimension checks, masked logits, the DL2 scheduler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import small_config

from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import (
    CheckpointError,
    NumpyPolicy,
    build_networks,
    load_checkpoint,
    masked_logits,
    save_checkpoint,
)
from dl2ray.schedulers.base import make_scheduler


def test_masked_logits_softmax_zero_on_masked():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    p = torch.softmax(masked_logits(logits, torch.tensor([[True, False, True]])), dim=1)
    assert p[0, 1] == 0 and p[0].sum() == pytest.approx(1.0)


def test_same_seed_same_init():
    enc = Encoding(4, 8)
    a, b = build_networks(enc, (8,), 3)[0], build_networks(enc, (8,), 3)[0]
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_round_trip_and_mismatch(tmp_path, testbed):
    enc = Encoding.from_config(testbed)
    pol, val = build_networks(enc, (16, 8), 0)
    path = tmp_path / "p.pt"
    save_checkpoint(path, pol, val, testbed.catalogue.names, extra={"kind": "test"})
    ck = load_checkpoint(path, expect=enc, catalogue=testbed.catalogue.names)
    x = torch.rand(3, enc.state_dim)
    assert torch.equal(ck.policy(x), pol(x)) and torch.equal(ck.value(x), val(x))
    assert ck.meta.hidden == (16, 8) and ck.extra == {"kind": "test"}
    with pytest.raises(CheckpointError, match="state dim"):
        load_checkpoint(path, expect=Encoding(40, enc.num_types))
    with pytest.raises(CheckpointError, match="job types"):
        load_checkpoint(path, catalogue=("a",) * enc.num_types)
    with pytest.raises(CheckpointError, match="no such"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="not a dl2ray"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"weights": {}}, tmp_path / "nometa.pt")
    with pytest.raises(CheckpointError, match=r"not a dl2ray.*meta"):
        load_checkpoint(tmp_path / "nometa.pt")


def test_dl2_scheduler_runs_and_refuses_wrong_window(tmp_path, testbed):
    from dl2ray.world import build_simulator

    enc = Encoding.from_config(testbed)
    pol, val = build_networks(enc, (16,), 0)
    path = tmp_path / "p.pt"
    save_checkpoint(path, pol, val, testbed.catalogue.names)
    sched = make_scheduler(f"dl2:{path}", testbed)
    sim = build_simulator(testbed)
    view = sim.reset(0)
    for _ in range(3):
        view = sim.step(sched.decide(view)).view  # the simulator validates every allocation
    with pytest.raises(CheckpointError):
        make_scheduler(f"dl2:{path}", small_config(policy={"window": 5}))
    fast = NumpyPolicy.from_torch(pol)
    assert fast.logits(np.zeros(enc.state_dim, np.float32)).shape == (enc.action_dim,)
