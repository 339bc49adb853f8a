"""Profile features of the shape policy: columns by hand, the row head (numpy = torch), checkpoints, and
that the policy needs no job-type identity."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from policy_tiny import CAT, job, view
from support import CONFIGS, small_config

from dl2ray.policy.network import CheckpointError
from dl2ray.policy.shape import (
    GRID,
    JOB_EXTRA,
    PROFILE_JOB,
    ROW_DIM,
    ShapeEncoding,
    job_features,
    observed_slowness,
)
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_net import (
    NumpyShapePolicy,
    build_shape_policy,
    load_shape_checkpoint,
    save_shape_checkpoint,
)
from dl2ray.view import JobView, Observation

CFG = small_config(cluster={"nodes": [{"count": 2, "cpu": 8, "gpu": 2, "mem": 48}]},
                   profile=str(CONFIGS / "profiles" / "testbed.json"),
                   policy={"arch": "shape", "shape": {"profile_features": True}})
ENC = ShapeEncoding.from_config(CFG)


def test_dimensions_and_the_cost_grid():
    assert ENC.profile and ENC.job_columns == JOB_EXTRA + PROFILE_JOB
    assert ENC.job_dim == JOB_EXTRA + PROFILE_JOB + ROW_DIM * ENC.num_shapes
    assert ENC.cost.shape == (len(CAT), GRID, GRID)
    from dl2ray.knowledge.profile import config_profile

    prof = config_profile(CFG).types["vgg-16"]
    t = CAT.index("vgg-16")
    assert ENC.cost[t, 2, 4] == pytest.approx(CAT.types[t].batches_per_epoch / prof.batches_per_second(3, 5))


def test_observed_slowness_by_hand():
    t = CAT.index("resnet-50")
    grid = ENC.cost[t]
    hist = (Observation(0, 1, 1, epochs=10.0, seconds=10.0 * grid[0, 0] * 1.5, loss=1.0),
            Observation(1, 2, 4, epochs=0.0, seconds=0.0, loss=1.0),  # did not train: ignored
            Observation(2, 2, 4, epochs=5.0, seconds=5.0 * grid[1, 3] * 1.2, loss=1.0))
    j = JobView(1, "resnet-50", t, 0, 2, 100.0, 15.0, 4, 2, (), (), CAT.worker_demand[t], CAT.ps_demand[t],
                12, 16, hist)
    assert observed_slowness(j, grid) == pytest.approx(math.sqrt(1.5 * 1.2))
    assert observed_slowness(j, grid.tolist()) == pytest.approx(math.sqrt(1.5 * 1.2))
    assert observed_slowness(job(2), grid) == 1.0
    slow = replace(j, history=(hist[0]._replace(seconds=hist[0].seconds * 10),))
    assert observed_slowness(slow, grid) == pytest.approx(math.e)  # 15× slower than profiled: clipped at e


def test_profile_columns_by_hand():
    t = CAT.index("wlm")
    jv = job(3, "wlm", est=100.0, done=40.0)
    v = view(jv)
    x, _ = job_features(v, ENC)
    row = x[0]
    c = ENC.cost[t]
    t1 = 60.0 * c[0, 0] / 1200.0
    assert row[JOB_EXTRA] == pytest.approx(math.log10(1 + t1) / 3, rel=1e-5)
    assert row[JOB_EXTRA + 1] == 0.0  # never ran: slowness 1
    assert row[JOB_EXTRA + 2] == pytest.approx(min(CAT.worker_demand[t][1], 1.0))
    rows = row[ENC.job_columns:].reshape(ENC.num_shapes, ROW_DIM)
    assert not rows[0].any()  # wait
    k = ENC.menu.index((4, 2))
    assert rows[k, 0] == pytest.approx(np.clip(math.log(c[1, 3] / c[0, 0]), -3, 1) / 3, rel=1e-5)
    assert rows[k, 1] == pytest.approx(math.log10(1 + t1 * c[1, 3] / c[0, 0]) / 3, rel=1e-5)
    share = (4 * jv.worker_demand + 2 * jv.ps_demand) / v.total_capacity
    assert rows[k, 2] == pytest.approx(min(np.max(share) * 1 / 8, 1.0), rel=1e-5)
    assert rows[k, 3] == 0.0 and rows[k, 4] == pytest.approx(4 / 8) and rows[k, 5] == pytest.approx(2 / 16)


def test_job_type_identity_is_not_an_input():
    """Two jobs of different types whose profiles and observations were equal would get equal rows: the type
    enters only through its profile (so a new type needs only a profile)."""
    same_profile = ShapeEncoding(ENC.num_types, ENC.menu, ENC.slots_run_scale, ENC.work_conserving, True,
                                 np.stack([ENC.cost[0]] * len(CAT)))
    a = job(1, "resnet-50")
    b = replace(job(2, "vgg-16"), worker_demand=a.worker_demand, ps_demand=a.ps_demand)
    x, _ = job_features(view(a, b), same_profile)
    np.testing.assert_array_equal(x[0], x[1])


def test_numpy_equals_torch_and_the_checkpoint_round_trips(tmp_path):
    net = build_shape_policy(ENC, (16,), 8, seed=4)
    v = view(job(0, "resnet-50"), job(1, "dssm", done=50.0), job(2, "wlm"))
    x, g = job_features(v, ENC)
    with torch.no_grad():
        t = net(torch.tensor(x)[None], torch.ones(1, 3, dtype=torch.bool), torch.tensor(g)[None])[0]
    np.testing.assert_allclose(NumpyShapePolicy(net).logits(x, g), t.numpy(), rtol=1e-5, atol=1e-5)
    path = tmp_path / "p.pt"
    save_shape_checkpoint(path, net, CAT.names)
    back = load_shape_checkpoint(path, expect=ENC).policy
    assert back.enc == ENC and back.enc.cost is ENC.cost  # features come from the config's profile
    per_job = build_shape_policy(replace(ENC, interleaved=not ENC.interleaved), (16,), 8, seed=4)
    save_shape_checkpoint(tmp_path / "q.pt", per_job, CAT.names)
    saved = load_shape_checkpoint(tmp_path / "q.pt", expect=ENC).policy.enc
    assert saved.interleaved != ENC.interleaved and saved.cost is ENC.cost  # it decodes as it was saved
    np.testing.assert_allclose(NumpyShapePolicy(back).logits(x, g), t.numpy(), rtol=1e-5, atol=1e-5)
    plain = ShapeEncoding(ENC.num_types, ENC.menu, ENC.slots_run_scale, ENC.work_conserving)
    with pytest.raises(CheckpointError, match="profile features"):
        load_shape_checkpoint(path, expect=plain)
    dec = decide_shapes(v, ENC, NumpyShapePolicy(back).logits(x, g))
    assert set(dec.allocation.tasks) <= {0, 1, 2}


@pytest.mark.parametrize("enc", [ENC, ShapeEncoding(ENC.num_types, ENC.menu, ENC.slots_run_scale,
                                                    ENC.work_conserving)], ids=["profile", "plain"])
def test_the_packed_layout_scores_every_job_as_the_padded_one(enc):
    """Training's packed batches (no padding, each slot's context over its own rows) give the padded
    layout's logits and gradients, for slots of different sizes (an empty one included)."""
    from dl2ray.learn.shape.sl import PackedSlots, SlotSample

    net = build_shape_policy(enc, (16, 16), 8, seed=2)
    sizes = [3, 1, 0, 5]
    slots = []
    for b, n in enumerate(sizes):
        v = view(*[job(10 * b + i, CAT.names[(b + 3 * i) % len(CAT)], done=7.0 * i) for i in range(n)])
        x, g = job_features(v, enc)
        slots.append(SlotSample(x, g, np.ones((n, enc.num_shapes), bool), np.zeros(n, np.int64)))
    packed = PackedSlots.of(slots, enc.num_shapes)
    assert packed.jobs == sum(sizes) and packed.start.tolist() == [0, 3, 4, 4]
    width = max(sizes)
    x = torch.zeros(len(sizes), width, packed.x.shape[1])
    present = torch.zeros(len(sizes), width, dtype=torch.bool)
    for b, s in enumerate(slots):
        x[b, :len(s.actions)], present[b, :len(s.actions)] = torch.from_numpy(s.x), True
    padded = net(x, present, packed.g)[present]
    rows = net.packed(packed.x, packed.slot, packed.g)
    torch.testing.assert_close(rows, padded, rtol=1e-5, atol=1e-5)
    weights = torch.linspace(-1, 1, rows.numel()).reshape(rows.shape)
    grads = [torch.autograd.grad((out * weights).sum(), list(net.parameters())) for out in (padded, rows)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
