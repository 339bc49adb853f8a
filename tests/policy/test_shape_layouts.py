"""Placement as the policy's decision (``policy.shape.layouts``, issue 36): every (w, p) of the menu once per
placer, each job's tasks where its row's placer puts them; features, labels and checkpoints carry it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_tiny import CAT, CFG, L, job, view
from support import CONFIGS

from dl2ray.config import load_config
from dl2ray.policy.network import CheckpointError, read_checkpoint_doc
from dl2ray.policy.shape import LAYOUT_DIM, ROW_DIM, ShapeEncoding, job_features, layout_label, menu_rows
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_net import (
    NumpyShapePolicy,
    build_shape_policy,
    load_shape_checkpoint,
    load_shape_policy,
    save_shape_checkpoint,
)
from dl2ray.speed import analytic_iteration_time, spread_layout
from dl2ray.view import JobPlacement

PLAIN = ShapeEncoding.from_config(CFG)


def _with_layouts(cfg, layouts):
    shape = cfg.policy.shape.model_copy(update={"layouts": tuple(layouts)})
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"shape": shape})})


TWO = ShapeEncoding.from_config(_with_layouts(CFG, ["load_balancing", "packing"]))
NETS = [NumpyShapePolicy(build_shape_policy(PLAIN, (16,), 8, s)) for s in range(3)]


def test_the_menu_repeats_every_shape_once_per_layout():
    assert menu_rows((1, 2), (1,), 2) == ((0, 0), (1, 1), (1, 1), (2, 1), (2, 1))
    assert TWO.num_shapes == 1 + 2 * (PLAIN.num_shapes - 1)
    assert TWO.menu[1::2] == PLAIN.menu[1:] and TWO.menu[2::2] == PLAIN.menu[1:]
    assert TWO.row_layouts.tolist() == [0] + [0, 1] * (PLAIN.num_shapes - 1)
    row = TWO.nearest(2, 2, layout=1)
    assert TWO.menu[row] == (2, 2) and TWO.row_layouts[row] == 1
    assert TWO.nearest(0, 3, layout=1) == 0


@pytest.mark.parametrize("placer", ["load_balancing", "packing", "tetris", "optimus"])
@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(1, 5), types=st.lists(st.integers(0, L - 1), max_size=7), net=st.integers(0, 2),
       seed=st.integers(0, 2**16), interleaved=st.booleans())
def test_one_layout_decides_as_the_view_placer_of_that_name(placer, nodes, types, net, seed, interleaved):
    """A single layout is the view's placer moved into the policy: the same decision, task for task."""
    v = dataclasses.replace(view(*[job(i, CAT.names[t]) for i, t in enumerate(types)], nodes=nodes),
                            placement=placer)
    plain = dataclasses.replace(PLAIN, interleaved=interleaved)
    one = dataclasses.replace(plain, layouts=(placer,))
    x, g = job_features(v, plain)
    logits = NETS[net].logits(x, g)
    a = decide_shapes(v, plain, logits, np.random.default_rng(seed))
    b = decide_shapes(dataclasses.replace(v, placement="load_balancing"), one, logits,
                      np.random.default_rng(seed))
    assert a.allocation == b.allocation
    np.testing.assert_array_equal(a.actions, b.actions)


def test_each_job_goes_where_its_rows_placer_puts_it():
    """Two identical jobs on four empty nodes: the one that chose a packing row shares nodes, the one that
    chose a load-balancing row gets a node per task."""
    v = view(job(0), job(1), nodes=4)
    logits = np.full((2, TWO.num_shapes), -20.0, np.float32)
    pack, spread = TWO.nearest(1, 1, layout=1), TWO.nearest(1, 1, layout=0)
    logits[0, pack], logits[1, spread] = 20.0, 19.0
    for enc in (TWO, dataclasses.replace(TWO, interleaved=True)):
        alloc = decide_shapes(v, enc, logits).allocation
        packed, spread_out = alloc.placement[0], alloc.placement[1]
        assert len(set(packed.worker_nodes + packed.ps_nodes)) == 1
        assert len(set(spread_out.worker_nodes + spread_out.ps_nodes)) == 2


def test_layout_features_give_the_row_and_its_analytic_gain():
    cfg = _with_layouts(load_config(CONFIGS / "testbed.yaml"), ["load_balancing", "packing"])
    enc = ShapeEncoding.from_config(cfg)
    assert enc.row_dim == ROW_DIM + LAYOUT_DIM and enc.gain is not None
    t = cfg.catalogue.index("resnet-50")
    jt = cfg.catalogue.types[t]
    spread, packed = enc.nearest(1, 1, 0), enc.nearest(1, 1, 1)
    # one worker and one PS: spread on two nodes; packed on one node of 8 cores and 2 GPUs
    want = math.log(analytic_iteration_time(jt, spread_layout(1, 1)) / analytic_iteration_time(jt, ((1, 1),)))
    assert enc.gain[t, spread] == 0.0
    assert enc.gain[t, packed] == pytest.approx(max(-1.0, min(1.0, want)), abs=1e-6)
    j = job(0, "resnet-50")
    v = view(j, nodes=4)
    x, _ = job_features(v, enc)
    rows = x[0, enc.job_columns:].reshape(enc.num_shapes, enc.row_dim)
    assert rows[packed, ROW_DIM] == 1.0 and rows[spread, ROW_DIM] == 0.0
    assert rows[packed, ROW_DIM + 1] == pytest.approx(enc.gain[t, packed])


def test_a_teachers_layout_is_labelled_with_the_nearest_placer():
    j = job(0)
    node = np.array([8.0, 2.0, 48.0])
    assert layout_label(TWO, j, JobPlacement((0, 0), (0, 0)), node) == 1  # 2 + 2 tasks on one node: packed
    assert layout_label(TWO, j, JobPlacement((0, 1), (2, 3)), node) == 0  # one node per task: spread
    assert layout_label(PLAIN, j, JobPlacement((0, 0), (0, 0)), node) == 0  # no layouts


def test_checkpoints_carry_their_layouts_and_deploy_with_them(tmp_path):
    cfg = load_config(CONFIGS / "testbed.yaml")
    two = _with_layouts(cfg, ["load_balancing", "packing"])
    enc = ShapeEncoding.from_config(two)
    net = build_shape_policy(enc, (16,), 8, 0)
    path = tmp_path / "p.pt"
    save_shape_checkpoint(path, net, cfg.catalogue.names)
    assert read_checkpoint_doc(path)["meta"]["layouts"] == ["load_balancing", "packing"]
    loaded = load_shape_policy(path, cfg)  # a config without layouts: the checkpoint's own are used
    assert loaded.enc.layouts == ("load_balancing", "packing") and loaded.enc.num_shapes == enc.num_shapes
    with pytest.raises(CheckpointError, match="layouts"):
        load_shape_checkpoint(path, expect=ShapeEncoding.from_config(cfg))
    from dl2ray.schedulers.base import make_scheduler

    for forced in (None, "packing"):  # it places by its own rows: tables say so, forced or not
        assert make_scheduler(f"dl2:{path}", cfg, forced).placement_label == "policy(load_balancing|packing)"
    assert make_scheduler("optimus", cfg, "packing").placement_label == "packing"
    import torch

    doc = read_checkpoint_doc(path)
    doc["meta"]["layouts"] = ["spread"]
    torch.save(doc, path)
    with pytest.raises(CheckpointError, match="layouts"):
        load_shape_policy(path, cfg)
