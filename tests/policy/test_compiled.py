"""The compiled decision loop equals the step-by-step reference (SlotState + Placer + PolicyChooser).

Same steps (states, masks, actions), same allocation (placement and job order),
same number of draws from the generator; its logits are the torch policy's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_tiny import CAT, L, job

from dl2ray.policy.decision import _first_layer, _head, decide_slot
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy, build_networks
from dl2ray.view import ClusterView

ENC = Encoding(window=3, num_types=L)
TORCH = [build_networks(ENC, hidden, s)[0] for s, hidden in enumerate([(16,), (24, 12), (8, 8, 8)])]
NETS = [NumpyPolicy.from_torch(p) for p in TORCH]


def _view(jobs, cap: np.ndarray, used: np.ndarray, placement: str) -> ClusterView:
    free = np.maximum(cap - used, 0.0)
    return ClusterView(0, 1200.0, cap, free, tuple(jobs), CAT, placement)


def _both(v, net, enc, greedy, seed):
    """(compiled, step by step) decisions and the generators' states after each."""
    out = []
    for fast in (True, False):
        rng = np.random.default_rng(seed)
        dec = decide_slot(v, net, enc, greedy=greedy, rng=rng, record=True, fast=fast)
        out.append((dec, rng.bit_generator.state))
    return out


def _assert_same(a, b) -> None:
    (fast, fast_rng), (ref, ref_rng) = a, b
    assert [s.action for s in fast.steps] == [s.action for s in ref.steps]
    assert fast.inferences == ref.inferences == len(ref.steps)
    for s, r in zip(fast.steps, ref.steps, strict=True):
        np.testing.assert_array_equal(s.mask, r.mask)
        np.testing.assert_array_equal(s.state, r.state)
    assert list(fast.allocation.tasks.items()) == list(ref.allocation.tasks.items())
    assert fast.allocation.placement == ref.allocation.placement
    assert fast_rng == ref_rng  # the same Gumbel draws, no more, no fewer


@settings(max_examples=80, deadline=None)
@given(
    nodes=st.lists(st.tuples(st.sampled_from([2.0, 4.0, 6.0, 8.0]), st.integers(0, 2)),
                   min_size=1, max_size=6),
    used=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2)), min_size=6, max_size=6),
    types=st.lists(st.integers(0, L - 1), min_size=0, max_size=8),
    caps=st.lists(st.integers(1, 4), min_size=8, max_size=8),
    placement=st.sampled_from(["load_balancing", "packing", "optimus"]),
    net=st.integers(0, len(NETS) - 1), seed=st.integers(0, 2**16), greedy=st.booleans(),
)
def test_compiled_equals_step_by_step(nodes, used, types, caps, placement, net, seed, greedy):
    cap = np.array([[c, float(g), 48.0] for c, g in nodes])
    taken = np.array([[float(c), float(g), 0.0] for c, g in used[:len(nodes)]])
    jobs = [job(i, CAT.names[t], max_workers=caps[i], max_ps=caps[-1 - i]) for i, t in enumerate(types)]
    _assert_same(*_both(_view(jobs, cap, taken, placement), NETS[net], ENC, greedy, seed))


@pytest.mark.parametrize("placement", ["load_balancing", "packing", "optimus"])
@pytest.mark.parametrize("greedy", [True, False])
def test_compiled_equals_step_by_step_on_a_big_slot(placement, greedy):
    """Three windows of 20 jobs on 150 nodes, filled until nothing fits."""
    enc = Encoding(window=20, num_types=L)
    net = NumpyPolicy.from_torch(build_networks(enc, (32, 16), 4)[0])
    rng = np.random.default_rng(1)
    jobs = [job(i, CAT.names[int(t)], slots_run=int(rng.integers(0, 50)), done=float(rng.uniform(0, 90)))
            for i, t in enumerate(rng.integers(0, L, 55))]
    cap = np.tile([8.0, 2.0, 48.0], (150, 1))
    taken = np.floor(cap * rng.uniform(0, 1, cap.shape))
    fast, ref = _both(_view(jobs, cap, taken, placement), net, enc, greedy, seed=3)
    _assert_same(fast, ref)
    assert fast[0].inferences > 100


def test_compiled_logits_are_the_torch_policys():
    """The compiled first layer (float64, from the sparse state) and head equal torch's forward."""
    pol, fast = TORCH[1], NETS[1]
    v = _view([job(1), job(2, "dssm"), job(3, "vgg-16")], np.tile([8.0, 2.0, 48.0], (3, 1)), np.zeros((3, 3)),
              "load_balancing")
    dec = decide_slot(v, fast, ENC, greedy=False, rng=np.random.default_rng(0), record=True)
    states = np.stack([s.state for s in dec.steps])
    (w1, b1), *rest = fast.dense_layers()
    ws, bs = tuple(w for w, _ in rest), tuple(b for _, b in rest)
    widest = max(b.shape[0] for b in bs)
    got = []
    for s in states:
        pre1 = np.empty(b1.shape[0])
        _first_layer(s.reshape(ENC.window, -1), w1, b1, pre1)
        got.append(_head(pre1, ws, bs, np.empty(widest, np.float32), np.empty(widest, np.float32)).copy())
    with torch.inference_mode():
        want = pol(torch.from_numpy(states)).numpy()
    np.testing.assert_allclose(np.stack(got), want, atol=1e-5)


def test_compiled_greedy_takes_the_best_allowed_logit():
    pol = TORCH[0]
    v = _view([job(1), job(2, "dssm")], np.tile([8.0, 2.0, 48.0], (2, 1)), np.zeros((2, 3)), "load_balancing")
    dec = decide_slot(v, NETS[0], ENC, greedy=True, record=True)
    assert dec.steps
    with torch.inference_mode():
        logits = pol(torch.from_numpy(np.stack([s.state for s in dec.steps]))).numpy()
    for s, lg in zip(dec.steps, logits, strict=True):
        assert s.action == int(np.argmax(np.where(s.mask, lg, -np.inf)))


def test_compiled_refuses_a_policy_of_other_dimensions():
    v = _view([job(1)], np.tile([8.0, 2.0, 48.0], (1, 1)), np.zeros((1, 3)), "load_balancing")
    with pytest.raises(ValueError, match="state dim"):
        decide_slot(v, NETS[0], Encoding(window=4, num_types=L))
