"""Rollout policy improvement for SCHED²'s Q-network (``dl2ray train sched2 --rollout-iters N``).

Imitation (:mod:`dl2ray.sched2.imitation`) can at best reproduce its teacher. This step
improves on the network's own greedy policy π the way rollout algorithms do (Bertsekas; the
counterfactual learner of DL2's shape policy, :mod:`dl2ray.learn.shape.counterfactual`, is the same
idea): on a training trace, run π and, at sampled decision slots whose first step has a real
choice, try each of the ``candidates`` best allowed actions by ``Q`` (ϕ included when allowed)
from a simulator snapshot, continue with π for ``horizon`` slots, and measure

    cost(a) = Σ_{slots t in the horizon} (jobs in the system at t)
              + Σ_{jobs left at the horizon} (their profiled remaining time, in slots),

the job-slots the total JCT accrues (plus a lower bound on what is still to come). Every
candidate sees the same future arrivals (the simulator is deterministic given its snapshot:
common random numbers). The label is ``argmin cost``; if it beats π's own action by less than
``min_gain`` job-slots, π's action is the label (no change where the difference is noise).

The labels ``(state, mask, action)`` of all iterations so far, with the teacher's
demonstrations, retrain the network by the large-margin loss (:func:`imitation.imitate`,
``td_weight = 0``); the result is validated like every other checkpoint. The rollouts read
future arrivals that a deployed scheduler never sees: only the trained network is deployed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.sched2.baselines import Profile
from dl2ray.sched2.scheduler import Sched2Scheduler
from dl2ray.sched2.state import Sched2Shape, masked_greedy


@dataclass(frozen=True)
class RolloutSettings:
    """One improvement iteration: ``traces`` training traces, ``points`` decision slots each."""

    iterations: int = 4
    traces: int = 2
    points: int = 40
    candidates: int = 3
    horizon: int = 720
    """Slots each rollout runs after the decision (720 = 12 h of 60-s slots)."""
    min_gain: float = 300.0
    """Job-slots a candidate must save over π's own action to become the label (a 400-job trace
    accrues ~150,000; the differences below this are the hindsight of one future)."""
    label_weight: int = 10
    """Copies of each rollout label in the retraining set (the teacher's demos count once)."""
    epochs: int = 10
    lr: float = 3e-4
    """Adam learning rate of each retraining round (the imitation's is 1e-3)."""


class _Forced(Sched2Scheduler):
    """π, except that the first step of its first decision takes ``first``."""

    def __init__(self, cfg, shape: Sched2Shape, greedy, first: int) -> None:
        super().__init__(cfg, shape, greedy)
        self.first: int | None = first

    def pick(self, view, waiting, places, state, mask) -> int:
        if self.first is not None:
            a, self.first = self.first, None
            return a
        return int(self.choose(state, mask))


def remaining_slots(view, profile: Profile) -> float:
    """Lower bound of the slots the jobs of ``view`` still spend in the system (running: remaining
    profiled time at their placement; waiting: remaining ideal time)."""
    from dl2ray.view import JobPlacement

    left = 0.0
    for j in view.jobs:
        if j.workers > 0:
            left += profile.actual_s(j, JobPlacement(j.worker_nodes, j.ps_nodes))
        else:
            left += profile.ideal_s(j)
    return left / view.slot_seconds


def rollout_cost(sim, snap, view, sched: Sched2Scheduler, horizon: int, profile: Profile) -> float:
    """``cost`` (module docstring) of running ``sched`` from ``snap`` (whose view is ``view``)."""
    sim.restore(snap)
    cost = 0.0
    for _ in range(horizon):
        if sim.done:
            return cost
        cost += len(view.jobs)
        view = sim.step(sched.decide(view)).view
    return cost + (0.0 if sim.done else remaining_slots(view, profile))


def label_trace(
    cfg, shape: Sched2Shape, q_of, seed: int, st: RolloutSettings, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray], list[int], list[float]]:
    """Rollout labels on the trace of ``seed``: ``(states, masks, actions, gains in job-slots)``.

    ``q_of(state) -> Q (J+1,)``: the network whose greedy policy is π.
    """
    from dl2ray.world import build_simulator

    def greedy(s: np.ndarray, m: np.ndarray) -> int:
        return masked_greedy(q_of(s), m)

    first_steps: list[tuple[np.ndarray, np.ndarray]] = []
    profile = Profile(cfg)
    sim = build_simulator(cfg)
    view = sim.reset(seed)
    pi = Sched2Scheduler(cfg, shape, greedy, record=lambda s, m, a, r: first_steps.append((s, m)))
    choices = []  # (snapshot, view, state, mask) of decision slots with a real first choice
    while not sim.done:
        snap = sim.snapshot() if pi.acts_on(view) else None
        n_before = len(first_steps)
        alloc = pi.decide(view)
        if snap is not None and len(first_steps) > n_before:
            s, m = first_steps[n_before]
            if m.sum() >= 2:
                choices.append((snap, view, s, m))
        view = sim.step(alloc).view
    picked: np.ndarray | list[int] = (
        rng.choice(len(choices), size=min(st.points, len(choices)), replace=False) if choices else [])
    states, masks, actions, gains = [], [], [], []
    for k in sorted(int(i) for i in picked):
        snap, v, s, m = choices[k]
        q = np.where(m, q_of(s), -np.inf)
        order = [int(a) for a in np.argsort(-q, kind="stable") if m[a]][: st.candidates]
        costs = [
            rollout_cost(sim, snap, v, _Forced(cfg, shape, greedy, a), st.horizon, profile) for a in order
        ]
        best = int(np.argmin(costs))
        gain = costs[0] - costs[best]
        states.append(s)
        masks.append(m)
        actions.append(order[best] if gain >= st.min_gain else order[0])
        gains.append(float(gain))
    return states, masks, actions, gains


ROLLOUT_OFFSET = 700_000
"""Training-seed offset of the traces rollouts label (iteration ``i`` uses ``offset + i·traces``)."""


def improve(learner, train_cfg, shape, st: RolloutSettings, demos, val_demos, seed: int):
    """``st.iterations`` rounds of labelling and retraining ``learner.net`` in place (module docstring).

    Yields one log row per round (labels, labels that differ from π's action, gains), after the
    refit, so that the caller validates ``learner.weights()`` then.
    """
    from dl2ray import seeds
    from dl2ray.sched2.imitation import Demos, ImitationSettings, imitate
    from dl2ray.sched2.qnet import numpy_qnet

    rng = np.random.default_rng([seed, 0x2011])
    got: list = []
    for it in range(st.iterations):
        net = numpy_qnet(shape, learner.weights())
        states, masks, actions, gains = [], [], [], []
        for trace_seed in seeds.training(st.traces, ROLLOUT_OFFSET + it * st.traces):
            s, m, a, g = label_trace(train_cfg, shape, net.q, trace_seed, st, rng)
            states += s
            masks += m
            actions += a
            gains += g
        if states:
            got.append(Demos.from_labels(states, masks, actions))
        greedy = [net.greedy(s, m) for s, m in zip(states, masks, strict=True)]
        changed = int(sum(a != g for a, g in zip(actions, greedy, strict=True)))
        if got:
            data = Demos.concat([demos, *got], [1] + [st.label_weight] * len(got))
            imitate(
                learner.net,
                data,
                val_demos,
                ImitationSettings(epochs=st.epochs, td_weight=0.0, lr=st.lr),
                seed + it,
            )
        learner.target.load_state_dict(learner.net.state_dict())
        yield {
            "rollout_iter": it,
            "labels": len(states),
            "changed": changed,
            "mean_gain_slots": float(np.mean(gains)) if gains else 0.0,
            "max_gain_slots": float(np.max(gains)) if gains else 0.0,
        }
