"""Placement policies: the chosen node, feasibility, and the Optimus layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2ray.cluster import Placer, make_placer, optimus_layout
from dl2ray.view import Allocation, Tasks

WORKER = np.array([2.0, 1.0, 8.0])
PS = np.array([2.0, 0.0, 4.0])


def _cap(n: int) -> np.ndarray:
    return np.tile([8.0, 2.0, 48.0], (n, 1))


def test_a_ps_is_judged_by_cpu_only_and_keeps_idle_gpus_usable(testbed):
    lb = make_placer(_cap(2), _cap(2), "load_balancing", testbed.catalogue)
    assert lb.place(0, "worker", WORKER) == 0 and lb.place(0, "worker", WORKER) == 1
    assert lb.place(1, "worker", WORKER) == 0  # node 0 GPUs now full
    # By cpu, node 1 (2 cores used) is less used than node 0 (4): the PS goes there,
    # although node 0's GPUs are full and node 1 still has an idle GPU.
    assert lb.place(0, "ps", PS) == 1
    assert lb.place(1, "worker", WORKER) == 1  # the idle GPU is still usable


def test_load_balancing_spreads_and_packing_packs(testbed):
    lb = make_placer(_cap(3), _cap(3), "load_balancing", testbed.catalogue)
    assert [lb.place(0, "worker", WORKER) for _ in range(3)] == [0, 1, 2]
    pk = make_placer(_cap(3), _cap(3), "packing", testbed.catalogue)
    assert [pk.place(0, "worker", WORKER) for _ in range(3)] == [0, 0, 1]
    assert pk.place(0, "ps", PS) == 0  # node 0 has cpu left: fullest that fits


def test_full_cluster_refuses_then_unplace_frees(testbed):
    p = make_placer(_cap(1), _cap(1), "load_balancing", testbed.catalogue)
    assert p.place_bundle(1, WORKER, PS) and p.place_bundle(1, WORKER, PS)
    assert not p.can_place(PS) and p.place(2, "ps", PS) is None
    assert not p.place_bundle(2, WORKER, PS) and p.tasks(2) == Tasks(0, 0)
    p.unplace(1, "ps", PS)
    assert p.can_place(PS) and p.place(2, "ps", PS) == 0
    alloc = p.allocation()
    assert alloc.tasks == {1: Tasks(2, 1), 2: Tasks(0, 1)}
    with pytest.raises(ValueError, match="no worker"):
        p.unplace(3, "worker", WORKER)


def test_optimus_layout_uses_fewest_nodes_evenly():
    free = _cap(4)
    packed = Allocation({0: Tasks(4, 2)})
    out = optimus_layout(free, packed, {0: (WORKER, PS)})
    assert out is not None
    pl = out.placement[0]
    assert sorted(set(pl.worker_nodes)) == sorted(set(pl.ps_nodes))
    assert len(set(pl.worker_nodes)) == 2  # 4 GPUs need 2 nodes; PS spread with them
    assert sorted(np.bincount(pl.worker_nodes).tolist()) == [0, 2, 2][-len(np.bincount(pl.worker_nodes)):]


def test_optimus_placer_keeps_a_feasible_layout(testbed):
    p = make_placer(_cap(3), _cap(3), "optimus", testbed.catalogue)
    for _ in range(3):
        assert p.place_bundle(0, WORKER, PS)
    alloc = p.allocation()
    used = np.zeros((3, 3))
    for n in alloc.placement[0].worker_nodes:
        used[n] += WORKER
    for n in alloc.placement[0].ps_nodes:
        used[n] += PS
    assert (used <= _cap(3)).all()


def _dominant_used(cap, free, n, demand):
    """Reference: dominant usage of node n over the resources ``demand`` asks for."""
    used = (cap[n] - free[n]) / np.where(cap[n] > 0, cap[n], np.inf)
    return max([used[r] for r in range(3) if demand[r] > 0], default=0.0)


def _preference(mode, cap, free, n, demand):
    """Reference: smaller is preferred; Tetris alignment ``Σ_r (d_r/C_r)(F_r/C_r)`` (largest first) for
    mode 2, else ``mode ×`` the dominant usage."""
    if mode == 2:
        c = np.where(cap[n] > 0, cap[n], np.inf)
        return -float(np.sum((demand / c) * (free[n] / c)))
    return mode * _dominant_used(cap, free, n, demand)


@settings(max_examples=60, deadline=None)
@given(
    caps=st.lists(st.tuples(st.sampled_from([4, 8, 16]), st.sampled_from([0, 1, 2, 4])),
                  min_size=1, max_size=6),
    ops=st.lists(st.tuples(st.sampled_from(["worker", "ps", "cpuworker", "odd"]),
                           st.integers(0, 3)), max_size=40),
    mode=st.sampled_from([1, -1, 2]),
)
def test_choice_is_the_best_fitting_node_and_capacity_holds(caps, ops, mode):
    cap = np.array([[c, g, 32.0] for c, g in caps])
    demands = {"worker": WORKER, "ps": PS, "cpuworker": np.array([2.0, 0, 4.0]),
               "odd": np.array([3.0, 0.0, 1.0])}  # not in the catalogue: linear scan
    p = Placer(cap, cap, [WORKER, PS, demands["cpuworker"]], mode=mode)
    for kind, job in ops:
        d = demands[kind]
        free = p.free()
        fitting = [n for n in range(len(cap)) if (free[n] + 1e-9 >= d).all()]
        node = p.place(job, "worker" if kind != "ps" else "ps", d)
        if not fitting:
            assert node is None
            continue
        best = min(fitting, key=lambda n: (_preference(mode, cap, free, n, d), n))
        assert node == best
        assert (p.free() >= -1e-9).all()
