"""Experience collection: the sampled decision loop over the slots of a simulator (pure numpy).

A :class:`Collector` owns one simulator and a stream of training trace seeds.
Each call to :meth:`Collector.collect` continues the current episode (or
starts the next trace) and runs, slot after slot, the incremental decision
loop with actions *sampled* from the policy (Gumbel-max on an explicit
generator), optionally corrected by job-aware exploration
(:mod:`dl2ray.learn.exploration`). Per slot it records a :class:`SlotRecord`:
the inference steps ``(state, mask, action)``, the slot's reward
``r_t = Σ_j epochs_j(t) / E_j`` (:class:`~dl2ray.sim.StepResult`), and the
first state of the next slot ``s_{t+1}`` (window 0 with nothing allocated;
the state a TD target bootstraps from).

:func:`to_batch` flattens records into per-step arrays: every step of slot
``t`` carries the slot's reward (the paper assigns the slot reward to each
action of the slot), the slot's ``s_{t+1}`` and terminal flag, and the
Monte-Carlo discounted return of its slot (for the critic-free ablation).

The collector needs no torch: the policy is a
:class:`~dl2ray.policy.network.NumpyPolicy`, so a Ray agent can run it with
weights pulled from a global learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dl2ray.envs.cluster_env import ClusterEnvironment
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.policy.decision import Chooser, PolicyChooser, Step, run_decision
from dl2ray.policy.encoding import Encoding, SlotState, encode_window


@dataclass
class SlotRecord:
    """One slot of experience.

    ``steps``: its inferences in order; ``reward``: ``r_t`` (normalised epochs,
    summed over jobs); ``next_state``: ``s_{t+1}``, shape ``(J·(L+5),)`` float32
    (zeros when ``terminal``); ``terminal``: the trace ended with this slot
    (all jobs done, or ``sim.max_slots`` reached — treated alike);
    ``explored``: steps whose action exploration replaced.
    """

    steps: list[Step]
    reward: float
    next_state: np.ndarray
    terminal: bool
    trace_seed: int
    slot: int
    explored: int = 0


@dataclass
class Batch:
    """Per-step arrays, N steps: what the learner consumes and the replay buffer stores.

    ``states`` (N, D) float32, ``masks`` (N, A) bool, ``actions`` (N,) int64,
    ``rewards`` (N,) float32 (the step's slot reward), ``next_states`` (N, D)
    float32, ``terminals`` (N,) bool, ``returns`` (N,) float32 (discounted
    return from the step's slot, see :func:`discounted_returns`).
    D = J·(L+5), A = 3J+1.
    """

    states: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_states: np.ndarray
    terminals: np.ndarray
    returns: np.ndarray

    FIELDS = ("states", "masks", "actions", "rewards", "next_states", "terminals", "returns")

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def take(self, idx: np.ndarray) -> Batch:
        return Batch(*(getattr(self, f)[idx] for f in self.FIELDS))

    @classmethod
    def empty(cls, state_dim: int, action_dim: int) -> Batch:
        return cls(np.zeros((0, state_dim), np.float32), np.zeros((0, action_dim), bool),
                   np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros((0, state_dim), np.float32),
                   np.zeros(0, bool), np.zeros(0, np.float32))


def discounted_returns(rewards: np.ndarray, terminals: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + γ·G_{t+1}`` over consecutive slots, restarting after each terminal slot.

    Shapes (T,). After the last slot the return is cut (``G_{T-1} = r_{T-1}``
    when it is not terminal): unbiased only for whole episodes, which is what
    the critic-free learner collects.
    """
    out = np.zeros(len(rewards), dtype=np.float64)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        if terminals[t]:
            g = 0.0
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def to_batch(records: Sequence[SlotRecord], enc: Encoding, gamma: float) -> Batch:
    """Flatten consecutive slot records into per-step arrays (see :class:`Batch`)."""
    counts = [len(r.steps) for r in records]
    n = sum(counts)
    if n == 0:
        return Batch.empty(enc.state_dim, enc.action_dim)
    rewards = np.array([r.reward for r in records])
    terminals = np.array([r.terminal for r in records])
    returns = discounted_returns(rewards, terminals, gamma)
    steps = [s for r in records for s in r.steps]
    per = np.asarray(counts)
    return Batch(
        states=np.stack([s.state for s in steps]).astype(np.float32, copy=False),
        masks=np.stack([s.mask for s in steps]),
        actions=np.array([s.action for s in steps], dtype=np.int64),
        rewards=np.repeat(rewards, per).astype(np.float32),
        next_states=np.repeat(np.stack([r.next_state for r in records]), per, axis=0),
        terminals=np.repeat(terminals, per),
        returns=np.repeat(returns, per).astype(np.float32),
    )


@dataclass
class ExploringChooser:
    """A chooser (the sampling :class:`PolicyChooser` in training) whose action exploration may replace."""

    inner: Chooser
    exploration: JobAwareExploration | None
    rng: np.random.Generator | None
    enc: Encoding
    explored: int = field(default=0)

    def begin(self, slot: SlotState) -> None:
        self.inner.begin(slot)

    def choose(self, slot: SlotState, mask: np.ndarray) -> int:
        action = self.inner.choose(slot, mask)
        if self.exploration is None or self.exploration.eps <= 0:
            return action
        assert self.rng is not None
        counts = [slot.counts(i) for i in range(len(slot.jobs))]
        chosen = self.exploration.apply(action, counts, mask, self.enc, self.rng)
        self.explored += chosen != action
        return chosen

    def applied(self, row: int, delta: np.ndarray) -> None:
        self.inner.applied(row, delta)


class Collector:
    """Runs the sampled decision loop over the slots of its environment, stretch after stretch.

    ``env``: a :class:`~dl2ray.envs.cluster_env.ClusterEnvironment` (the learner's own cluster, or a twin
    behind the same interface); the collector only ever calls its ``observe`` and ``act``. ``rng`` draws
    the policy's samples, ``explore_rng`` the exploration's coins; both are owned by the caller.
    """

    def __init__(self, env: ClusterEnvironment, enc: Encoding, rng: np.random.Generator,
                 exploration: JobAwareExploration | None = None,
                 explore_rng: np.random.Generator | None = None) -> None:
        if exploration is not None and exploration.eps > 0 and explore_rng is None:
            raise ValueError("exploration needs its own numpy Generator")
        self.env, self.enc = env, enc
        self.rng, self.exploration, self.explore_rng = rng, exploration, explore_rng

    @property
    def episodes(self) -> int:
        """Stretches started so far."""
        return self.env.stretches

    @episodes.setter
    def episodes(self, value: int) -> None:
        self.env.stretches = value

    def collect(self, policy, min_steps: int, whole_episodes: bool = False) -> list[SlotRecord]:
        """Slots until at least ``min_steps`` inference steps (and, if asked, a stretch's end)."""
        records: list[SlotRecord] = []
        n = 0
        while True:
            rec = self.slot(policy)
            records.append(rec)
            n += len(rec.steps)
            if n >= min_steps and (rec.terminal or not whole_episodes):
                return records

    def slot(self, policy) -> SlotRecord:
        """Decide one slot on what the environment shows, act, and record what it showed back."""
        view = self.env.observe()
        chooser = ExploringChooser(PolicyChooser(policy, greedy=False, rng=self.rng), self.exploration,
                                   self.explore_rng, self.enc)
        decision = run_decision(view, self.enc, chooser, record=True)
        fb = self.env.act(decision.allocation)
        nxt = (np.zeros(self.enc.state_dim, np.float32) if fb.view is None
               else encode_window(fb.view, self.enc)[0])
        return SlotRecord(decision.steps, fb.progress, nxt, fb.ended, self.env.stretch_seed, view.slot,
                          chooser.explored)
