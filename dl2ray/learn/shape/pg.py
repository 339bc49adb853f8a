"""On-policy per-job policy gradient for the shape policy, with a learned value baseline (``--algo pg``).

The counterfactual learner (:mod:`dl2ray.learn.shape.counterfactual`) measures one job's choice by
re-simulating the slot; this one is the classic alternative issue 22 names: learn from the episodes
the *sampled* policy plays, crediting each job's choice with a return and a learned baseline.

**Collection** (:class:`OnPolicyCollector`): ``policy.shape.envs`` whole stretches per update through
the environment interface (:class:`~dl2ray.envs.cluster_env.ClusterEnvironment`: act, observe, reward),
on the learner's own cluster (``policy.experience: cluster``, the default: online RL, the simulator's
truth standing in for the live cluster and never read) or in its twin (``policy.experience: twin``: the
:class:`~dl2ray.learn.shape.twin.TwinExperience` simulators and episode source of the counterfactual
learner, operator-world episodes of the config or replays of what the cluster showed). Every slot is
decided by :func:`~dl2ray.policy.shape_decode.decide_shapes` with ``rng``: each job's
menu row is *sampled* from its policy over the rows its mask allows at its turn (Gumbel-max, on
policy). Per slot ``t``: the jobs' rows ``x`` (n, F), the global row ``g``, the masks, the sampled
rows, and each job's id.

**Credit** (``credit``; ``end_j`` the slot-time job ``j`` finished, the episode's last slot if it
did not):

- ``"job"``: ``G_{j,t} = −(end_j − t)``, the job's own remaining time in the system (slots): what
  its choice buys *itself*. It ignores what the choice costs the other jobs (a larger shape always
  helps its own job), so it is biased toward large shapes; the KL limit bounds the drift per update;
- ``"slot"``: ``R_t = −Σ_{h ≥ t} Σ_{j present at h} min(1, end_j − h)``, every job in the system
  from slot ``t`` on, later arrivals included: minus the remaining total JCT, the return whose
  episode sum is minus the total JCT, shared by every choice of the slot (unbiased, noisy: the
  slot's ``n`` choices share one number). With ``policy.shape.credit_discount`` γ < 1 each later slot
  counts ``γ^(h−t)``: the slots far ahead, which the choice hardly moves and later arrivals fill with
  noise, weigh less (biased toward the near future, as the DL2 paper's γ = 0.9 return is).

**Baseline**: a value network ``V(x_j, g)`` (an MLP over the job's row and the global row, two hidden
layers of ``head`` units) fitted each update to the credit by mean squared error (``4·epochs`` Adam
steps on standardised targets); it is the learner's own, kept between updates and in its checkpoint,
never shipped. Advantage ``A = credit − V``, standardised over the update's job decisions.

**Ablations** (Table 2, ``RLOptions``): ``critic`` False drops the value baseline (the update's mean
credit instead, :class:`SurrogateTarget`); ``exploration`` False plays every stretch greedily (the
collector's ``explore``: sampling rows from the policy is this learner's exploration) and drops the
entropy bonus: the update then only reweighs the rows the policy already takes. It has no experience
replay to turn off.

**Update** (:func:`pg_update`): PPO's clipped surrogate on the sampled rows (ratio clip 0.2) minus
``entropy_weight``·H, up to ``epochs`` Adam steps, stopped once the mean ``KL(old ‖ new)`` over the
update's job decisions exceeds ``trust`` (the same KL limit as the counterfactual learner).

Random streams: the sampled rows from the generator the learner passes (``[seed, 1]`` in
:class:`~dl2ray.learn.shape.trainer.ShapeTrainer`); the value network's initialisation from ``[seed, 3]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from dl2ray.config import ShapeConfig
from dl2ray.envs.cluster_env import ClusterEnvironment
from dl2ray.learn.actor_critic import entropy_weight, masked_entropy
from dl2ray.learn.records import PolicyGradientRow
from dl2ray.learn.shape.sl import PackedSlots, SlotSample, masked_job_logits
from dl2ray.policy.shape import ShapeEncoding, job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_net import NumpyShapePolicy, ShapePolicyNet
from dl2ray.view import Allocation

Credit = Literal["job", "slot"]
CLIP = 0.2


@dataclass
class Played:
    """One update's on-policy experience: ``slots`` (each job's row, masks and *sampled* row),
    ``credit`` per slot ``(n,)`` (module docstring), ``reward`` the mean slot reward and ``episodes``."""

    slots: list[SlotSample]
    credit: list[np.ndarray]
    reward: float
    episodes: int


EnvironmentOf = Callable[[int], ClusterEnvironment]
"""Stretch ``k`` → the environment it plays on (:class:`OnPolicyCollector`)."""


def environments(envs: Sequence[ClusterEnvironment]) -> EnvironmentOf:
    """Stretch ``k`` on ``envs[k mod n]`` (each replays its own source's stretch ``k``): one environment,
    the learner's own cluster, or side-by-side twin simulators behind the environment interface."""

    def env_of(k: int) -> ClusterEnvironment:
        env = envs[k % len(envs)]
        env.stretches = k  # its next stretch is this one
        return env

    return env_of


class OnPolicyCollector:
    """Whole stretches of the sampled policy through the environment interface (module docstring).

    ``env_of(k)`` is the environment stretch ``k`` plays on: the learner's own cluster
    (``policy.experience: cluster``, one :class:`~dl2ray.envs.cluster_env.ClusterEnvironment` for every
    stretch) or its twin (:func:`environments`). Only ``observe`` and ``act`` are called; the credit
    comes from what the environment showed (who was in each slot, when each job finished)."""

    def __init__(self, env_of: EnvironmentOf, enc: ShapeEncoding, rng: np.random.Generator,
                 credit: Credit = "job", start_episode: int = 0, explore: bool = True,
                 discount: float = 1.0) -> None:
        if credit not in ("job", "slot"):
            raise ValueError(f"credit: {credit!r}: known: job, slot")
        if not 0 < discount <= 1 or (credit == "job" and discount != 1.0):
            raise ValueError(f"discount: {discount}: need 0 < γ ≤ 1, and 1 with job credit")
        self.env_of, self.enc, self.rng, self.credit = env_of, enc, rng, credit
        self.discount = discount  # γ of the slot credit (module docstring)
        self.explore = explore  # False (Table 2's "without exploration"): every row the greedy one
        self.episodes = start_episode

    def collect(self, policy: NumpyShapePolicy, episodes: int) -> Played:
        out = Played([], [], 0.0, 0)
        rewards: list[float] = []
        for _ in range(episodes):
            rewards += self._episode(self.env_of(self.episodes), policy, out)
        out.reward = float(np.mean(rewards)) if rewards else 0.0
        return out

    def _episode(self, env: ClusterEnvironment, policy: NumpyShapePolicy, out: Played) -> list[float]:
        view = env.observe()
        self.episodes += 1
        out.episodes += 1
        present: list[tuple[int, list[int]]] = []  # (slot, job ids) of every slot, decided or not
        end: dict[int, float] = {}  # job id -> the slot-time it finished, as the cluster reported it
        rewards = []
        while True:
            ids = [j.job_id for j in view.jobs]
            present.append((view.slot, ids))
            if ids:
                x, g = job_features(view, self.enc)
                d = decide_shapes(view, self.enc, policy.logits(x, g), rng=self.rng if self.explore else None)
                out.slots.append(SlotSample(x, g, d.masks, d.actions))
                alloc = d.allocation
            else:
                alloc = Allocation.empty()
            fb = env.act(alloc)
            end.update(fb.finished)
            rewards.append(-fb.in_system)
            if fb.view is None:
                last = float(fb.slot + 1)
                break
            view = fb.view
        end = {j: min(t, last) for j, t in end.items()}
        seen = [(t, ids) for t, ids in present if ids]  # the slots with a decision, in out.slots' order
        out.credit += self._credit(seen, present, end, last)
        return rewards

    def _credit(self, seen, present, end: dict[int, float], last: float) -> list[np.ndarray]:
        def left(j: int) -> float:
            return end.get(j, last)

        if self.credit == "job":
            return [np.array([-(left(j) - t) for j in ids], np.float32) for t, ids in seen]
        # minus the time every job spends in the system from slot t on: (discounted) suffix sums
        in_slot = {t: sum(min(1.0, max(0.0, left(j) - t)) for j in ids) for t, ids in present}
        slots = sorted(in_slot)
        suffix, acc, after = {}, 0.0, None
        for t in reversed(slots):
            acc = in_slot[t] + (self.discount ** (after - t) * acc if after is not None else 0.0)
            suffix[t], after = acc, t
        return [np.full(len(ids), -suffix[t], np.float32) for t, ids in seen]


class JobValue(nn.Module):
    """``V(x_j, g)``: (N, F) job rows, (N,) each row's slot and (B, G) the slots' global rows → (N,)
    values (standardised units)."""

    def __init__(self, job_dim: int, global_dim: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(job_dim + global_dim, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor, slot: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, g[slot]], dim=-1)).squeeze(-1)


def build_job_value(enc: ShapeEncoding, width: int, seed: int) -> JobValue:
    """The baseline network, initialised from ``[seed, 3]``."""
    gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, 3]).integers(2**62)))
    value = JobValue(enc.job_dim, enc.global_dim, width)
    with torch.no_grad():
        for p in value.parameters():
            p.copy_(torch.empty_like(p).uniform_(-1, 1, generator=gen) / np.sqrt(max(1, p.shape[-1])))
    return value


class SurrogateTarget:
    """One on-policy update's fixed parts (module docstring, "Baseline" and "Update"): building it fits the
    baseline ``value`` to ``data``'s standardised credit (``4·epochs`` Adam steps) and fixes the
    standardised advantages and the old policy; :meth:`loss` is PPO's clipped surrogate every step
    minimises, :meth:`moved` the mean ``KL(π_old ‖ π_θ)`` over the update's job decisions.
    :func:`pg_update` steps on it alone; the mixed learner (:mod:`dl2ray.learn.shape.mix`) adds it to the
    counterfactual improvement.

    ``critic`` False (Table 2's "without actor-critic"): no value network is fitted or read; the baseline
    is the update's mean credit (the paper's moving average of rewards: any constant baseline leaves the
    same standardised advantages), so ``A`` is the standardised credit itself.

    ``control`` (the zero-advantage control run): the advantages are shuffled among the update's job
    decisions with this generator: the same magnitudes and so the same KL-limited steps, in directions
    that carry no information about which choice did better."""

    def __init__(self, net: ShapePolicyNet, value: JobValue, value_opt: torch.optim.Optimizer, data: Played,
                 epochs: int, control: np.random.Generator | None = None, critic: bool = True) -> None:
        self.batch = batch = PackedSlots.of(data.slots, net.enc.num_shapes)
        self.decisions = batch.jobs
        target = torch.from_numpy(np.concatenate(data.credit).astype(np.float32, copy=False) if data.credit
                                  else np.zeros(0, np.float32))
        self.mean_credit, sd = float(target.mean()), float(target.std()) + 1e-6
        z = (target - self.mean_credit) / sd
        self.value_loss = 0.0
        for _ in range(4 * epochs if critic else 0):
            loss = ((value(batch.x, batch.slot, batch.g) - z) ** 2).mean()
            value_opt.zero_grad()
            loss.backward()
            value_opt.step()
            self.value_loss = loss.item()
        with torch.no_grad():
            adv = z - value(batch.x, batch.slot, batch.g) if critic else z
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
            if control is not None:
                adv = adv[torch.from_numpy(control.permutation(adv.shape[0]))]
            self.adv = adv
            self.old = torch.log_softmax(masked_job_logits(net, batch), dim=-1)
            self.old_logp = self.old.gather(1, batch.actions[:, None]).squeeze(1)

    def logits(self, net: ShapePolicyNet, grad: bool = True) -> torch.Tensor:
        """``(N, K)``: ``net``'s masked logits of the update's job decisions (the input of :meth:`loss_at`
        and :meth:`kl_at`; one forward pass serves both)."""
        with torch.set_grad_enabled(grad):
            return masked_job_logits(net, self.batch)

    def loss_at(self, logits: torch.Tensor, entropy_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``−mean min(ρ·A, clip(ρ, 1±0.2)·A) − β·H`` over the job decisions, and their mean entropy."""
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(1, self.batch.actions[:, None]).squeeze(1)
        ratio = torch.exp(logp - self.old_logp)
        surrogate = torch.minimum(ratio * self.adv, ratio.clamp(1 - CLIP, 1 + CLIP) * self.adv)
        ent = masked_entropy(logits, self.batch.masks).mean()
        return -surrogate.mean() - entropy_weight * ent, ent

    def kl_at(self, logits: torch.Tensor) -> float:
        """Mean ``KL(π_old ‖ π)`` (nats) over the update's job decisions, ``π`` of these logits."""
        with torch.no_grad():
            new = torch.log_softmax(logits, dim=-1)
            p_old = self.old.exp()
            kl = torch.where(p_old > 0, p_old * (self.old - new), torch.zeros_like(self.old))
            return float(kl.sum(1).mean())

    def loss(self, net: ShapePolicyNet, entropy_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`loss_at` of ``net``'s logits."""
        return self.loss_at(self.logits(net), entropy_weight)

    def moved(self, net: ShapePolicyNet) -> float:
        """:meth:`kl_at` of ``net``'s logits: how far ``net`` has moved from the old policy."""
        return self.kl_at(self.logits(net, grad=False))


def entropy_bonus(s: ShapeConfig, update: int, exploration: bool = True) -> float:
    """β of update ``update`` (counted from 0): ``s.entropy_weight`` falling to 0 over
    ``s.entropy_decay_updates`` (:func:`~dl2ray.learn.actor_critic.entropy_weight`); 0 without exploration
    (Table 2's switch)."""
    return entropy_weight(s.entropy_weight, s.entropy_decay_updates, update) if exploration else 0.0


def pg_update(net: ShapePolicyNet, value: JobValue, opt: torch.optim.Optimizer,
              value_opt: torch.optim.Optimizer, data: Played, epochs: int, trust: float | None,
              entropy_weight: float, update: int = -1,
              control: np.random.Generator | None = None, critic: bool = True) -> PolicyGradientRow:
    """One update of ``net`` (and the baseline ``value``) on ``data`` (module docstring); its record.
    ``control``: the zero-advantage control; ``critic`` False: no learned baseline
    (:class:`SurrogateTarget`)."""
    target = SurrogateTarget(net, value, value_opt, data, epochs, control, critic)
    kl = entropy = policy_loss = 0.0
    steps = 0
    logits = target.logits(net)
    for step in range(epochs):
        loss, ent = target.loss_at(logits, entropy_weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        policy_loss, entropy = loss.item(), ent.item()
        # one forward pass of the new weights: this step's KL, and the next step's loss
        logits = target.logits(net, grad=step + 1 < epochs)
        kl = target.kl_at(logits)
        if trust is not None and kl > trust:
            break
    return PolicyGradientRow(update, policy_loss, target.value_loss, kl, entropy, data.reward,
                             target.mean_credit, len(data.slots), target.decisions, data.episodes,
                             steps)
