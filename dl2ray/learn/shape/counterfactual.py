"""Counterfactual per-job policy optimisation (``--algo counterfactual``) for the shape policy.

Why. The paper's update copies one slot's reward to the ~20 decisions of the
slot; one decision's effect (0.003–0.03) drowns in the critic's error (~0.5)
and the zero-advantage control learned as much (docs/notebook/2026-11-28.md). With the
shape policy a slot is one menu choice per job, and the simulator is
deterministic given its state and generator
(:meth:`~dl2ray.sim.Simulator.snapshot`), so the effect of *one job's* choice
can be measured alone, on common random numbers, with every other job
deciding as the policy would: credit per job, from re-simulating the slot.

**Collection** (:class:`CounterfactualCollector`), per training slot ``s_t``
of one of ``envs`` side-by-side episodes:

1. the greedy policy decides the slot (:func:`~dl2ray.policy.shape_decode.decide_shapes`);
   ``q_0`` is the return of that decision followed by ``horizon − 1`` greedy
   slots from the same snapshot: ``q = Σ_{h<H} γ^h r_{t+h}`` with
   ``r = −Σ_j`` (the fraction of the slot job ``j`` was in the system); with
   the default horizon (to the end of the run) and γ = 1, ``−q`` is the total
   remaining JCT of the jobs, so ``q_a − q_0`` is exactly how many job-slots
   the choice ``a`` saves against the greedy one, under the greedy continuation;
2. up to ``jobs_per_slot`` jobs ``j`` (drawn uniformly) each try a set ``T_j``
   of menu rows: their greedy row ``a_0``, up to ``samples`` rows drawn
   without replacement from their policy at temperature ``temperature``
   (Gumbel top-k) and ``uniform`` rows drawn uniformly from their mask; for
   each row the slot is decided again with job ``j`` forced to it (jobs
   before ``j`` in the run order unchanged, jobs after it deciding greedily on
   what is left) and rolled out as in 1 (identical allocations are simulated
   once). The advantage of a row is ``A_a = q_a − q_0``;
3. the episode goes on with the greedy decision (the states the deployed,
   greedy policy visits).

**Update** (:func:`improve_policy`), a KL-limited policy improvement on the
tried rows (as MPO's E-step, restricted to ``T_j``): the target of job ``j``
is ``t_j(a) ∝ π_old(a | T_j)·exp(A_a / η)`` over ``a ∈ T_j``, with the one
temperature ``η`` of the update chosen (by its convex dual) so that the mean
``KL(t_j ‖ π_old(·|T_j))`` is ``kl``; then ``epochs`` Adam steps of
``−mean_j Σ_{a∈T_j} t_j(a)·log π_θ(a | T_j) − β·H(π_θ(·|s, j))``
(``π(·|T)``: the policy renormalised over ``T``, so rows nobody tried keep
their relative weights; ``β = entropy_weight``). Better-than-greedy rows gain
probability in proportion to how much better they are, never more than the
KL limit allows per update.

**Control** (``zero_advantage``, the standing ``zero-advantage`` row of
``experiment ablation``): the same states, tries, rollouts and updates with
each job's advantages *shuffled* among its tried rows — the same magnitudes,
so the same KL-limited step size, in directions that carry no information
about which row did better. (Advantages set to exactly 0 would make the target
the old policy itself and leave the warm start unchanged, which the warm-start
row already shows; the shuffled control also measures what moving the policy
around and keeping the best validated checkpoint achieves by chance.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from dl2ray.learn.actor_critic import masked_entropy
from dl2ray.learn.shape.sl import PackedSlots, SlotSample, masked_job_logits
from dl2ray.policy.shape import ShapeEncoding, job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_net import NumpyShapePolicy, ShapePolicyNet
from dl2ray.sim import Simulator, StepResult
from dl2ray.view import Allocation, ClusterView
from dl2ray.workload import Trace


@dataclass
class Try:
    """One job's tries in one slot: ``actions`` (T,) distinct menu rows (the greedy row first),
    ``returns`` (T,) their rollout returns, ``mask`` (K,) the job's allowed rows."""

    slot: int  # index of the slot in the update's list
    job: int  # row of the job in that slot's view
    mask: np.ndarray
    actions: np.ndarray
    returns: np.ndarray

    @property
    def advantages(self) -> np.ndarray:
        """``q_a − q_0`` (job-slots saved against the greedy row)."""
        return self.returns - self.returns[0]


@dataclass
class Collected:
    slots: list[SlotSample]
    tries: list[Try]
    rollouts: int  # rollouts simulated (identical allocations counted once)
    reward: float  # mean slot reward of the greedy trajectory


def job_reward(sim: Simulator, view: ClusterView) -> float:
    """``−Σ_j`` fraction of the slot each job of ``view`` spent in the system (after ``sim.step``)."""
    end = sim.result.end_time
    return -sum(min(1.0, end[j.job_id] - view.slot) if j.job_id in end else 1.0 for j in view.jobs)


EpisodeSource = Callable[[int], tuple[int, Trace | None]]
"""Episode ``k`` of a collector → ``(seed, trace)``: the seed to reset with and the trace to replay (None:
the one the seed generates). :meth:`dl2ray.learn.shape.twin.ObservedTwin.episode` is one."""


class CounterfactualCollector:
    """Training episodes side by side over ``trace_seeds`` (cycled), tried as in the module docstring.

    ``rng`` draws the tried jobs and rows. ``source``: where episodes come from instead of
    ``trace_seeds`` (e.g. a twin replaying what the agent's cluster showed).
    """

    def __init__(self, sims: Sequence[Simulator], enc: ShapeEncoding, trace_seeds: Sequence[int],
                 rng: np.random.Generator, horizon: int, gamma: float, jobs_per_slot: int, samples: int,
                 uniform: int, temperature: float, start_episode: int = 0,
                 source: EpisodeSource | None = None) -> None:
        if not sims or not (trace_seeds or source):
            raise ValueError("need at least one simulator and one training trace seed")
        self.sims, self.enc, self.trace_seeds = list(sims), enc, list(trace_seeds)
        self.source: EpisodeSource = source or (lambda k: (self.trace_seeds[k % len(self.trace_seeds)], None))
        self.rng, self.horizon, self.gamma = rng, max(1, horizon), gamma
        self.jobs_per_slot, self.samples, self.uniform = jobs_per_slot, samples, uniform
        self.temperature = temperature
        self.episodes = start_episode
        self._views: list[ClusterView | None] = [None] * len(self.sims)

    def collect(self, policy: NumpyShapePolicy, slots: int) -> Collected:
        """Tries of ``slots`` slots, taken round-robin from the side-by-side episodes."""
        out = Collected([], [], 0, 0.0)
        rewards = [self._slot(policy, i % len(self.sims), out) for i in range(slots)]
        out.reward = float(np.mean(rewards)) if rewards else 0.0
        return out

    def _next_view(self, e: int) -> ClusterView:
        """Episode ``e``'s current view with at least one job (a new episode when one ended)."""
        sim, view = self.sims[e], self._views[e]
        while view is None or not view.jobs:
            if view is None:
                view = sim.reset(*self.source(self.episodes))
                self.episodes += 1
            else:  # nothing to decide: let the slot pass
                res = sim.step(Allocation.empty())
                view = None if res.done else res.view
        return view

    def tried_rows(self, logits: np.ndarray, mask: np.ndarray, greedy: int) -> list[int]:
        """``greedy``, then Gumbel top-k of ``logits / temperature`` and uniform draws, distinct, allowed."""
        rows = [greedy]
        keys = np.where(mask, logits / self.temperature + self.rng.gumbel(size=logits.shape[0]), -np.inf)
        keys[greedy] = -np.inf
        for a in np.argsort(-keys)[:self.samples].tolist():
            if np.isfinite(keys[a]):
                rows.append(int(a))
        rest = [a for a in np.flatnonzero(mask).tolist() if a not in rows]
        if rest and self.uniform:
            rows += self.rng.choice(rest, size=min(self.uniform, len(rest)), replace=False).tolist()
        return rows

    def _slot(self, policy: NumpyShapePolicy, e: int, out: Collected) -> float:
        sim, view = self.sims[e], self._next_view(e)
        x, g = job_features(view, self.enc)
        logits = policy.logits(x, g)
        greedy = decide_shapes(view, self.enc, logits)
        snap = sim.snapshot()
        cache: dict[tuple, float] = {}
        q0 = self._evaluate(sim, snap, view, greedy.allocation, policy, cache, out)
        k = len(out.slots)
        out.slots.append(SlotSample(x, g, greedy.masks, greedy.actions))
        n = len(view.jobs)
        for j in self.rng.choice(n, size=min(self.jobs_per_slot, n), replace=False).tolist():
            rows = self.tried_rows(logits[j], greedy.masks[j], int(greedy.actions[j]))
            if len(rows) < 2:
                continue
            q = [q0]
            for a in rows[1:]:
                alloc = decide_shapes(view, self.enc, logits, forced=(j, a)).allocation
                q.append(self._evaluate(sim, snap, view, alloc, policy, cache, out))
            out.tries.append(Try(k, j, greedy.masks[j].copy(), np.asarray(rows, np.int64), np.asarray(q)))
        sim.restore(snap)
        res = sim.step(greedy.allocation)
        reward = job_reward(sim, view)
        self._views[e] = None if res.done else res.view
        return reward

    def _evaluate(self, sim: Simulator, snap, view: ClusterView, allocation: Allocation,
                  policy: NumpyShapePolicy, cache: dict, out: Collected) -> float:
        key = tuple(sorted((j, tuple(t)) for j, t in allocation.tasks.items()))
        if key not in cache:
            sim.restore(snap)
            cache[key] = self._return(sim, view, allocation, policy)
            out.rollouts += 1
        return cache[key]

    def _return(self, sim: Simulator, view: ClusterView, allocation: Allocation,
                policy: NumpyShapePolicy) -> float:
        """``Σ_{h<H} γ^h r_{t+h}``: ``allocation`` now, then greedy slots."""
        res: StepResult = sim.step(allocation)
        total, discount = job_reward(sim, view), 1.0
        for _ in range(self.horizon - 1):
            if res.done:
                break
            v = res.view
            x, g = job_features(v, self.enc)
            res = sim.step(decide_shapes(v, self.enc, policy.logits(x, g)).allocation)
            discount *= self.gamma
            total += discount * job_reward(sim, v)
        return total


@dataclass
class UpdateStats:
    loss: float
    entropy: float  # mean masked entropy (nats) of the tried jobs' policies
    eta: float  # the temperature the KL limit chose
    kl: float  # mean KL(target ‖ old) over the tried jobs
    mean_gain: float  # mean over tries of the best row's advantage (job-slots)
    better: float  # fraction of tries where some row beat the greedy one


def solve_eta(adv: list[np.ndarray], prior: list[np.ndarray], kl: float) -> float:
    """The η of the KL-limited improvement: argmin of the convex dual
    ``g(η) = η·ε + η·mean_j log Σ_a p_j(a)·exp(A_j(a)/η)`` (MPO, Abdolmaleki et al. 2018)."""
    def dual(log_eta: float) -> float:
        eta = float(np.exp(log_eta))
        vals = []
        for a, p in zip(adv, prior, strict=True):
            z = a / eta
            m = z.max()
            vals.append(m + np.log(np.dot(p, np.exp(z - m))))
        return eta * kl + eta * float(np.mean(vals))

    res = minimize_scalar(dual, bounds=(-12.0, 8.0), method="bounded", options={"xatol": 1e-3})
    return float(np.exp(res.x))


def _all_jobs_logp(net: ShapePolicyNet, batch: PackedSlots) -> torch.Tensor:
    """``log π(·|s, j)`` of every job of every slot (N, K), 0 on disallowed rows."""
    return torch.log_softmax(masked_job_logits(net, batch), dim=-1).masked_fill(~batch.masks, 0.0)


class ImprovementTarget:
    """The per-job targets of one KL-limited improvement on ``data``'s tries (module docstring, "Update"),
    fixed before the first Adam step: :meth:`loss` is what every step minimises, :meth:`moved` the mean
    ``KL(π_old ‖ π_θ)`` over every job of the update's slots. :func:`improve_policy` steps on it alone;
    the mixed learner (:mod:`dl2ray.learn.shape.mix`) adds the on-policy surrogate to its loss.

    ``empty``: no try had two rows (nothing to learn from); then :meth:`loss` is never called."""

    def __init__(self, net: ShapePolicyNet, data: Collected, kl: float,
                 control: np.random.Generator | None = None) -> None:
        tries = [t for t in data.tries if len(t.actions) > 1]
        self.empty = not tries
        if self.empty:
            return
        self.batch = PackedSlots.of(data.slots, net.enc.num_shapes)
        # each try's job as a row of the packed batch
        slot, job = torch.tensor([t.slot for t in tries]), torch.tensor([t.job for t in tries])
        self.tried_rows = self.batch.start[slot] + job
        self.masks = torch.from_numpy(np.stack([t.mask for t in tries]))
        width = max(len(t.actions) for t in tries)
        rows = np.zeros((len(tries), width), np.int64)
        tried = np.zeros((len(tries), width), bool)
        for i, t in enumerate(tries):
            rows[i, :len(t.actions)], tried[i, :len(t.actions)] = t.actions, True
        self.rows, self.tried = torch.from_numpy(rows), torch.from_numpy(tried)
        with torch.no_grad():
            logits = net.packed(self.batch.x, self.batch.slot, self.batch.g)[self.tried_rows]
            old = self._restricted_logp(logits).exp().numpy()
            self.before = _all_jobs_logp(net, self.batch)
        adv = [t.advantages if control is None else control.permutation(t.advantages) for t in tries]
        prior = [old[i, :len(t.actions)] for i, t in enumerate(tries)]
        self.eta = solve_eta(adv, prior, kl) if any(np.ptp(a) > 0 for a in adv) else 1.0
        target = np.zeros((len(tries), width))
        kls = []
        for i, (a, p) in enumerate(zip(adv, prior, strict=True)):
            w = p * np.exp((a - a.max()) / self.eta)
            w /= w.sum()
            target[i, :len(a)] = w
            kls.append(float(np.sum(w * (np.log(np.maximum(w, 1e-300)) - np.log(np.maximum(p, 1e-300))))))
        self.target = torch.from_numpy(target).float()
        self.kl = float(np.mean(kls))
        gains = [float(t.advantages.max()) for t in tries]
        self.mean_gain = float(np.mean(gains))
        self.better = float(np.mean([g > 1e-9 for g in gains]))

    def _restricted_logp(self, logits: torch.Tensor) -> torch.Tensor:
        """``log π(a | T)`` for the tried rows (−inf on padding); logits (N, K)."""
        z = logits.gather(1, self.rows).masked_fill(~self.tried, float("-inf"))
        return torch.log_softmax(z, dim=1)

    def loss(self, net: ShapePolicyNet, entropy_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``−mean_j Σ_{a∈T_j} t_j(a)·log π_θ(a | T_j) − β·H``, and the tried jobs' mean entropy (nats)."""
        logits = net.packed(self.batch.x, self.batch.slot, self.batch.g)[self.tried_rows]
        logp = self._restricted_logp(logits).masked_fill(~self.tried, 0.0)
        entropy = masked_entropy(logits, self.masks).mean()
        return -(self.target * logp).sum(dim=1).mean() - entropy_weight * entropy, entropy

    def moved(self, net: ShapePolicyNet) -> float:
        """Mean ``KL(π_old ‖ π_θ)`` (nats) over every job of the update's slots, tried or not."""
        with torch.no_grad():
            kl = (self.before.exp() * (self.before - _all_jobs_logp(net, self.batch))).sum(-1)
            return float(kl.mean())


def improve_policy(net: ShapePolicyNet, opt: torch.optim.Optimizer, data: Collected, epochs: int, kl: float,
                   entropy_weight: float, control: np.random.Generator | None = None,
                   trust: float | None = None) -> UpdateStats:
    """The KL-limited improvement step of the module docstring on ``data``'s tries.

    ``control``: the zero-advantage control — each try's advantages are permuted with this generator.
    ``trust``: stop the Adam steps early once the mean ``KL(π_old ‖ π_θ)`` over *every* job of the
    update's slots (tried or not) exceeds it — the shared network moves untried jobs too.
    """
    target = ImprovementTarget(net, data, kl, control)
    if target.empty:
        return UpdateStats(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    stats = None
    for _ in range(epochs):
        loss, entropy = target.loss(net, entropy_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        stats = (float(loss.detach()), float(entropy.detach()))
        if trust is not None and target.moved(net) > trust:
            break
    assert stats is not None
    return UpdateStats(stats[0], stats[1], target.eta, target.kl, target.mean_gain, target.better)
