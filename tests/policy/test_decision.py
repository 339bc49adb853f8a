"""The decision loop never produces an infeasible allocation; windows; numpy = torch."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_tiny import CAT, L, job, view

from dl2ray.cluster import node_usage
from dl2ray.policy.decision import decide_slot, run_decision
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy, build_networks

ENC = Encoding(window=3, num_types=L)
NETS = [NumpyPolicy.from_torch(build_networks(ENC, (16,), s)[0]) for s in range(3)]


def _check_feasible(v, alloc) -> None:
    types = {j.job_id: j for j in v.jobs}
    for job_id, t in alloc.tasks.items():
        jv = types[job_id]
        assert t.workers <= jv.max_workers and t.ps <= jv.max_ps
        pl = alloc.placement[job_id]
        assert len(pl.worker_nodes) == t.workers and len(pl.ps_nodes) == t.ps
    usage = node_usage(v.capacity, alloc, lambda j: (types[j].worker_demand, types[j].ps_demand))
    assert np.all(usage <= v.capacity + 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 4), cpu=st.sampled_from([2.0, 4.0, 6.0, 8.0]), gpu=st.integers(0, 2),
    types=st.lists(st.integers(0, L - 1), min_size=0, max_size=8),
    caps=st.lists(st.integers(1, 4), min_size=8, max_size=8),
    net=st.integers(0, 2), seed=st.integers(0, 2**16), greedy=st.booleans(), fast=st.booleans(),
)
def test_never_infeasible(nodes, cpu, gpu, types, caps, net, seed, greedy, fast):
    jobs = [job(i, CAT.names[t], max_workers=caps[i], max_ps=caps[-1 - i]) for i, t in enumerate(types)]
    v = view(*jobs, nodes=nodes, cpu=cpu, gpu=float(gpu))
    rng = np.random.default_rng(seed)
    dec = decide_slot(v, NETS[net], ENC, greedy=greedy, rng=rng, record=True, fast=fast)
    _check_feasible(v, dec.allocation)
    for s in dec.steps:
        assert s.mask[s.action] and s.mask[ENC.stop]


class Always:
    """Always the first allowed non-stop action (fills every window completely)."""

    def begin(self, slot):
        self.windows = [*getattr(self, "windows", []), [j.job_id for j in slot.jobs]]

    def choose(self, slot, mask):
        return int(np.flatnonzero(mask)[0])

    def applied(self, row, delta):
        pass


def test_windows_when_more_jobs_than_j():
    jobs = [job(i, max_workers=1, max_ps=1) for i in range(7)]
    chooser = Always()
    dec = run_decision(view(*jobs, nodes=8), ENC, chooser)
    assert chooser.windows == [[0, 1, 2], [3, 4, 5], [6]]
    assert set(dec.allocation.tasks) == set(range(7))


def test_incremental_first_layer_matches_full_forward():
    pol = build_networks(ENC, (32, 16), 1)[0]
    fast = NumpyPolicy.from_torch(pol)
    v = view(job(1), job(2, "dssm"), nodes=3)
    dec = decide_slot(v, fast, ENC, greedy=False, rng=np.random.default_rng(0), record=True)
    assert dec.steps
    with torch.inference_mode():
        states = torch.from_numpy(np.stack([s.state for s in dec.steps]))
        want = pol(states).numpy()
    np.testing.assert_allclose(fast.logits(np.stack([s.state for s in dec.steps])), want, atol=1e-5)


def test_sampling_needs_a_generator_and_is_reproducible():
    v = view(job(1), job(2, "dssm"), nodes=3)
    a = decide_slot(v, NETS[0], ENC, greedy=False, rng=np.random.default_rng(5), record=True)
    b = decide_slot(v, NETS[0], ENC, greedy=False, rng=np.random.default_rng(5), record=True)
    assert [s.action for s in a.steps] == [s.action for s in b.steps]
    try:
        decide_slot(v, NETS[0], ENC, greedy=False, rng=None)
    except ValueError:
        pass
    else:
        raise AssertionError("sampling without a generator must fail")
