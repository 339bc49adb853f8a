"""Supervised warm-start on a tiny config: reproduces its teacher; same seed, same curve."""

from __future__ import annotations

import json

import pytest
from support import small_config

from dl2ray.learn import seeds
from dl2ray.learn.sl import SLRun, record, run_sl, train
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import build_networks, load_checkpoint

TINY = small_config(
    cluster={"nodes": [{"count": 4, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 8, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 3}},
    policy={"window": 8, "hidden": [64, 64], "sl_batch_size": 64},
)


@pytest.mark.slow
def test_sl_reproduces_drf(tmp_path):
    out = tmp_path / "sl.pt"
    run = SLRun("drf", traces=10, val_traces=2, epochs=25, seed=0, max_slots=200)
    _, _, res = run_sl(TINY, run, out=out, logdir=tmp_path / "tb")
    assert res.val_accuracy >= 0.9
    assert res.jct["ratio"] == pytest.approx(1.0, abs=0.1)
    load_checkpoint(out, expect=Encoding.from_config(TINY), catalogue=TINY.catalogue.names)
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["seed"] == 0 and doc["teacher"] == "drf" and doc["config"]["policy"]["window"] == 8
    assert doc["train_seeds"] == seeds.training(10) and doc["val_seeds"] == seeds.validation(2)
    assert list((tmp_path / "tb").iterdir())  # TensorBoard events


def test_same_seed_same_loss_curve():
    data = record(TINY, "drf", seeds.training(2), 30)
    val = record(TINY, "drf", seeds.validation(1), 30)
    assert len(data) > 50
    curves = []
    for _ in range(2):
        pol, _ = build_networks(Encoding.from_config(TINY), TINY.policy.hidden, 7)
        curves.append([(h.loss, h.val_loss) for h in train(pol, data, val, 0.005, 3, 32, seed=7)])
    assert curves[0] == curves[1]
