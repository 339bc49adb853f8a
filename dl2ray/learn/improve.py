"""Rollout policy improvement: per-step credit from re-simulating one decision step at a time.

Why. The paper's update copies one slot's reward to the ~20 decisions of the
slot and compares it with a critic's guess; one +PS-vs-+bundle choice moves the
slot reward by 0.003–0.03 while the critic's error is ~0.5, so the gradient is
mostly noise (docs/notebook/2026-11-28.md: the zero-advantage control learns as much).
The simulator is deterministic given its state and generator
(:meth:`~dl2ray.sim.Simulator.snapshot`), so one decision *step* can be
re-taken with other actions and the outcomes compared on common random
numbers: the difference is the effect of that one action, nothing else.

**Labels** (:class:`ImprovementCollector`), per training slot with view ``s_t``:

1. the greedy policy decides the slot; every step ``(state, mask, action)``
   of that decision is recorded;
2. at ``points`` of its steps (drawn uniformly) the greedy action ``a_0`` and
   up to ``K − 1`` alternatives ``a_1..`` (allowed actions, Gumbel top-k of the
   logits at ``temperature``) are each taken: the rest of the slot and
   ``horizon − 1`` further slots are decided greedily and simulated from the
   same snapshot, giving ``q_k = Σ_{h<H} γ^h r_{t+h}``;
3. the label of a tried step is ``argmax_k q_k`` (ties keep ``a_0``); every
   other step keeps its greedy action as its label, which anchors the policy
   where nothing better was found;
4. the episode goes on with the greedy decision.

``reward``: ``jobs`` = minus the job-slots spent in the system this slot
(``−Σ_j`` the fraction of the slot job ``j`` was unfinished; summed over a run
it is minus the total JCT), or the paper's ``progress`` ``Σ_j epochs_j/E_j``.

**Update** (:func:`imitation_update`): label-smoothed cross-entropy
(:func:`dl2ray.learn.supervised.smoothed_cross_entropy`) on minibatches from the last
``buffer`` labels (:class:`ImitationBuffer`). This is approximate policy
iteration with rollouts (the greedy-rollout improvement operator, then a
supervised projection), i.e. the "expert iteration" family.

**Control** (``select="random"``): the label of a tried step is a uniformly
drawn tried action — the same states, rollouts and updates with the outcomes'
information removed (the zero-advantage run of the issue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dl2ray.learn.actor_critic import masked_entropy
from dl2ray.policy.decision import decide_slot, run_decision
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import PolicyNet, masked_logits
from dl2ray.sim import Simulator, StepResult
from dl2ray.view import Allocation, ClusterView

REWARDS = ("progress", "jobs")


@dataclass
class Improvement:
    """One labelled decision step: the greedy action at ``state`` and the alternatives tried there
    (only the greedy action, ``tried`` False, at the steps of a slot where nothing was tried).

    ``state`` (D,), ``mask`` (A,): the step of the greedy decision where one
    action was replaced; ``actions`` (K,): the greedy action first, then the
    alternatives; ``returns`` (K,): the ``horizon``-slot return of each (the
    rest of the slot and the later slots decided greedily, common random
    numbers); ``chosen``: the index of the action to imitate.
    """

    state: np.ndarray
    mask: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    chosen: int
    tried: bool = True  # False: a step of the greedy decision where nothing else was tried

    @property
    def gain(self) -> float:
        """How much the chosen action's return exceeds the greedy action's."""
        return float(self.returns[self.chosen] - self.returns[0])

    @property
    def label(self) -> int:
        return int(self.actions[self.chosen])


class _Deviate:
    """A greedy :class:`~dl2ray.policy.decision.PolicyChooser` that takes ``action`` at inference ``at``."""

    def __init__(self, policy, at: int, action: int) -> None:
        from dl2ray.policy.decision import PolicyChooser

        self.inner, self.at, self.action, self.n = PolicyChooser(policy), at, action, 0

    def begin(self, slot) -> None:
        self.inner.begin(slot)

    def choose(self, slot, mask: np.ndarray) -> int:
        a = self.inner.choose(slot, mask)
        if self.n == self.at:
            a = self.action
        self.n += 1
        return a

    def applied(self, row: int, delta: np.ndarray) -> None:
        self.inner.applied(row, delta)


class ImprovementCollector:
    """Training episodes side by side (one simulator each) over ``trace_seeds``, cycled; labels as in
    the module docstring. ``alternatives`` ``K − 1`` per tried step; ``rng`` draws the tried
    steps, the alternatives' Gumbel noise and the control's picks."""

    def __init__(self, sims: Sequence[Simulator], enc: Encoding, trace_seeds: Sequence[int],
                 alternatives: int, rng: np.random.Generator, horizon: int = 10, reward: str = "jobs",
                 gamma: float = 1.0, temperature: float = 1.0, select: str = "best", points: int = 1,
                 start_episode: int = 0) -> None:
        if not sims or not trace_seeds:
            raise ValueError("need at least one simulator and one training trace seed")
        if reward not in REWARDS:
            raise ValueError(f"unknown reward {reward!r}; known: {list(REWARDS)}")
        if select not in ("best", "random"):
            raise ValueError(f"unknown selection {select!r}: best or random")
        self.sims, self.enc, self.trace_seeds = list(sims), enc, list(trace_seeds)
        self.alternatives, self.rng, self.horizon = alternatives, rng, max(1, horizon)
        self.reward, self.gamma, self.temperature = reward, gamma, temperature
        self.select, self.points = select, points
        self.episodes = start_episode  # episodes started so far
        self._views: list[ClusterView | None] = [None] * len(self.sims)

    def collect(self, policy, slots: int) -> list[Improvement]:
        """Labels of ``slots`` slots, taken round-robin from the side-by-side episodes."""
        out: list[Improvement] = []
        for i in range(slots):
            out.extend(self.improve(policy, i % len(self.sims)))
        return out

    def episode_view(self, e: int) -> ClusterView:
        """Episode ``e``'s view now: its current slot, or the first slot of the next training trace when
        it has none (the episode ended or never started)."""
        if self._views[e] is None:
            self._views[e] = self.sims[e].reset(self.trace_seeds[self.episodes % len(self.trace_seeds)])
            self.episodes += 1
        view = self._views[e]
        assert view is not None
        return view

    def improve(self, policy, e: int) -> list[Improvement]:
        """Label one slot of episode ``e`` (steps 1–4 of the module docstring)."""
        sim = self.sims[e]
        view = self.episode_view(e)
        greedy = decide_slot(view, policy, self.enc, record=True, fast=False)
        snap = sim.snapshot()
        n = len(greedy.steps)
        tried = set(self.rng.choice(n, size=min(self.points, n), replace=False).tolist()) if n else set()
        out = []
        for at, step in enumerate(greedy.steps):
            if at not in tried:
                out.append(Improvement(step.state, step.mask, np.array([step.action]), np.zeros(1), 0, False))
                continue
            actions = [step.action, *self._alternatives(policy, step)]
            returns = []
            for a in actions:
                sim.restore(snap)
                returns.append(self._rollout(sim, view, _Deviate(policy, at, a), policy))
            q = np.asarray(returns, np.float64)
            if self.select == "best":
                chosen = int(np.argmax(q)) if q.max() > q[0] + 1e-9 else 0
            else:
                chosen = int(self.rng.integers(len(q)))
            out.append(Improvement(step.state, step.mask, np.asarray(actions, np.int64), q, chosen, True))
        sim.restore(snap)
        res = sim.step(greedy.allocation)
        self._views[e] = None if res.done else res.view
        return out

    def _alternatives(self, policy, step) -> list[int]:
        """Up to K − 1 allowed actions other than the greedy one, Gumbel top-k at the temperature."""
        logits = policy.logits(step.state) / self.temperature
        keys = np.where(step.mask, logits + self.rng.gumbel(size=logits.shape[0]), -np.inf)
        keys[step.action] = -np.inf
        k = min(self.alternatives, int(np.isfinite(keys).sum()))
        return [int(a) for a in np.argsort(-keys)[:k]]

    def _rollout(self, sim: Simulator, view: ClusterView, chooser, policy) -> float:
        """``q``: this slot decided by ``chooser``, then ``horizon − 1`` greedy slots."""
        res, g = self._step(sim, view, run_decision(view, self.enc, chooser).allocation)
        discount = 1.0
        for _ in range(self.horizon - 1):
            if res.done:
                break
            nxt = res.view
            res, r = self._step(sim, nxt, decide_slot(nxt, policy, self.enc).allocation)
            discount *= self.gamma
            g += discount * r
        return g

    def _step(self, sim: Simulator, view: ClusterView, allocation: Allocation) -> tuple[StepResult, float]:
        res = sim.step(allocation)
        if self.reward == "progress":
            return res, float(res.reward)
        end = sim.result.end_time
        return res, -sum(min(1.0, end[j.job_id] - view.slot) if j.job_id in end else 1.0 for j in view.jobs)


class ImitationBuffer:
    """The last ``capacity`` imitated steps (FIFO): states, masks, actions."""

    def __init__(self, capacity: int, state_dim: int, action_dim: int) -> None:
        self.capacity = capacity
        self.states = np.zeros((0, state_dim), np.float32)
        self.masks = np.zeros((0, action_dim), bool)
        self.actions = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.actions)

    def add(self, items: Sequence[Improvement]) -> None:
        if not items:
            return
        self.states = np.concatenate([self.states, np.stack([it.state for it in items])])[-self.capacity:]
        self.masks = np.concatenate([self.masks, np.stack([it.mask for it in items])])[-self.capacity:]
        self.actions = np.concatenate([self.actions, [it.label for it in items]])[-self.capacity:]


def imitation_update(policy: PolicyNet, opt: torch.optim.Optimizer, buffer: ImitationBuffer, batches: int,
                     batch_size: int, smoothing: float, rng: np.random.Generator) -> tuple[float, float]:
    """``batches`` Adam steps of label-smoothed cross-entropy on minibatches drawn from ``buffer``.

    Returns the mean loss and the mean masked entropy (nats) of the policy on the minibatches.
    """
    from dl2ray.learn.supervised import smoothed_cross_entropy

    total, ent = 0.0, 0.0
    for _ in range(batches):
        idx = rng.integers(len(buffer), size=min(batch_size, len(buffer)))
        masks = torch.from_numpy(buffer.masks[idx])
        logits = policy(torch.from_numpy(buffer.states[idx]))
        loss = smoothed_cross_entropy(masked_logits(logits, masks), masks,
                                      torch.from_numpy(buffer.actions[idx]), smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach())
        ent += float(masked_entropy(logits.detach(), masks).mean())
    n = max(batches, 1)
    return total / n, ent / n
