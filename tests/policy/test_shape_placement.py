"""The shape decoder's placement (``policy.shape.placement``): interleaved places the decided counts as the
planner's placer would (a bundle per job in the jobs' order, then one task per job per round); per-job keeps
one job's whole shape after another's; checkpoints carry the choice."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_tiny import CAT, CFG, L, job, view

from dl2ray.policy.network import CheckpointError
from dl2ray.policy.shape import ShapeEncoding, job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_net import (
    NumpyShapePolicy,
    build_shape_policy,
    load_shape_checkpoint,
    save_shape_checkpoint,
)
from dl2ray.view import Allocation, ClusterView

INTERLEAVED = ShapeEncoding.from_config(CFG)
PER_JOB = dataclasses.replace(INTERLEAVED, interleaved=False)
NETS = [NumpyShapePolicy(build_shape_policy(INTERLEAVED, (16,), 8, s)) for s in range(3)]


def _reference(v: ClusterView, order: np.ndarray, counts: np.ndarray) -> Allocation:
    """The interleaved placement written with the planner's own :class:`~dl2ray.cluster.Placer`."""
    placer = v.placer()
    want: dict[int, list[int]] = {}
    for i in order.tolist():
        w, p = counts[i]
        j = v.jobs[i]
        if w and p and placer.place_bundle(j.job_id, j.worker_demand, j.ps_demand):
            want[i] = [int(w), int(p)]
    more = True
    while more:
        more = False
        for i in order.tolist():
            if i not in want:
                continue
            j, (tw, tp) = v.jobs[i], want[i]
            have = placer.tasks(j.job_id)
            if have.workers >= tw and have.ps >= tp:
                continue
            worker = have.workers < tw and (have.ps >= tp or have.workers * tp <= have.ps * tw)
            role, demand = ("worker", j.worker_demand) if worker else ("ps", j.ps_demand)
            if placer.place(j.job_id, role, demand) is None:
                want[i][0 if worker else 1] = have.workers if worker else have.ps
            more = True
    return placer.allocation()


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 5), cpu=st.sampled_from([2.0, 4.0, 8.0]), gpu=st.integers(0, 2),
    types=st.lists(st.integers(0, L - 1), min_size=0, max_size=8),
    net=st.integers(0, 2), seed=st.integers(0, 2**16), greedy=st.booleans(),
)
def test_interleaved_places_the_decided_counts_as_the_planners_placer(nodes, cpu, gpu, types, net, seed,
                                                                      greedy):
    v = view(*[job(i, CAT.names[t]) for i, t in enumerate(types)], nodes=nodes, cpu=cpu, gpu=float(gpu))
    x, g = job_features(v, INTERLEAVED)
    logits = NETS[net].logits(x, g)
    per_job = decide_shapes(v, PER_JOB, logits, None if greedy else np.random.default_rng(seed))
    inter = decide_shapes(v, INTERLEAVED, logits, None if greedy else np.random.default_rng(seed))
    # the same choices; only where the tasks go (and a truncation the new layout causes) differs
    np.testing.assert_array_equal(inter.actions, per_job.actions)
    np.testing.assert_array_equal(inter.masks, per_job.masks)
    ref = _reference(v, per_job.order, per_job.tasks)
    assert inter.allocation.tasks == ref.tasks
    assert inter.allocation.placement == ref.placement
    for i, jv in enumerate(v.jobs):
        got = tuple(inter.tasks[i])
        assert tuple(inter.allocation.tasks.get(jv.job_id, (0, 0))) == got
        assert got == (0, 0) or (0 < got[0] <= per_job.tasks[i][0] and 0 < got[1] <= per_job.tasks[i][1])


def test_interleaved_keeps_two_jobs_apart_where_per_job_spreads_both_over_every_node():
    # two resnet-50 jobs at (2 W, 2 PS) on four empty nodes. Per-job: job 0's four tasks take the four
    # least-used nodes, one each, and job 1's land on top of them: every node holds both jobs (co-location
    # interference, all traffic across nodes). Interleaved: the two first bundles take one node each, each
    # job's second worker and PS follow onto its own two nodes, so no node is shared.
    v = view(job(0, max_workers=2, max_ps=2), job(1, max_workers=2, max_ps=2), nodes=4)
    row = INTERLEAVED.menu.index((2, 2))
    logits = np.full((2, INTERLEAVED.num_shapes), -5.0, np.float32)
    logits[:, row] = 5.0
    logits[1, row] = 4.0  # job 0 first
    a = decide_shapes(v, PER_JOB, logits).allocation.placement
    b = decide_shapes(v, INTERLEAVED, logits).allocation.placement
    assert a is not None and b is not None

    def nodes(pl):
        return {*pl.worker_nodes, *pl.ps_nodes}

    assert nodes(a[0]) == nodes(a[1]) == {0, 1, 2, 3}
    assert nodes(b[0]) == {0, 1} and nodes(b[1]) == {2, 3}


def test_checkpoints_carry_the_placement_and_old_ones_decode_per_job(tmp_path):
    net = build_shape_policy(INTERLEAVED, (16,), 8, 0)
    path = tmp_path / "shape.pt"
    save_shape_checkpoint(path, net, CAT.names)
    assert load_shape_checkpoint(path).policy.enc.interleaved
    doc = torch.load(path, weights_only=False)
    del doc["meta"]["placement"]  # a checkpoint from before the option
    torch.save(doc, path)
    assert not load_shape_checkpoint(path).policy.enc.interleaved
    # a training run from it decodes (and will save) as its config says
    assert load_shape_checkpoint(path, expect=INTERLEAVED, decoding="config").policy.enc.interleaved
    assert not load_shape_checkpoint(path, expect=INTERLEAVED).policy.enc.interleaved
    doc["meta"]["placement"] = "packed"
    torch.save(doc, path)
    with pytest.raises(CheckpointError, match="placement: 'packed'"):
        load_shape_checkpoint(path)


def test_the_config_chooses_the_placement():
    per_job = CFG.model_copy(update={"policy": CFG.policy.model_copy(update={
        "shape": CFG.policy.shape.model_copy(update={"placement": "per-job"})})})
    assert INTERLEAVED.interleaved and not ShapeEncoding.from_config(per_job).interleaved
