"""The fused decision path (``dl2ray.policy.shape_fused``) decides exactly as the reference path did.

The reference is what a shape policy ran before issue 38 and what its learners still run:
``job_features`` → ``NumpyShapePolicy.logits`` → ``decide_shapes`` (with the view's placer's final
layout). Every shipped shape checkpoint drives its simulator for 200 slots through the deployed scheduler
(now the fused path); each slot's allocation must have the digest recorded from main before the change
(``tests/data/regression/shape_decisions.json``, :mod:`shape_recorded`; both made under one pinned
OpenBLAS kernel, as the CPU's own kernel may round a near-tie the other way), and on the same views the
fused and reference paths must agree on order, masks, actions, tasks and the allocation — greedy and
sampled.
"""

from __future__ import annotations

import dataclasses
import json
import platform

import numpy as np
import pytest
from shape_recorded import CASES, RECORD, SLOTS, drive, recorded_run, scheduler

from dl2ray.cluster import optimus_layout
from dl2ray.policy.optimus_layout import optimus_layout_compiled
from dl2ray.policy.shape import job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_fused import MAX_MENU, FusedShapePolicy, _pairwise_sum
from dl2ray.view import Allocation, JobPlacement, Tasks

RECORDED = json.loads(RECORD.read_text())


def _own(sched, view):
    """The view as the deployed scheduler (a ``Placed`` wrapper) hands it to the policy."""
    return view if view.placement == sched.placement else dataclasses.replace(view, placement=sched.placement)


def _same(a: Allocation, b: Allocation) -> bool:
    """Equal allocations, job order included."""
    return a == b and list(a.tasks) == list(b.tasks) and list(a.placement or {}) == list(b.placement or {})


@pytest.fixture(scope="module")
def deployed_digests() -> dict[str, list[str]]:
    """Every case's digests from the deployed scheduler, under the kernel the record was made under."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the record's OpenBLAS kernel (Haswell, AVX2) is an x86-64 one")
    return recorded_run()


@pytest.mark.parametrize("case", sorted(CASES))
def test_deployed_decisions_equal_the_recorded_ones(case, deployed_digests):
    _, sched = scheduler(case)
    assert isinstance(sched.inner._fused, FusedShapePolicy)  # the deployed scheduler runs the fused path
    got = deployed_digests[case]
    assert len(got) == SLOTS == len(RECORDED[case])
    diff = [i for i, (a, b) in enumerate(zip(got, RECORDED[case], strict=True)) if a != b]
    assert not diff, f"{case}: slots {diff[:10]} decided differently from the recorded path"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("sampled", [False, True])
def test_fused_equals_reference_on_the_same_views(case, sampled):
    checked = []

    def both(sched, view):
        inner, v = sched.inner, _own(sched, view)
        fused = FusedShapePolicy(inner.policy)
        rngs = [np.random.default_rng(view.slot) if sampled else None for _ in range(2)]
        x, g = job_features(v, inner.enc)
        ref = decide_shapes(v, inner.enc, inner.policy.logits(x, g), rngs[0])
        got = fused.decide(v, rngs[1])
        assert _same(got.allocation, ref.allocation), f"slot {view.slot}: allocations differ"
        for field in ("order", "masks", "actions", "tasks"):
            assert np.array_equal(getattr(got, field), getattr(ref, field)), f"slot {view.slot}: {field}"
        if sampled:
            assert rngs[0].bit_generator.state == rngs[1].bit_generator.state  # the same draws
        checked.append(len(v.jobs))
        return ref.allocation

    for _ in drive(case, both, slots=30):
        pass
    assert sum(checked) > 0


def test_pairwise_sum_is_numpys_bit_for_bit():
    rng = np.random.default_rng(0)
    for n in [*range(0, 40), 127, 128, 129, 136, 162, 200, 255, 256, 300, MAX_MENU]:
        a = np.exp(rng.normal(0.0, 3.0, n))
        assert _pairwise_sum(a, 0, n) == np.sum(a), n


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("states", ["few", "many"])
def test_optimus_layout_equals_the_placers(seed, states):
    """Random jobs on a partly used cluster: the compiled Optimus layout gives the nodes (or the refusal)
    of ``dl2ray.cluster.optimus_layout`` — through its states of equal free capacity (``few``) and by
    scanning the nodes (``many``: more distinct free capacities than it tracks)."""
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(2, 40)) if states == "few" else 300
    cap = np.tile([8.0, 2.0, 48.0], (nodes, 1))
    if states == "few":
        used = rng.integers(0, 3, (nodes, 1)) * np.array([2.0, 0.0, 8.0])
        free = cap - used - rng.integers(0, 2, (nodes, 1)) * np.array([0.0, 1.0, 4.0])
    else:
        free = cap * rng.uniform(0.2, 1.0, (nodes, 3))
    dem = np.array([[2.0, 1.0, 8.0], [2.0, 0.0, 4.0], [1.0, 0.0, 2.0]])
    jobs = int(rng.integers(1, 8))
    wkey, pkey = rng.integers(0, 3, jobs), rng.integers(0, 3, jobs)
    tasks = rng.integers(1, 16, (jobs, 2))
    seq = np.append(rng.permutation(jobs), jobs)
    sizes = tasks.sum(axis=1)[seq[:-1]]
    nodes_out = np.full(int(sizes.sum()), -1, dtype=np.int64)
    optimus_layout_compiled(free.copy(), dem, wkey, pkey, tasks.copy(), seq.copy(), nodes_out)
    packed = Allocation({int(g): Tasks(int(tasks[g, 0]), int(tasks[g, 1])) for g in seq[:-1]})
    demands = {int(g): (dem[wkey[g]], dem[pkey[g]]) for g in seq[:-1]}
    want = optimus_layout(free.copy(), packed, demands)
    if want is None:
        assert (nodes_out == -1).all()  # left as it was: the caller keeps the packed placement
        return
    at = 0
    for g in seq[:-1]:
        w, p = tasks[g]
        assert want.placement[int(g)] == JobPlacement(tuple(nodes_out[at:at + w].tolist()),
                                                      tuple(nodes_out[at + w:at + w + p].tolist()))
        at += w + p
