"""The shape policy: menu, features, the compiled decision (feasible, truncated, forced), the network."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_tiny import CAT, CFG, L, job, view

from dl2ray.policy.network import CheckpointError
from dl2ray.policy.shape import JOB_EXTRA, WAIT, ShapeEncoding, job_features
from dl2ray.policy.shape_decode import cap_mask, decide_shapes, run_order
from dl2ray.policy.shape_net import (
    NumpyShapePolicy,
    build_shape_policy,
    load_policy_net,
    load_shape_checkpoint,
    save_shape_checkpoint,
)
from dl2ray.schedulers.dl2 import DL2Scheduler
from dl2ray.view import ClusterView, JobView, Observation

ENC = ShapeEncoding.from_config(CFG)
NETS = [NumpyShapePolicy(build_shape_policy(ENC, (16,), 8, s)) for s in range(3)]


def test_menu_is_wait_then_the_grid_in_order():
    s = CFG.policy.shape
    assert ENC.menu[0] == (0, 0)
    assert ENC.menu[1:] == tuple((w, p) for w in s.menu_workers for p in s.menu_ps)
    assert ENC.num_shapes == 1 + len(s.menu_workers) * len(s.menu_ps)
    assert ENC.job_dim == L + JOB_EXTRA


@pytest.mark.parametrize("counts", [(1, 1), (1, 3), (2, 16), (5, 7), (12, 1), (3, 30)])
def test_nearest_menu_row_minimises_the_log_distance(counts):
    w, p = counts
    got = ENC.menu[ENC.nearest(w, p)]
    d = {m: abs(math.log(m[0]) - math.log(w)) + abs(math.log(m[1]) - math.log(p)) for m in ENC.menu[1:]}
    assert d[got] == min(d.values())
    if counts in ENC.menu:
        assert got == counts  # a menu row maps to itself


@pytest.mark.parametrize("counts", [(0, 0), (0, 3), (2, 0)])
def test_a_job_without_both_roles_maps_to_wait(counts):
    assert ENC.nearest(*counts) == WAIT


def test_job_features_by_hand():
    hist = (Observation(slot=3, ps=2, workers=1, epochs=6.0, seconds=600.0, loss=1.0),)
    j = JobView(7, "vgg-16", CAT.index("vgg-16"), 1, 4, 100.0, 40.0, 1, 2, (0,), (0, 1),
                CAT.worker_demand[1], CAT.ps_demand[1], 12, 16, hist)
    v = view(j)
    v = type(v)(5, 1200.0, v.capacity, v.free, v.jobs, CAT, "load_balancing")
    x, g = job_features(v, ENC)
    assert x.shape == (1, L + JOB_EXTRA) and g.shape == (4,)
    row = x[0]
    assert row[CAT.index("vgg-16")] == 1 and row[:L].sum() == 1
    expect = [60 / 100, math.log10(61) / 5, 4 / 100, (5 - 1) / 100, 1 / 16, 2 / 16,
              min(6.0 / 600.0 * 1200.0 / 60.0, 1.0), 1.0]
    np.testing.assert_allclose(row[L:], expect, rtol=1e-6)
    total = v.total_capacity
    bundle = (j.worker_demand + j.ps_demand) / total
    np.testing.assert_allclose(g, [1 / total[1], 1 / 100, bundle[0], bundle[1]], rtol=1e-6)


def test_cap_mask_and_run_order():
    jobs = [job(0, max_workers=2, max_ps=3), job(1)]
    caps = cap_mask(view(*jobs), ENC)
    for k, (w, p) in enumerate(ENC.menu):
        assert caps[0, k] == (w <= 2 and p <= 3)
        assert caps[1, k]
    logits = np.zeros((2, ENC.num_shapes), np.float32)
    logits[0, WAIT] = -3.0  # job 0 wants to run much more than job 1
    assert run_order(logits, caps).tolist() == [0, 1]
    logits[1, WAIT] = -10.0
    assert run_order(logits, caps).tolist() == [1, 0]


def _feasible(v, dec) -> None:
    jobs = {j.job_id: j for j in v.jobs}
    usage = np.zeros_like(v.capacity)
    for job_id, t in dec.allocation.tasks.items():
        jv = jobs[job_id]
        assert 1 <= t.workers <= jv.max_workers and 1 <= t.ps <= jv.max_ps
        pl = dec.allocation.placement[job_id]
        assert (len(pl.worker_nodes), len(pl.ps_nodes)) == tuple(t)
        for n in pl.worker_nodes:
            usage[n] += jv.worker_demand
        for n in pl.ps_nodes:
            usage[n] += jv.ps_demand
    assert np.all(usage <= v.capacity + 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 4), cpu=st.sampled_from([2.0, 4.0, 8.0]), gpu=st.integers(0, 2),
    types=st.lists(st.integers(0, L - 1), min_size=0, max_size=8),
    net=st.integers(0, 2), seed=st.integers(0, 2**16), greedy=st.booleans(),
)
def test_decisions_are_feasible_and_follow_the_masks(nodes, cpu, gpu, types, net, seed, greedy):
    v = view(*[job(i, CAT.names[t]) for i, t in enumerate(types)], nodes=nodes, cpu=cpu, gpu=float(gpu))
    x, g = job_features(v, ENC)
    logits = NETS[net].logits(x, g)
    dec = decide_shapes(v, ENC, logits, None if greedy else np.random.default_rng(seed))
    _feasible(v, dec)
    for i, jv in enumerate(v.jobs):
        a = dec.actions[i]
        assert dec.masks[i, a]
        assert dec.masks[i, WAIT] == (not dec.masks[i, 1:].any())  # work-conserving: wait only when stuck
        want = ENC.menu[a]
        got = tuple(dec.tasks[i])
        assert got == (0, 0) or (got[0] <= want[0] and got[1] <= want[1])  # truncated, never more
        assert tuple(dec.allocation.tasks.get(jv.job_id, (0, 0))) == got
        if greedy:
            allowed = np.where(dec.masks[i], logits[i], -np.inf)
            assert a == int(np.argmax(allowed))


def _one_row(row: tuple[int, int], n: int = 1) -> np.ndarray:
    logits = np.full((n, ENC.num_shapes), -5.0, np.float32)
    logits[:, ENC.menu.index(row)] = 5.0
    return logits


def test_a_shape_that_fits_in_total_but_not_on_the_nodes_is_truncated():
    # four nodes with 2 free cpu each, GPUs free on two: (2 W, 2 PS) fits the free total
    # (8 cpu, 2 gpu) but a node holds one task: W, PS, then the second W finds no GPU node with
    # cpu left, so the workers stop at 1 and the PS go on to 2.
    cap = np.tile([[8.0, 2.0, 48.0]], (4, 1))
    free = np.array([[2.0, 1.0, 48.0], [2.0, 1.0, 48.0], [2.0, 0.0, 48.0], [2.0, 0.0, 48.0]])
    v = ClusterView(0, 1200.0, cap, free, (job(0),), CAT, "load_balancing")
    dec = decide_shapes(v, ENC, _one_row((2, 2)))
    assert ENC.menu[dec.actions[0]] == (2, 2)
    assert tuple(dec.tasks[0]) == (1, 2) and tuple(dec.allocation.tasks[0]) == (1, 2)
    assert dec.allocation.placement[0].worker_nodes == (0,)


def test_a_job_whose_worker_finds_no_node_gets_nothing():
    # the free total has room for (1, 1) but no node has 2 cpu next to a free GPU: the PS alone
    # cannot train, so it is given back and the next job can use its node
    cap = np.tile([[8.0, 2.0, 48.0]], (3, 1))
    free = np.array([[1.0, 1.0, 48.0], [1.0, 1.0, 48.0], [2.0, 0.0, 48.0]])
    v = ClusterView(0, 1200.0, cap, free, (job(0), job(1, "dssm")), CAT, "load_balancing")
    logits = _one_row((1, 1), 2)
    logits[0, WAIT] = logits[1, WAIT] = -9.0  # both want to run; job 0 first (view order on ties)
    dec = decide_shapes(v, ENC, logits)
    assert dec.order.tolist() == [0, 1]
    assert tuple(dec.tasks[0]) == (0, 0) and 0 not in dec.allocation.tasks
    # dssm's CPU-only worker and its PS each need 2 cpu: only node 2 has them, for one task
    assert tuple(dec.tasks[1]) == (0, 0)


def test_each_job_is_placed_with_its_own_demands_not_its_types():
    # a live or served resnet-50 that asks for 0.5 cpu and no GPU per task, on GPU-less nodes: its
    # type's demand (a GPU per worker) fits nowhere, its own does; two jobs of one type may differ
    from dataclasses import replace

    small = replace(job(0, max_workers=2, max_ps=2), worker_demand=np.array([0.5, 0.0, 0.1]),
                    ps_demand=np.array([0.5, 0.0, 0.1]))
    big = replace(job(1, max_workers=2, max_ps=2), worker_demand=np.array([1.5, 0.0, 0.1]),
                  ps_demand=np.array([0.5, 0.0, 0.1]))
    v = view(small, big, nodes=2, cpu=3.0, gpu=0.0)
    dec = decide_shapes(v, ENC, _one_row((2, 2), 2))
    _feasible(v, dec)
    assert tuple(dec.tasks[0]) == (2, 2)  # 2 cpu of the 6, 1 on each node
    assert tuple(dec.tasks[1]) == (2, 2)  # 2 cpu left per node: W 1.5 + PS 0.5 on each
    with_type_demands = view(job(0, max_workers=2, max_ps=2), nodes=2, cpu=3.0, gpu=0.0)
    assert decide_shapes(with_type_demands, ENC, _one_row((2, 2))).allocation.tasks == {}  # needs GPUs


def test_the_mask_refuses_rows_beyond_the_free_total():
    v = view(job(0), nodes=1)  # 8 cpu: 4 tasks of 2 cpu
    dec = decide_shapes(v, ENC, np.zeros((1, ENC.num_shapes), np.float32))
    for k, (w, p) in enumerate(ENC.menu):
        assert dec.masks[0, k] == (k != WAIT and 2 * (w + p) <= 8 and w <= 2)


def test_work_conservation_forbids_waiting_beside_free_capacity():
    # three resnet-50 jobs that all prefer to wait, on room for two (1, 1) bundles
    v = view(job(0), job(1), job(2), nodes=1)
    logits = np.zeros((3, ENC.num_shapes), np.float32)
    logits[:, WAIT] = 5.0
    logits[0, WAIT] = 4.0  # job 0 goes first
    dec = decide_shapes(v, ENC, logits)
    assert [tuple(t) for t in dec.tasks] == [(1, 1), (1, 1), (0, 0)]  # the third finds nothing left
    assert dec.masks[2].tolist() == [True] + [False] * (ENC.num_shapes - 1)
    lazy = ShapeEncoding(ENC.num_types, ENC.menu, ENC.slots_run_scale, work_conserving=False)
    idle = decide_shapes(v, lazy, logits)
    assert idle.allocation.tasks == {} and idle.masks[:, WAIT].all()


def test_forced_row_changes_only_that_job_and_those_after_it():
    v = view(*[job(i) for i in range(4)], nodes=2)
    x, g = job_features(v, ENC)
    logits = NETS[0].logits(x, g)
    base = decide_shapes(v, ENC, logits)
    first = int(base.order[0])
    row = next(k for k in range(1, ENC.num_shapes) if base.masks[first, k] and k != base.actions[first])
    forced = decide_shapes(v, ENC, logits, forced=(first, row))
    assert forced.actions[first] == row
    np.testing.assert_array_equal(forced.masks[first], base.masks[first])
    same = decide_shapes(v, ENC, logits, forced=(first, int(base.actions[first])))
    assert same.allocation == base.allocation


def test_sampling_is_reproducible():
    v = view(*[job(i, CAT.names[i % L]) for i in range(6)], nodes=3)
    x, g = job_features(v, ENC)
    lg = NETS[1].logits(x, g)
    a = decide_shapes(v, ENC, lg, np.random.default_rng(5))
    b = decide_shapes(v, ENC, lg, np.random.default_rng(5))
    assert a.allocation == b.allocation and a.actions.tolist() == b.actions.tolist()


def test_network_is_permutation_equivariant_and_numpy_equals_torch():
    net = build_shape_policy(ENC, (16, 16), 8, 3)
    v = view(*[job(i, CAT.names[(3 * i) % L], done=10.0 * i) for i in range(5)], nodes=3)
    x, g = job_features(v, ENC)
    with torch.no_grad():
        t = net(torch.from_numpy(x)[None], torch.ones(1, 5, dtype=torch.bool), torch.from_numpy(g)[None])[0]
    np.testing.assert_allclose(NumpyShapePolicy(net).logits(x, g), t.numpy(), rtol=1e-5, atol=1e-5)
    perm = np.array([3, 0, 4, 1, 2])
    permuted = NumpyShapePolicy(net).logits(x[perm], g)
    np.testing.assert_allclose(permuted, t.numpy()[perm], rtol=1e-5, atol=1e-5)
    # padding rows change nothing for the real ones
    xp = np.concatenate([x, np.zeros((2, x.shape[1]), np.float32)])
    present = torch.tensor([[True] * 5 + [False] * 2])
    with torch.no_grad():
        tp = net(torch.from_numpy(xp)[None], present, torch.from_numpy(g)[None])[0, :5]
    np.testing.assert_allclose(tp.numpy(), t.numpy(), rtol=1e-5, atol=1e-5)


def test_checkpoint_round_trip_and_refusals(tmp_path):
    net = build_shape_policy(ENC, (16,), 8, 1)
    path = tmp_path / "shape.pt"
    save_shape_checkpoint(path, net, CAT.names, extra={"kind": "sl"})
    back = load_shape_checkpoint(path, expect=ENC)
    assert back.extra == {"kind": "sl"} and back.policy.enc == ENC and ENC.work_conserving
    for a, b in zip(net.state_dict().values(), back.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    sched = DL2Scheduler(str(path), CFG)
    assert sched.arch == "shape"
    v = view(job(0), job(1, "dssm"))
    x, g = job_features(v, ENC)
    assert sched.decide(v) == decide_shapes(v, ENC, NumpyShapePolicy(net).logits(x, g)).allocation
    other = CFG.model_copy(update={"policy": CFG.policy.model_copy(update={
        "shape": CFG.policy.shape.model_copy(update={"menu_ps": (1, 2)})})})
    with pytest.raises(CheckpointError, match="menu"):
        load_policy_net(path, other)
    with pytest.raises(CheckpointError, match="not a shape policy"):
        from dl2ray.policy.encoding import Encoding
        from dl2ray.policy.network import build_networks, save_checkpoint

        paper = tmp_path / "paper.pt"
        save_checkpoint(paper, *build_networks(Encoding.from_config(CFG), (8,), 0), CAT.names)
        load_shape_checkpoint(paper)
