"""DQN for SCHED²: ε-greedy acting, prioritised replay, a target network (``dl2ray train sched2``).

One transition per decision step of :class:`~dl2ray.sched2.scheduler.Sched2Scheduler`:
``(s, mask, a, r, s', mask', done)`` where ``s'`` is the state of the *next* decision (in the
same frozen slot, or at the next event), ``done`` at the end of the episode (a trace).

- TD target (:func:`td_targets`): ``y = r + γ (1 − done) max_{a' allowed in s'} Q_target(s', a')``
  (0 for the max when no action is allowed, i.e. at the end).
- Loss: importance-weighted Huber loss ``Σ_i w_i huber(Q(s_i, a_i) − y_i) / n``.
- Prioritised replay (Schaul et al. 2016, proportional; :class:`PrioritizedReplay`):
  ``P(i) = p_i^α / Σ_k p_k^α`` with ``p_i = |δ_i| + ε_p`` after each update (new transitions get
  the largest priority seen); weights ``w_i = (size · P(i))^(−β) / max_{j in batch} w_j``.
- ε-greedy: ε falls linearly from ``eps_start`` to ``eps_end`` over the first ``eps_fraction``
  of the episodes; exploration picks uniformly among the allowed actions.
- The target network copies the online one every ``target_every`` updates.
- Reward (``reward``): ``effectiveness`` (the paper's, :func:`~dl2ray.sched2.state.effectiveness`
  of the started job, ϕ 0), or ``jct``: a decision earns minus the job-hours that every job in
  the system accrues until the next decision, × ``jct_scale``; over an episode these sum to
  minus the total JCT, so with γ → 1 the return is the objective itself (the effectiveness sum
  is not: it favours serving fresh jobs and starving the ones that already waited).

Traces: training seeds (:mod:`dl2ray.seeds`) for episodes, validation seeds to pick the
checkpoint (lowest censored average JCT of the greedy policy), never test seeds.

Training (the warm start, DAgger, the rollout rounds, then the episodes): :mod:`dl2ray.sched2.train`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def td_targets(
    rewards: np.ndarray, dones: np.ndarray, next_q: np.ndarray, next_masks: np.ndarray, gamma: float
) -> np.ndarray:
    """Shape (B,): ``r + γ (1 − done) max_{a' allowed} next_q`` (``next_q`` from the target net)."""
    allowed = np.where(next_masks, next_q, -np.inf)
    best = np.where(next_masks.any(axis=1), allowed.max(axis=1), 0.0)
    return rewards + gamma * (1.0 - dones.astype(np.float64)) * best


class PrioritizedReplay:
    """Ring buffer of ``capacity`` transitions with proportional priorities (module docstring)."""

    def __init__(
        self, capacity: int, state_dim: int, actions: int, alpha: float = 0.6, eps: float = 1e-3
    ) -> None:
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.s = np.zeros((capacity, state_dim), np.float32)
        self.s2 = np.zeros((capacity, state_dim), np.float32)
        self.m = np.zeros((capacity, actions), bool)
        self.m2 = np.zeros((capacity, actions), bool)
        self.a = np.zeros(capacity, np.int64)
        self.r = np.zeros(capacity, np.float64)
        self.d = np.zeros(capacity, bool)
        self.p = np.zeros(capacity, np.float64)
        self.max_p = 1.0
        self.next = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, s, m, a, r, s2, m2, done) -> None:
        i = self.next
        self.s[i], self.m[i], self.a[i], self.r[i] = s, m, a, r
        self.s2[i], self.m2[i], self.d[i] = s2, m2, done
        self.p[i] = self.max_p
        self.next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def probabilities(self) -> np.ndarray:
        """``P(i)`` over the stored transitions."""
        scaled = self.p[: self.size] ** self.alpha
        return scaled / scaled.sum()

    def sample(self, n: int, rng: np.random.Generator, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``(indices (n,), weights (n,))``, drawn with replacement by ``P``."""
        prob = self.probabilities()
        idx = rng.choice(self.size, size=n, p=prob)
        w = (self.size * prob[idx]) ** (-beta)
        return idx, w / w.max()

    def update(self, idx: np.ndarray, td_error: np.ndarray) -> None:
        p = np.abs(td_error) + self.eps
        self.p[idx] = p
        self.max_p = max(self.max_p, float(p.max()))


@dataclass(frozen=True)
class DQNSettings:
    """Hyper-parameters (the paper gives none; ours, see docs/sched2.md)."""

    episodes: int = 40
    window: int = 10
    arch: str = "dense"
    """Q-network: ``dense`` (the paper's) or ``jobwise`` (:mod:`dl2ray.sched2.jobwise`)."""
    reward: str = "effectiveness"
    """``effectiveness`` (the paper's) or ``jct`` (module docstring)."""
    jct_scale: float = 0.1
    """Reward units per job-hour of the ``jct`` reward."""
    gamma: float = 0.99
    lr: float = 5e-4
    batch: int = 64
    buffer: int = 50_000
    train_every: int = 2
    target_every: int = 250
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_fraction: float = 0.5
    alpha: float = 0.6
    beta_start: float = 0.4
    val_traces: int = 2
    eval_every: int = 5
    seed: int = 0
    train_jobs: int | None = None
    """Jobs per training trace (None: the config's ``workload.num_jobs``); validation keeps the config's."""


DEMO_OFFSET = 500_000
"""Training-seed offset of the traces the warm-start teacher is recorded on."""


@dataclass
class TrainLog:
    rows: list[dict] = field(default_factory=list)
    best: dict = field(default_factory=dict)
    imitation: list[dict] = field(default_factory=list)


def evaluate(cfg, shape, weights, seeds) -> float:
    """Mean censored average JCT (slots) of the greedy policy over ``seeds``' traces."""
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.sched2.qnet import numpy_qnet
    from dl2ray.sched2.scheduler import Sched2Scheduler
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    net = numpy_qnet(shape, weights)
    runs = [run_episode(build_simulator(cfg), Sched2Scheduler(cfg, shape, net.greedy), s) for s in seeds]
    return float(np.mean([censored_avg_jct(r) for r in runs]))


class DQNLearner:
    """Online net, target net, optimiser, replay and the ε-greedy actor of one DQN run."""

    def __init__(self, shape, st: DQNSettings) -> None:
        import copy

        import torch

        from dl2ray.sched2.qnet import build_qnet

        self.torch, self.st, self.shape = torch, st, shape
        self.net = build_qnet(shape, seed=st.seed)
        self.target = copy.deepcopy(self.net)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=st.lr)
        self.replay = PrioritizedReplay(st.buffer, shape.state_dim, shape.actions, st.alpha)
        self.rng = np.random.default_rng([st.seed, 0x5C4ED2])
        self.pending: tuple[np.ndarray, np.ndarray, int, float] | None = None
        self.steps = self.updates = 0
        self.eps, self.beta = st.eps_start, st.beta_start
        self.losses: list[float] = []

    def update(self) -> None:
        """One importance-weighted Huber step on a prioritised minibatch; priorities ← |δ|."""
        torch, st, rb = self.torch, self.st, self.replay
        idx, w = rb.sample(st.batch, self.rng, self.beta)
        with torch.no_grad():
            nq = self.target(torch.from_numpy(rb.s2[idx])).numpy().astype(np.float64)
        y = torch.as_tensor(td_targets(rb.r[idx], rb.d[idx], nq, rb.m2[idx], st.gamma), dtype=torch.float32)
        q = self.net(torch.from_numpy(rb.s[idx])).gather(1, torch.from_numpy(rb.a[idx])[:, None])[:, 0]
        huber = torch.nn.functional.smooth_l1_loss(q, y, reduction="none")
        loss = (torch.as_tensor(w, dtype=torch.float32) * huber).mean()
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 10.0)
        self.opt.step()
        rb.update(idx, (q.detach() - y).numpy())
        self.updates += 1
        self.losses.append(loss.item())
        if self.updates % st.target_every == 0:
            self.target.load_state_dict(self.net.state_dict())

    def choose(self, s: np.ndarray, mask: np.ndarray) -> int:
        """ε-greedy over the allowed actions."""
        allowed = np.flatnonzero(mask)
        if self.rng.random() < self.eps:
            return int(allowed[self.rng.integers(len(allowed))])
        with self.torch.no_grad():
            q = self.net(self.torch.from_numpy(s[None]))[0].numpy()
        return int(allowed[np.argmax(q[allowed])])

    def record(self, s, mask, a, r) -> None:
        """A decision step: completes the previous transition (its s' is this s), maybe trains."""
        if self.pending is not None:
            self.replay.add(*self.pending, s, mask, False)
        self.pending = (s, mask, a, r)
        self.steps += 1
        if len(self.replay) >= self.st.batch and self.steps % self.st.train_every == 0:
            self.update()

    def add_cost(self, job_hours: float) -> None:
        """``jct`` reward: charge ``job_hours`` (× ``jct_scale``) to the latest decision."""
        if self.pending is not None:
            s, m, a, r = self.pending
            self.pending = (s, m, a, r - self.st.jct_scale * job_hours)

    def end_episode(self) -> None:
        if self.pending is not None:
            s, m, a, r = self.pending
            self.replay.add(s, m, a, r, np.zeros_like(s), np.zeros_like(m), True)
            self.pending = None

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in self.net.state_dict().items()}


def dqn_episode(lr: DQNLearner, cfg, train_cfg, shape, trace_seed: int) -> dict:
    """One ε-greedy episode on the training trace of ``trace_seed``, learning as it goes; its log row."""
    from dl2ray.sched2.scheduler import Sched2Scheduler
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    st = lr.st
    jct = st.reward == "jct"
    rewards: list[float] = []
    job_hours: list[float] = []

    def rec(s, m, a, r) -> None:
        rewards.append(r)
        lr.record(s, m, a, 0.0 if jct else r)

    def cost(h: float) -> None:
        job_hours.append(h)
        lr.add_cost(h)

    sched = Sched2Scheduler(cfg, shape, lr.choose, rec, cost=cost if jct else None)
    run_episode(build_simulator(train_cfg), sched, trace_seed)
    lr.end_episode()
    return {
        "eps": lr.eps,
        "decisions": len(rewards),
        "reward": float(np.sum(rewards)),
        "jct_return": -st.jct_scale * float(np.sum(job_hours)) if jct else None,
        "updates": lr.updates,
        "loss": float(np.mean(lr.losses[-200:])) if lr.losses else float("nan"),
    }
