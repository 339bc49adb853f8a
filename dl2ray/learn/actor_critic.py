"""The actor-critic learner's math: losses and gradients of a minibatch, and the optimiser.

For a minibatch of N decision steps (:class:`~dl2ray.learn.rollout.Batch`),
step ``i`` from slot ``t`` with slot reward ``r_t``:

- **TD target** ``y_i = r_t + γ·V(s_{t+1})``, with ``s_{t+1}`` the first state
  of the next slot and ``V(s_{t+1}) = 0`` after the last slot of a trace
  (``γ = policy.gamma``); computed without gradient (semi-gradient TD).
- **Advantage** ``A_i = y_i − V(s_i)`` (detached in the policy loss).
  Without a critic (the ablation): ``A_i = G_i − mean_j G_j``, ``G`` the
  discounted Monte-Carlo return of the step's slot and the mean over the
  minibatch (the published code's mean-reward baseline).
- **Policy loss** ``L_π = (1/N) Σ_i w_i·(−log π(a_i|s_i)·A_i) − β·(1/N) Σ_i w_i·H_i``
  with ``H_i = −Σ_{a allowed} π(a|s_i)·log π(a|s_i)`` the entropy of the
  *masked* distribution (``β = policy.entropy_weight``).
- **Value loss** ``L_V = (1/N) Σ_i w_i·(y_i − V(s_i))²`` (zero without a critic).
- ``zero_advantage`` (the control experiment): ``A_i = 0``, so only the entropy
  bonus moves the policy (the critic still learns).

``w_i`` are importance weights from prioritised replay (all 1 otherwise).
The two networks have separate weights and separate Adam optimisers
(``policy.rl_lr``), so ``L_π`` moves only the policy and ``L_V`` only the value.

The split for A3C: :func:`compute_gradients` (pure, on any copy of the
networks) returns the gradients as a list of numpy arrays in the order of
:func:`parameters`; :class:`ActorCriticOptimizer.apply_gradients` applies such a
list to the master copy, wherever it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dl2ray.learn.rollout import Batch
from dl2ray.policy.network import PolicyNet, ValueNet, masked_logits


@dataclass(frozen=True)
class LossConfig:
    """``gamma`` (per slot), ``entropy_weight`` β, and whether a critic bootstraps the advantage."""

    gamma: float = 0.9
    entropy_weight: float = 0.1
    critic: bool = True
    zero_advantage: bool = False  # the control: A = 0, only the entropy bonus moves the policy

    @classmethod
    def from_config(cls, cfg, critic: bool = True, update: int = 0,
                    zero_advantage: bool = False) -> LossConfig:
        """The losses' settings at ``update`` (the entropy weight may decay, see :func:`entropy_weight`)."""
        p = cfg.policy
        return cls(p.gamma, entropy_weight(p.entropy_weight, p.entropy_decay_updates, update), critic,
                   zero_advantage)


def entropy_weight(beta: float, decay_updates: int, update: int) -> float:
    """``β·max(0, 1 − update/decay_updates)``; ``β`` itself when ``decay_updates`` is 0."""
    if decay_updates <= 0:
        return beta
    return beta * max(0.0, 1.0 - update / decay_updates)


def td_targets(rewards: torch.Tensor, next_values: torch.Tensor, terminals: torch.Tensor,
               gamma: float) -> torch.Tensor:
    """``y = r + γ·V(s')·(1 − terminal)``; shapes (N,)."""
    return rewards + gamma * next_values * (~terminals).to(rewards.dtype)


def masked_log_probs(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``log π(·|s)`` of the masked softmax, shape (N, A); ``-inf`` where masked."""
    return torch.log_softmax(masked_logits(logits, masks), dim=-1)


def masked_entropy(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``H = −Σ_{allowed a} π(a)·log π(a)``, shape (N,); masked actions contribute 0 (and no NaN gradient)."""
    logp = masked_log_probs(logits, masks)
    safe = torch.where(masks, logp, torch.zeros_like(logp))
    return -(logp.exp() * safe).sum(dim=-1)


@dataclass
class LossTerms:
    """Scalars ``policy_loss``, ``value_loss``, ``entropy`` (mean H); per-step (N,) detached
    ``targets``, ``values`` and ``advantages``."""

    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    targets: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor


def loss_terms(policy: PolicyNet, value: ValueNet, batch: Batch, cfg: LossConfig,
               weights: np.ndarray | None = None) -> LossTerms:
    """The losses of the module docstring for ``batch`` (``weights`` shape (N,), default ones)."""
    states = torch.from_numpy(batch.states)
    masks = torch.from_numpy(batch.masks)
    actions = torch.from_numpy(batch.actions)
    w = torch.ones(len(batch)) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    logits = policy(states)
    logp = masked_log_probs(logits, masks).gather(1, actions[:, None]).squeeze(1)
    entropy = masked_entropy(logits, masks)
    if cfg.critic:
        v = value(states)
        with torch.no_grad():
            y = td_targets(torch.from_numpy(batch.rewards), value(torch.from_numpy(batch.next_states)),
                           torch.from_numpy(batch.terminals), cfg.gamma)
        adv = (y - v).detach()
        value_loss = (w * (y - v) ** 2).mean()
        values = v.detach()
    else:
        y = torch.from_numpy(batch.returns)
        adv = y - y.mean()
        value_loss = torch.zeros(())
        values = torch.full_like(y, float(y.mean()))
    if cfg.zero_advantage:
        adv = torch.zeros_like(adv)
    policy_loss = (w * (-logp * adv)).mean() - cfg.entropy_weight * (w * entropy).mean()
    return LossTerms(policy_loss, value_loss, entropy.detach().mean(), y, values, adv)


def parameters(policy: PolicyNet, value: ValueNet) -> list[nn.Parameter]:
    """Policy parameters then value parameters: the order of every gradient list."""
    return [*policy.parameters(), *value.parameters()]


@dataclass
class GradientStats:
    """What one minibatch's gradient computation reports; ``priorities`` (N,) = ``|A_i|``."""

    policy_loss: float
    value_loss: float
    entropy: float
    mean_value: float
    mean_target: float
    priorities: np.ndarray


def compute_gradients(policy: PolicyNet, value: ValueNet, batch: Batch, cfg: LossConfig,
                      weights: np.ndarray | None = None) -> tuple[list[np.ndarray], GradientStats]:
    """Gradients of ``L_π + L_V`` w.r.t. :func:`parameters` (float32 numpy, one per parameter).

    Leaves the networks' ``.grad`` untouched; a parameter without gradient
    (the value net without a critic) gets zeros.
    """
    params = parameters(policy, value)
    terms = loss_terms(policy, value, batch, cfg, weights)
    total = terms.policy_loss + terms.value_loss
    grads = torch.autograd.grad(total, params, allow_unused=True)
    out = [np.zeros(tuple(p.shape), np.float32) if g is None else g.detach().numpy().copy()
           for p, g in zip(params, grads, strict=True)]
    stats = GradientStats(float(terms.policy_loss.detach()), float(terms.value_loss.detach()),
                          float(terms.entropy), float(terms.values.mean()), float(terms.targets.mean()),
                          terms.advantages.abs().numpy().copy())
    return out, stats


def flatten(grads: Sequence[np.ndarray]) -> np.ndarray:
    """One float32 vector of all gradients (for transport); :func:`unflatten` inverts it."""
    return np.concatenate([g.ravel() for g in grads]).astype(np.float32, copy=False)


def unflatten(vector: np.ndarray, like: Sequence[nn.Parameter]) -> list[np.ndarray]:
    out, lo = [], 0
    for p in like:
        n = p.numel()
        out.append(vector[lo:lo + n].reshape(tuple(p.shape)))
        lo += n
    if lo != vector.size:
        raise ValueError(f"gradient vector has {vector.size} entries, the parameters {lo}")
    return out


class ActorCriticOptimizer:
    """Adam on the policy and on the value network (``lr`` each), fed with gradient lists.

    ``max_grad_norm`` (optional) clips each network's gradient norm before the step.
    """

    def __init__(self, policy: PolicyNet, value: ValueNet, lr: float, max_grad_norm: float | None = None):
        self.policy, self.value = policy, value
        self.policy_opt = torch.optim.Adam(policy.parameters(), lr=lr)
        self.value_opt = torch.optim.Adam(value.parameters(), lr=lr)
        self.max_grad_norm = max_grad_norm
        self.updates = 0

    def apply_gradients(self, grads: Sequence[np.ndarray] | np.ndarray, train_policy: bool = True) -> None:
        """One Adam step of each network with ``grads`` (a list in :func:`parameters` order, or flat).

        ``train_policy=False`` steps only the value network (critic warm-up).
        """
        params = parameters(self.policy, self.value)
        if isinstance(grads, np.ndarray):
            grads = unflatten(grads, params)
        if len(grads) != len(params):
            raise ValueError(f"{len(grads)} gradients for {len(params)} parameters")
        for p, g in zip(params, grads, strict=True):
            p.grad = torch.as_tensor(np.asarray(g, dtype=np.float32)).reshape(p.shape).clone()
        if self.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(list(self.policy.parameters()), self.max_grad_norm)
            nn.utils.clip_grad_norm_(list(self.value.parameters()), self.max_grad_norm)
        if train_policy:
            self.policy_opt.step()
        self.value_opt.step()
        self.policy_opt.zero_grad(set_to_none=True)
        self.value_opt.zero_grad(set_to_none=True)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"policy": self.policy_opt.state_dict(), "value": self.value_opt.state_dict(),
                "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.policy_opt.load_state_dict(state["policy"])
        self.value_opt.load_state_dict(state["value"])
        self.updates = int(state["updates"])
