"""Actor-critic math on a hand-built three-slot trace: TD targets, advantages, losses, entropy, masking.

The toy: window J=2, one job type (state dim 12, 7 actions). Value net
``V(s) = s[0]`` (identity first layer, ReLU of non-negative states, readout
of feature 0); policy net all zeros, so ``π`` is uniform over the allowed
actions and ``log π(a|s) = −log n``, ``H = log n`` with ``n`` allowed actions.

slot  steps (s[0], allowed n)   reward  s_{t+1}[0]
0     (0.2, 4), (0.4, 2)         1.0    0.5
1     (0.5, 2)                   0.5    0.3
2     (0.3, 3), (0.6, 5)         2.0    — (terminal)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dl2ray.learn.actor_critic import (
    ActorCriticOptimizer,
    LossConfig,
    compute_gradients,
    flatten,
    loss_terms,
    masked_entropy,
    masked_log_probs,
    parameters,
    td_targets,
    unflatten,
)
from dl2ray.learn.rollout import Batch, SlotRecord, discounted_returns, to_batch
from dl2ray.policy.decision import Step
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import PolicyNet, ValueNet

ENC = Encoding(window=2, num_types=1)
D, A = ENC.state_dim, ENC.action_dim
GAMMA, BETA = 0.9, 0.1


def _state(x: float) -> np.ndarray:
    s = np.zeros(D, np.float32)
    s[0] = x
    return s


def _mask(n: int) -> np.ndarray:
    m = np.zeros(A, bool)
    m[A - n:] = True  # stop (last) and the n-1 before it
    return m


def toy_records() -> list[SlotRecord]:
    def steps(*xs):
        return [Step(_state(x), _mask(n), A - 1) for x, n in xs]

    return [
        SlotRecord(steps((0.2, 4), (0.4, 2)), 1.0, _state(0.5), False, 7, 0),
        SlotRecord(steps((0.5, 2)), 0.5, _state(0.3), False, 7, 1),
        SlotRecord(steps((0.3, 3), (0.6, 5)), 2.0, np.zeros(D, np.float32), True, 7, 2),
    ]


def toy_nets() -> tuple[PolicyNet, ValueNet]:
    policy, value = PolicyNet(ENC, (D,)), ValueNet(ENC, (D,))
    with torch.no_grad():
        for p in policy.parameters():
            p.zero_()
        first, last = value.body[0], value.body[2]
        first.weight.copy_(torch.eye(D))
        first.bias.zero_()
        last.weight.zero_()
        last.weight[0, 0] = 1.0
        last.bias.zero_()
    return policy, value


# Hand-computed values of the toy.
Y = [1.0 + 0.9 * 0.5] * 2 + [0.5 + 0.9 * 0.3] + [2.0] * 2  # 1.45, 1.45, 0.77, 2.0, 2.0
V = [0.2, 0.4, 0.5, 0.3, 0.6]
ADV = [1.25, 1.05, 0.27, 1.7, 1.4]
N_ALLOWED = [4, 2, 2, 3, 5]
G = [3.07, 3.07, 2.3, 2.0, 2.0]  # G2 = 2, G1 = 0.5 + 0.9·2, G0 = 1 + 0.9·2.3


def test_to_batch_shares_slot_reward_and_next_state():
    b = to_batch(toy_records(), ENC, GAMMA)
    assert len(b) == 5 and b.states.shape == (5, D) and b.masks.shape == (5, A)
    np.testing.assert_allclose(b.rewards, [1.0, 1.0, 0.5, 2.0, 2.0])
    np.testing.assert_allclose(b.next_states[:, 0], [0.5, 0.5, 0.3, 0.0, 0.0])
    assert b.terminals.tolist() == [False, False, False, True, True]
    np.testing.assert_allclose(b.returns, G, rtol=1e-6)


def test_discounted_returns_restart_after_terminal():
    r = np.array([1.0, 2.0, 3.0, 4.0])
    out = discounted_returns(r, np.array([False, True, False, False]), 0.5)
    np.testing.assert_allclose(out, [1 + 0.5 * 2, 2, 3 + 0.5 * 4, 4])


def test_td_targets_by_hand():
    y = td_targets(torch.tensor([1.0, 0.5, 2.0]), torch.tensor([0.5, 0.3, 9.0]),
                   torch.tensor([False, False, True]), GAMMA)
    np.testing.assert_allclose(y.numpy(), [1.45, 0.77, 2.0], rtol=1e-6)


def test_toy_targets_advantages_and_losses():
    policy, value = toy_nets()
    t = loss_terms(policy, value, to_batch(toy_records(), ENC, GAMMA), LossConfig(GAMMA, BETA))
    np.testing.assert_allclose(t.targets.numpy(), Y, rtol=1e-6)
    np.testing.assert_allclose(t.values.numpy(), V, rtol=1e-6)
    np.testing.assert_allclose(t.advantages.numpy(), ADV, rtol=1e-5)
    logn = [math.log(n) for n in N_ALLOWED]
    assert float(t.entropy) == pytest.approx(np.mean(logn), rel=1e-6)
    expect_pi = np.mean([ln * a for ln, a in zip(logn, ADV, strict=True)]) - BETA * np.mean(logn)
    assert float(t.policy_loss.detach()) == pytest.approx(expect_pi, rel=1e-5)
    assert float(t.value_loss.detach()) == pytest.approx(np.mean(np.square(ADV)), rel=1e-5)  # 1.51758


def test_zero_advantage_control_keeps_only_the_entropy_term():
    policy, value = toy_nets()
    t = loss_terms(policy, value, to_batch(toy_records(), ENC, GAMMA),
                   LossConfig(GAMMA, BETA, zero_advantage=True))
    logn = [math.log(n) for n in N_ALLOWED]
    assert not t.advantages.any()
    assert float(t.policy_loss.detach()) == pytest.approx(-BETA * np.mean(logn), rel=1e-6)
    assert float(t.value_loss.detach()) == pytest.approx(np.mean(np.square(ADV)), rel=1e-5)  # critic learns


def test_toy_without_critic_uses_mean_return_baseline():
    policy, value = toy_nets()
    t = loss_terms(policy, value, to_batch(toy_records(), ENC, GAMMA), LossConfig(GAMMA, BETA, critic=False))
    np.testing.assert_allclose(t.advantages.numpy(), np.array(G) - np.mean(G), atol=1e-5)
    assert float(t.value_loss.detach()) == 0.0
    grads, _ = compute_gradients(policy, value, to_batch(toy_records(), ENC, GAMMA),
                                 LossConfig(GAMMA, BETA, critic=False))
    n_pol = len(list(policy.parameters()))
    assert all(not g.any() for g in grads[n_pol:])  # the value net gets no gradient


def test_importance_weights_scale_each_step():
    policy, value = toy_nets()
    w = np.array([1.0, 0.5, 0.0, 0.25, 1.0], np.float32)
    t = loss_terms(policy, value, to_batch(toy_records(), ENC, GAMMA), LossConfig(GAMMA, BETA), w)
    assert float(t.value_loss.detach()) == pytest.approx(np.mean(w * np.square(ADV)), rel=1e-5)


def test_masked_entropy_and_log_probs_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0), 7.0, 1.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False, False]])
    logp = masked_log_probs(logits, mask)
    np.testing.assert_allclose(logp[0, :2].exp().detach().numpy(), [0.25, 0.75], rtol=1e-6)
    assert torch.isinf(logp[0, 2:]).all()
    h = masked_entropy(logits, mask)
    assert float(h.detach()) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rel=1e-6)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[0, 2:] == 0).all()


def test_masked_actions_get_no_probability_or_gradient():
    policy, value = toy_nets()
    b = to_batch(toy_records(), ENC, GAMMA)
    grads, _ = compute_gradients(policy, value, b, LossConfig(GAMMA, BETA))
    assert all(np.isfinite(g).all() for g in grads)
    out_bias = grads[len(list(policy.parameters())) - 1]  # d loss / d logits, summed over steps
    never_allowed = ~b.masks.any(axis=0)
    assert never_allowed.any() and not out_bias[never_allowed].any()


def _random_batch(rng: np.random.Generator, n: int = 9) -> Batch:
    masks = rng.random((n, A)) < 0.5
    masks[:, -1] = True
    actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
    return Batch(rng.random((n, D), dtype=np.float32), masks, actions,
                 rng.random(n, dtype=np.float32), rng.random((n, D), dtype=np.float32),
                 rng.random(n) < 0.3, rng.random(n, dtype=np.float32))


def _reference_losses(policy, value, b: Batch, cfg: LossConfig, w: np.ndarray):
    """One step at a time, plain python over allowed actions."""
    pl, vl = 0.0, 0.0
    for i in range(len(b)):
        s = torch.from_numpy(b.states[i:i + 1])
        logits = policy(s)[0]
        allowed = [a for a in range(A) if b.masks[i, a]]
        z = torch.logsumexp(torch.stack([logits[a] for a in allowed]), 0)
        logp = {a: logits[a] - z for a in allowed}
        ent = -sum(torch.exp(logp[a]) * logp[a] for a in allowed)
        v = value(s)[0]
        with torch.no_grad():
            nv = 0.0 if b.terminals[i] else float(value(torch.from_numpy(b.next_states[i:i + 1]))[0])
        y = float(b.rewards[i]) + cfg.gamma * nv
        adv = y - float(v.detach())
        pl = pl + w[i] * (-logp[int(b.actions[i])] * adv) - cfg.entropy_weight * w[i] * ent
        vl = vl + w[i] * (y - v) ** 2
    return pl / len(b), vl / len(b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_loss_and_gradients_equal_reference_loop(seed):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    policy, value = PolicyNet(ENC, (16, 8)), ValueNet(ENC, (16, 8))
    b, w = _random_batch(rng), rng.random(9).astype(np.float32)
    cfg = LossConfig(GAMMA, BETA)
    terms = loss_terms(policy, value, b, cfg, w)
    ref_pl, ref_vl = _reference_losses(policy, value, b, cfg, w)
    assert float(terms.policy_loss.detach()) == pytest.approx(float(ref_pl.detach()), rel=1e-5, abs=1e-6)
    assert float(terms.value_loss.detach()) == pytest.approx(float(ref_vl.detach()), rel=1e-5, abs=1e-6)
    grads, _ = compute_gradients(policy, value, b, cfg, w)
    ref = torch.autograd.grad(ref_pl + ref_vl, parameters(policy, value))
    for g, r in zip(grads, ref, strict=True):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-4, atol=1e-6)


def test_apply_gradients_list_or_flat_vector_is_one_adam_step():
    torch.manual_seed(0)
    nets = [(PolicyNet(ENC, (8,)), ValueNet(ENC, (8,))) for _ in range(2)]
    nets[1][0].load_state_dict(nets[0][0].state_dict())
    nets[1][1].load_state_dict(nets[0][1].state_dict())
    b = _random_batch(np.random.default_rng(3))
    grads, _ = compute_gradients(*nets[0], b, LossConfig())
    opts = [ActorCriticOptimizer(p, v, 1e-3) for p, v in nets]
    opts[0].apply_gradients(grads)
    flat = flatten(grads)
    opts[1].apply_gradients(flat)
    for a, c in zip(parameters(*nets[0]), parameters(*nets[1]), strict=True):
        assert torch.equal(a, c)
    assert [g.shape for g in unflatten(flat, parameters(*nets[0]))] == [g.shape for g in grads]
    assert opts[0].updates == 1


def test_critic_warmup_leaves_policy_unchanged():
    torch.manual_seed(0)
    policy, value = PolicyNet(ENC, (8,)), ValueNet(ENC, (8,))
    before = [p.detach().clone() for p in policy.parameters()]
    vbefore = [p.detach().clone() for p in value.parameters()]
    grads, _ = compute_gradients(policy, value, _random_batch(np.random.default_rng(4)), LossConfig())
    ActorCriticOptimizer(policy, value, 1e-2).apply_gradients(grads, train_policy=False)
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters(), strict=True))
    assert any(not torch.equal(a, p) for a, p in zip(vbefore, value.parameters(), strict=True))


def test_entropy_weight_decays_linearly_to_zero():
    from dl2ray.learn.actor_critic import entropy_weight

    assert entropy_weight(0.1, 0, 10_000) == 0.1  # no decay: the paper's constant β
    assert entropy_weight(0.1, 400, 0) == 0.1
    assert entropy_weight(0.1, 400, 100) == pytest.approx(0.075)
    assert entropy_weight(0.1, 400, 400) == 0.0
    assert entropy_weight(0.1, 400, 1000) == 0.0
