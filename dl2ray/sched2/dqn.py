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

Traces: training seeds (:mod:`dl2ray.learn.seeds`) for episodes, validation seeds to pick the
checkpoint (lowest censored average JCT of the greedy policy), never test seeds.

Warm start (``warm``, :mod:`dl2ray.sched2.imitation`): before the first episode the online net
imitates a baseline on its own training traces (training seeds from offset
:data:`DEMO_OFFSET`, so never an episode's trace and the same for any ``episodes``), the target net
copies it, the replay starts with the teacher's transitions, and the imitated net is validated
and saved as "episode −1", so ``episodes = 0`` ships the imitation as it is.
"""

from __future__ import annotations

import time
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
    from dl2ray.experiments import build_simulator
    from dl2ray.metrics import censored_avg_jct
    from dl2ray.sched2.qnet import numpy_qnet
    from dl2ray.sched2.scheduler import Sched2Scheduler
    from dl2ray.sim import run_episode

    net = numpy_qnet(shape, weights)
    runs = [run_episode(build_simulator(cfg), Sched2Scheduler(cfg, shape, net.greedy), s) for s in seeds]
    return float(np.mean([censored_avg_jct(r) for r in runs]))


class Learner:
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


def warm_start(lr: Learner, cfg, train_cfg, st: DQNSettings, warm, on_row=None) -> tuple[list[dict], tuple]:
    """Imitate ``warm.teacher`` into ``lr.net`` (module docstring).

    Returns the epoch rows and ``(training demos, validation demos)`` (DAgger and the rollout
    step refit on them)."""
    from dl2ray.learn import seeds
    from dl2ray.sched2.imitation import imitate, record_demos

    jct_scale = st.jct_scale if st.reward == "jct" else None
    train_demos = record_demos(
        train_cfg, lr.shape, warm.teacher, seeds.training(warm.traces, DEMO_OFFSET), jct_scale
    )
    val_demos = record_demos(cfg, lr.shape, warm.teacher, seeds.validation(st.val_traces), jct_scale)
    rows = imitate(lr.net, train_demos, val_demos, warm, st.seed, on_epoch=on_row)
    lr.target.load_state_dict(lr.net.state_dict())
    d = train_demos
    for i in range(min(len(d), st.buffer)):
        lr.replay.add(d.s[i], d.m[i], d.a[i], d.r[i], d.s2[i], d.m2[i], d.d[i])
    for row in rows:
        row.update(demos=len(train_demos), val_demos=len(val_demos))
    return rows, (train_demos, val_demos)


DAGGER_OFFSET = 600_000
"""Training-seed offset of DAgger's traces (round ``k`` uses ``offset + k·dagger_traces``)."""


def dagger(lr: Learner, train_cfg, shape, warm, demos: tuple, seed: int):
    """DAgger rounds after the warm start (:class:`~dl2ray.sched2.imitation.ImitationSettings`
    ``dagger``): yields one log row per round, after refitting ``lr.net`` in place."""
    from dataclasses import replace

    from dl2ray.learn import seeds
    from dl2ray.sched2.imitation import Demos, accuracy, imitate, student_demos
    from dl2ray.sched2.qnet import numpy_qnet

    train_demos, val_demos = demos
    got = [train_demos]
    for k in range(warm.dagger):
        net = numpy_qnet(shape, lr.weights())
        trace_seeds = seeds.training(warm.dagger_traces, DAGGER_OFFSET + k * warm.dagger_traces)
        new = student_demos(train_cfg, shape, warm.teacher, net.q, trace_seeds)
        agree = accuracy(net.q(new.s), new)
        got.append(new)
        fit = replace(warm, epochs=warm.dagger_epochs, td_weight=0.0)
        rows = imitate(lr.net, Demos.concat(got, [1] * len(got)), val_demos, fit, seed + 100 + k)
        lr.target.load_state_dict(lr.net.state_dict())
        yield {"dagger_round": k, "new_states": len(new), "agreement_before": agree, **rows[-1]}


def dqn_episode(lr: Learner, cfg, train_cfg, shape, trace_seed: int) -> dict:
    """One ε-greedy episode on the training trace of ``trace_seed``, learning as it goes; its log row."""
    from dl2ray.experiments import build_simulator
    from dl2ray.sched2.scheduler import Sched2Scheduler
    from dl2ray.sim import run_episode

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


def warm_stages(lr: Learner, cfg, train_cfg, warm, rollout, log: TrainLog, on_row=None):
    """The stages before DQN, each yielding ``(log row, stage name)`` once ``lr.net`` is ready to
    validate: the imitation (its epoch rows go to ``log.imitation``), each DAgger round, each
    rollout round."""
    log.imitation, demos = warm_start(lr, cfg, train_cfg, lr.st, warm, on_row=on_row)
    yield {"episode": -1}, "imitation"
    for row in dagger(lr, train_cfg, lr.shape, warm, demos, lr.st.seed):
        yield row, f"dagger round {row['dagger_round']}"
    if rollout is not None and rollout.iterations > 0:
        from dl2ray.sched2.rollout import improve

        train_demos, val_demos = demos
        for row in improve(lr, train_cfg, lr.shape, rollout, train_demos, val_demos, lr.st.seed):
            yield row, f"rollout round {row['rollout_iter']}"


def train(cfg, st: DQNSettings, out_path, on_episode=None, warm=None, rollout=None) -> TrainLog:
    """Train, write the best-on-validation checkpoint to ``out_path``; returns the log.

    ``warm``: an :class:`~dl2ray.sched2.imitation.ImitationSettings` to start from (None: from
    the random initialisation, as before). ``rollout``: a
    :class:`~dl2ray.sched2.rollout.RolloutSettings` to improve the imitation by rollouts
    (needs ``warm``) before the DQN episodes; each round is validated and may be kept.
    """
    import torch

    from dl2ray.learn import seeds
    from dl2ray.sched2.qnet import save_checkpoint
    from dl2ray.sched2.state import Sched2Shape

    torch.set_num_threads(1)
    shape = Sched2Shape.from_config(cfg, st.window, st.arch)
    lr = Learner(shape, st)
    train_cfg = (
        cfg
        if st.train_jobs is None
        else cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"num_jobs": st.train_jobs})})
    )
    val_seeds = seeds.validation(st.val_traces)
    log = TrainLog()
    best = float("inf")
    t0 = time.time()

    def keep_if_best(val_jct: float, episode: int, stage: str = "dqn") -> None:
        nonlocal best
        if val_jct < best:
            best = val_jct
            log.best = {
                "settings": st.__dict__,
                "warm_start": None if warm is None else warm.__dict__,
                "imitation": log.imitation[-1] if log.imitation else None,
                "episode": episode,
                "stage": stage,
                "val_jct": best,
                "val_seeds": val_seeds,
                "config": cfg.name,
            }
            save_checkpoint(out_path, lr.net, log.best)

    if warm is not None:
        for row, stage in warm_stages(lr, cfg, train_cfg, warm, rollout, log, on_episode):
            row["seconds"] = time.time() - t0
            row["val_jct"] = evaluate(cfg, shape, lr.weights(), val_seeds)
            keep_if_best(row["val_jct"], -1, stage)
            log.rows.append(row)
            if on_episode:
                on_episode(row)
    for ep in range(st.episodes):
        frac = min(ep / max(1.0, st.eps_fraction * st.episodes), 1.0)
        lr.eps = max(st.eps_end, st.eps_start + (st.eps_end - st.eps_start) * frac)
        lr.beta = st.beta_start + (1.0 - st.beta_start) * ep / max(1, st.episodes - 1)
        row = dqn_episode(lr, cfg, train_cfg, shape, seeds.training(1, ep)[0])
        row.update(episode=ep, seconds=time.time() - t0)
        if (ep + 1) % st.eval_every == 0 or ep == st.episodes - 1:
            row["val_jct"] = evaluate(cfg, shape, lr.weights(), val_seeds)
            keep_if_best(row["val_jct"], ep)
        log.rows.append(row)
        if on_episode:
            on_episode(row)
    return log
