"""Warm start for SCHED²'s Q-network: imitate a baseline's choices, then fine-tune by DQN.

The DL2 recipe (learn a teacher's decisions first, then improve by RL), in DQfD's form
(Hester et al. 2018) so that the imitated Q-values stay usable as TD targets afterwards.

- **Teacher** (:class:`TeacherScheduler`): a list baseline of :mod:`dl2ray.sched2.baselines`
  restricted to what the agent can do — it picks, among the *allowed* jobs of the window (the
  first J waiting jobs by arrival, placed by gang packing), the one with the smallest key
  ``(key(job, placement), arrival, job id)``; its action is that job's index in the window.
  Out-of-window jobs are invisible to the agent, so they are to the teacher. A list baseline
  starts a job whenever one fits, so its label is never ϕ (the decision loop does not ask when
  no window job fits). DSIF is not a teacher: its pass-over count is state the Q-network lacks.
- **Demonstrations** (:func:`record_demos`): the teacher runs the same decision loop as the
  DQN's :class:`~dl2ray.sched2.scheduler.Sched2Scheduler`, so every decision step gives the
  DQN's state encoding, mask, the teacher's action and the reward (effectiveness), chained into
  transitions ``(s, mask, a, r, s', mask', done)`` exactly as the DQN's replay stores them.
- **Loss** (:func:`imitate`), per minibatch of demonstrations:
  ``L = mean_i[ max_{a allowed in s_i} (Q(s_i, a) + m·[a ≠ a_i]) − Q(s_i, a_i) ] + λ_TD · TD``,
  the large-margin loss (zero iff the teacher's action beats every other allowed one by ``m``)
  plus the DQN's Huber TD loss on the same transitions with a target network copied each epoch
  (``λ_TD = 0``: imitation only). Accuracy = share of states whose masked ``argmax Q`` is the
  teacher's action, on training demos and on held-out demos from validation traces.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields

import numpy as np

from dl2ray.sched2.baselines import KEYS, Profile
from dl2ray.sched2.scheduler import Sched2Scheduler
from dl2ray.sched2.state import Sched2Shape, masked_greedy
from dl2ray.view import ClusterView, JobPlacement, JobView

TEACHERS = tuple(k for k in KEYS if k != "dsif")
"""Baselines that can teach: the stateless list keys (``saf``, ``sif``, ``lrf``, ``spf``, ``fifo-gang``)."""


def teacher_action(
    name: str, profile: Profile, waiting: list[JobView], places: list[JobPlacement | None], window: int
) -> int:
    """Window index of the job the list baseline ``name`` starts first, or ``window`` (ϕ) if none fits."""
    key = KEYS[name]
    best: tuple | None = None
    for i, (job, pl) in enumerate(zip(waiting[:window], places, strict=False)):
        if pl is None:
            continue
        cand = (key(job, pl, profile), job.arrival_slot, job.job_id, i)
        if best is None or cand < best:
            best = cand
    return window if best is None else int(best[-1])


class TeacherScheduler(Sched2Scheduler):
    """The decision loop of SCHED² with a baseline choosing (see the module docstring)."""

    def __init__(self, cfg, shape: Sched2Shape, teacher: str, record=None, cost=None) -> None:
        super().__init__(cfg, shape, choose=lambda s, m: shape.window, record=record, cost=cost)
        self.teacher = teacher
        self.name = f"teacher-{teacher}"

    def pick(self, view: ClusterView, waiting, places, state, mask) -> int:
        return teacher_action(self.teacher, self.profile, waiting, places, self.shape.window)


class StudentScheduler(Sched2Scheduler):
    """DAgger's data collector: the network ``q_of`` decides, the teacher labels every state it visits."""

    def __init__(self, cfg, shape: Sched2Shape, teacher: str, q_of, labels: list) -> None:
        super().__init__(cfg, shape, choose=lambda s, m: masked_greedy(q_of(s), m))
        self.teacher, self.labels = teacher, labels
        self.name = f"student-{teacher}"

    def pick(self, view: ClusterView, waiting, places, state, mask) -> int:
        self.labels.append(
            (state, mask, teacher_action(self.teacher, self.profile, waiting, places, self.shape.window))
        )
        return int(self.choose(state, mask))


def student_demos(cfg, shape: Sched2Shape, teacher: str, q_of, trace_seeds: list[int]) -> Demos:
    """DAgger (Ross et al. 2011): states the network's own greedy policy visits on ``trace_seeds``,
    labelled with the teacher's action there (margin-loss fields only: no rewards)."""
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    labels: list[tuple] = []
    for seed in trace_seeds:
        run_episode(build_simulator(cfg), StudentScheduler(cfg, shape, teacher, q_of, labels), seed)
    states, masks, actions = zip(*labels, strict=True)
    return Demos.from_labels(list(states), list(masks), list(actions))


@dataclass
class Demos:
    """Teacher transitions, as the DQN's replay stores them: ``s``/``s2`` (n, state_dim) float32,
    ``m``/``m2`` (n, J+1) bool, ``a`` (n,) int64, ``r`` (n,) float64 (effectiveness), ``d`` (n,) bool."""

    s: np.ndarray
    m: np.ndarray
    a: np.ndarray
    r: np.ndarray
    s2: np.ndarray
    m2: np.ndarray
    d: np.ndarray

    def __len__(self) -> int:
        return len(self.a)

    @staticmethod
    def from_labels(states: list[np.ndarray], masks: list[np.ndarray], actions: list[int]) -> Demos:
        """Labelled states for the margin loss only (no reward or next state: zeros, ``done``)."""
        s = np.stack(states).astype(np.float32)
        m = np.stack(masks).astype(bool)
        n = len(s)
        a = np.asarray(actions, np.int64)
        return Demos(s, m, a, np.zeros(n), np.zeros_like(s), np.zeros_like(m), np.ones(n, bool))

    @staticmethod
    def concat(parts: list[Demos], weights: list[int]) -> Demos:
        """One set with part ``k`` repeated ``weights[k]`` times."""
        reps = [d for d, w in zip(parts, weights, strict=True) for _ in range(w)]
        return Demos(*(np.concatenate([getattr(d, f.name) for d in reps]) for f in fields(Demos)))


def _chain(steps: list[tuple]) -> list[tuple]:
    """Decision steps ``(s, m, a, r)`` of one episode → transitions (``s'`` = the next step's ``s``)."""
    out = []
    for k, (s, m, a, r) in enumerate(steps):
        if k + 1 < len(steps):
            out.append((s, m, a, r, steps[k + 1][0], steps[k + 1][1], False))
        else:
            out.append((s, m, a, r, np.zeros_like(s), np.zeros_like(m), True))
    return out


def record_demos(
    cfg, shape: Sched2Shape, teacher: str, trace_seeds: list[int], jct_scale: float | None = None
) -> Demos:
    """Run ``teacher`` on one trace per seed of ``cfg``; every decision step becomes a transition.

    Rewards: effectiveness (the paper's), or with ``jct_scale`` the DQN's ``jct`` reward (minus
    ``jct_scale`` × the job-hours accrued until the next decision, :mod:`dl2ray.sched2.dqn`).
    """
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    rows: list[tuple] = []
    for seed in trace_seeds:
        steps: list[tuple] = []

        def rec(s, m, a, r, steps=steps) -> None:
            steps.append((s, m, a, r if jct_scale is None else 0.0))

        def cost(job_hours: float, steps=steps) -> None:
            if steps and jct_scale is not None:
                s, m, a, r = steps[-1]
                steps[-1] = (s, m, a, r - jct_scale * job_hours)

        sched = TeacherScheduler(cfg, shape, teacher, record=rec, cost=cost)
        run_episode(build_simulator(cfg), sched, seed)
        rows.extend(_chain(steps))
    cols = list(zip(*rows, strict=True))
    return Demos(
        s=np.stack(cols[0]).astype(np.float32),
        m=np.stack(cols[1]).astype(bool),
        a=np.asarray(cols[2], np.int64),
        r=np.asarray(cols[3], np.float64),
        s2=np.stack(cols[4]).astype(np.float32),
        m2=np.stack(cols[5]).astype(bool),
        d=np.asarray(cols[6], bool),
    )


@dataclass(frozen=True)
class ImitationSettings:
    """Supervised warm start (module docstring); ``epochs`` passes over the training demos."""

    teacher: str = "saf"
    epochs: int = 30
    traces: int = 4
    """Training traces the teacher is recorded on (training seeds from ``dl2ray.sched2.dqn.DEMO_OFFSET``)."""
    lr: float = 1e-3
    batch: int = 128
    margin: float = 0.8
    """``m`` of the large-margin loss, in reward units (effectiveness ∈ [0, 1])."""
    td_weight: float = 1.0
    """``λ_TD``; 0 imitates only (Q-values then have no reward scale)."""
    gamma: float = 0.9
    dagger: int = 0
    """DAgger rounds after the first fit: each runs the network on ``dagger_traces`` new
    training traces, labels the states it visits with the teacher's action, and refits on all
    demonstrations so far for ``dagger_epochs`` (margin loss only)."""
    dagger_traces: int = 4
    dagger_epochs: int = 15


def accuracy(q: np.ndarray, demos: Demos) -> float:
    """Share of states whose masked ``argmax q`` (q: (n, J+1)) equals the teacher's action."""
    greedy = np.argmax(np.where(demos.m, q, -np.inf), axis=1)
    return float(np.mean(greedy == demos.a))


def margin_loss(q, mask, a, margin: float):
    """Torch: ``mean_i [max_{a allowed}(q_ia + m·[a ≠ a_i]) − q_{i,a_i}]`` (q: (B, J+1))."""
    import torch

    bonus = torch.full_like(q, margin)
    bonus.scatter_(1, a[:, None], 0.0)
    best = torch.where(mask, q + bonus, torch.full_like(q, -torch.inf)).max(dim=1).values
    return (best - q.gather(1, a[:, None])[:, 0]).mean()


def imitate(net, train: Demos, val: Demos, st: ImitationSettings, seed: int, on_epoch=None) -> list[dict]:
    """Fit ``net`` (a :func:`~dl2ray.sched2.qnet.build_qnet` module) to ``train`` in place.

    Minibatches are drawn without replacement by ``np.random.default_rng([seed, 0x1A17])``.
    Returns one row per epoch: losses, training and held-out (validation) accuracy.
    """
    import torch

    from dl2ray.sched2.dqn import td_targets

    rng = np.random.default_rng([seed, 0x1A17])
    opt = torch.optim.Adam(net.parameters(), lr=st.lr)
    t = {k: torch.from_numpy(getattr(train, k)) for k in ("s", "m", "a")}
    rows = []
    for epoch in range(st.epochs):
        target = copy.deepcopy(net)
        with torch.no_grad():
            nq = target(torch.from_numpy(train.s2)).numpy().astype(np.float64)
        y_all = torch.as_tensor(td_targets(train.r, train.d, nq, train.m2, st.gamma), dtype=torch.float32)
        order = rng.permutation(len(train))
        sums = np.zeros(2)
        for lo in range(0, len(order), st.batch):
            idx = torch.from_numpy(order[lo : lo + st.batch])
            q = net(t["s"][idx])
            lm = margin_loss(q, t["m"][idx], t["a"][idx], st.margin)
            td = torch.nn.functional.smooth_l1_loss(q.gather(1, t["a"][idx][:, None])[:, 0], y_all[idx])
            loss = lm + st.td_weight * td
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
            opt.step()
            sums += [lm.item() * len(idx), td.item() * len(idx)]
        with torch.no_grad():
            acc_t = accuracy(net(t["s"]).numpy(), train)
            acc_v = accuracy(net(torch.from_numpy(val.s)).numpy(), val)
        row = {
            "sl_epoch": epoch,
            "margin_loss": float(sums[0] / len(train)),
            "td_loss": float(sums[1] / len(train)),
            "train_acc": acc_t,
            "val_acc": acc_v,
        }
        rows.append(row)
        if on_epoch:
            on_epoch(row)
    return rows
