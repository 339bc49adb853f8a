"""Training Harmony (``dl2ray train harmony``): the reward-prediction model, then actor-critic.

1. **Reward model.** Placements of ``random-place``, ``lb-place`` and ``tetris-place`` are
   logged on training traces (:func:`~dl2ray.harmony.linear.log_placements`); the MLP of
   :mod:`dl2ray.harmony.nets` is fitted to the logged normalised speeds by the mean relative
   error (Adam, full batch), and its error is measured on the same schedulers' placements on
   validation traces (held out).
2. **Actor-critic.** Episodes on training traces; every placed job's steps get the return
   ``R`` (:func:`~dl2ray.harmony.policy.placement_reward`, γ = 1 inside a job, jobs independent).
   Loss per minibatch: ``−mean(ρ A log π(a|s)) + ½ mean((R − V(s))²) − β_H mean(H(π(·|s)))``
   with the advantage ``A = R − V(s)`` normalised over the minibatch (zero mean, unit std;
   ``adv_norm``), and the truncated importance ratio ``ρ = min(1, π(a|s)/μ(a|s))`` for replayed steps (``μ``:
   the probability the behaviour policy — the ε mixture — gave ``a``). Exploration: with
   probability ε the action is the load-balancing or the bin-packing one (half each), else a
   sample of π. Replay: a FIFO buffer of steps; each update draws from it.
   Model selection: lowest censored average JCT of the greedy policy on validation traces.

Ablations (``--ablation``): ``no-rm`` (reward: the job's own observed normalised speed in its
first slot, from the simulator, instead of the model's counterfactual ``R``), ``no-replay``
(each update uses only the episode's fresh steps), ``no-explore`` (ε = 0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HarmonySettings:
    episodes: int = 30
    rm_traces: int = 30
    rm_val_traces: int = 2
    rm_steps: int = 8000
    rm_batch: int = 512
    lr: float = 1e-3
    entropy: float = 0.01
    eps_start: float = 0.3
    eps_end: float = 0.02
    replay: int = 8192
    batch: int = 256
    updates_per_episode: int = 16
    val_traces: int = 6
    eval_every: int = 3
    ablation: str = "none"
    seed: int = 0
    warm_start: str = "none"
    adv_norm: bool = True
    imitation_traces: int = 30
    imitation_steps: int = 3000
    imitation_lr: float = 1e-3


def relative_errors(model, x, y) -> np.ndarray:
    """Shape (S,): ``|ŷ − y| / y`` of the torch reward ``model`` on features ``x`` (S, F)."""
    import torch

    with torch.no_grad():
        out = []
        for i in range(0, len(x), 8192):
            out.append(model(torch.as_tensor(x[i : i + 8192], dtype=torch.float32))[:, 0].numpy())
    pred = np.concatenate(out) if out else np.zeros(0)
    return np.abs(pred - y) / y


def fit_reward_model(x: np.ndarray, y: np.ndarray, types: int, max_nodes: int, st: HarmonySettings):
    """The reward model fitted to features ``x`` (S, F) and normalised speeds ``y`` (S,) by the
    mean relative error: ``st.rm_steps`` Adam steps (lr 3e-3, cosine to 0) on minibatches of
    ``st.rm_batch`` drawn with the seed ``st.seed``."""
    import torch

    from dl2ray.harmony.nets import build_reward_model

    model = build_reward_model(types, max_nodes, seed=st.seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(st.rm_steps, 1))
    rng = np.random.default_rng([st.seed, 0x12E3])
    xt, yt = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    for _ in range(st.rm_steps):
        idx = torch.from_numpy(rng.integers(0, len(x), size=min(st.rm_batch, len(x))))
        loss = (torch.abs(model(xt[idx])[:, 0] - yt[idx]) / yt[idx]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model


def train_reward_model(cfg, st: HarmonySettings):
    """``(torch model, {"train_rel_error", "heldout_rel_error", "heldout_rel_error_p90", ...})``:
    fitted on placements of random / LB / Tetris logged on ``st.rm_traces`` training traces,
    measured on the same schedulers' placements on ``st.rm_val_traces`` validation traces."""
    from dl2ray import seeds
    from dl2ray.harmony.linear import FIT_SCHEDULERS, log_placements
    from dl2ray.harmony.nets import max_nodes

    train = log_placements(cfg, FIT_SCHEDULERS, seeds.training(st.rm_traces))
    held = log_placements(cfg, FIT_SCHEDULERS, seeds.validation(st.rm_val_traces))
    assert train.features is not None and held.features is not None
    model = fit_reward_model(train.features, train.speed, len(cfg.catalogue), max_nodes(cfg), st)
    tr = relative_errors(model, train.features, train.speed)
    he = relative_errors(model, held.features, held.speed)
    return model, {
        "train_rel_error": float(tr.mean()),
        "heldout_rel_error": float(he.mean()),
        "heldout_rel_error_p90": float(np.quantile(he, 0.9)),
        "samples": len(train),
        "heldout_samples": len(held),
        "train_seeds": seeds.training(st.rm_traces),
        "heldout_seeds": seeds.validation(st.rm_val_traces),
    }


class ACLearner:
    """Actor-critic with masks, entropy, ε-greedy toward LB / bin-packing and a FIFO replay."""

    def __init__(self, cfg, st: HarmonySettings) -> None:
        import torch

        from dl2ray.harmony.nets import build_actor_critic
        from dl2ray.harmony.policy import dims

        self.torch, self.st = torch, st
        self.m, L = int(cfg.cluster.capacity.shape[0]), len(cfg.catalogue)
        self.sd, self.jd, self.dim = dims(self.m, L)
        self.net = build_actor_critic(self.m, self.sd, self.jd, seed=st.seed)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=st.lr)
        self.rng = np.random.default_rng([st.seed, 0x4A12])
        self.eps = 0.0 if st.ablation == "no-explore" else st.eps_start
        n, a = st.replay, 2 * self.m
        self.S, self.M = np.zeros((n, self.dim), np.float32), np.zeros((n, a), bool)
        self.A, self.R, self.MU = np.zeros(n, np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32)
        self.size = self.next = 0
        self.open: dict[int, list[tuple]] = {}
        self.cur: list[tuple] = []
        self.fresh: list[int] = []

    def probs(self, s: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            logits = self.net(self.torch.from_numpy(s[None]))[0][0].numpy().astype(np.float64)
        z = np.where(mask, logits, -np.inf)
        p = np.exp(z - z.max())
        return p / p.sum()

    def choose(self, s, mask, hint) -> int:
        pi = self.probs(s, mask)
        mu = (1 - self.eps) * pi
        mu[hint[0]] += self.eps / 2
        mu[hint[1]] += self.eps / 2
        a = int(self.rng.choice(len(mu), p=mu / mu.sum()))
        self.cur.append((s, mask, a, float(mu[a] / mu.sum())))
        return a

    def record(self, s, mask, a) -> None:
        pass  # the steps are kept by choose(); finish() closes them

    def finish(self, job_id: int, reward: float | None) -> None:
        """The placed job's steps: store them with ``reward`` (None: the reward comes later)."""
        steps, self.cur = self.cur, []
        if reward is None:
            self.open[job_id] = steps
        else:
            self._store(steps, reward)

    def resolve(self, job_id: int, reward: float) -> None:
        steps = self.open.pop(job_id, None)
        if steps:
            self._store(steps, reward)

    def drop_open(self) -> None:
        self.cur = []

    def _store(self, steps, reward: float) -> None:
        for s, m, a, mu in steps:
            i = self.next
            self.S[i], self.M[i], self.A[i], self.R[i], self.MU[i] = s, m, a, reward, mu
            self.fresh.append(i)
            self.next = (i + 1) % self.st.replay
            self.size = min(self.size + 1, self.st.replay)

    def update(self) -> dict:
        torch, st = self.torch, self.st
        fresh_only = st.ablation == "no-replay"
        pool = np.array(self.fresh, dtype=np.int64) if fresh_only else np.arange(self.size)
        if len(pool) == 0:
            return {}
        out = {}
        for _ in range(st.updates_per_episode):
            idx = pool[self.rng.integers(0, len(pool), size=min(st.batch, len(pool)))]
            s, m = torch.from_numpy(self.S[idx]), torch.from_numpy(self.M[idx])
            a, r = torch.from_numpy(self.A[idx]), torch.from_numpy(self.R[idx])
            logits, v = self.net(s)
            logits = logits.masked_fill(~m, -1e9)
            logp_all = torch.log_softmax(logits, 1)
            logp = logp_all.gather(1, a[:, None])[:, 0]
            rho = torch.clamp(torch.exp(logp.detach()) / torch.from_numpy(self.MU[idx]), max=1.0)
            adv = (r - v).detach()
            if st.adv_norm:  # returns differ by ~0.1 between placements: rescale so β_H means the same
                adv = (adv - adv.mean()) / (adv.std() + 1e-6)
            ent = -(torch.exp(logp_all) * logp_all.masked_fill(~m, 0.0)).sum(1)
            loss = -(rho * adv * logp).mean() + 0.5 * ((r - v) ** 2).mean() - st.entropy * ent.mean()
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 5.0)
            self.opt.step()
            out = {
                "loss": loss.item(),
                "entropy": ent.mean().item(),
                "value_err": ((r - v) ** 2).mean().item(),
            }
        self.fresh = []
        return out

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in self.net.state_dict().items()}


def run_training_episode(cfg, learner: ACLearner, predict, seed: int) -> int:
    """One training trace; returns the number of placed jobs."""
    from dl2ray.harmony.nets import max_nodes
    from dl2ray.harmony.policy import HarmonyScheduler
    from dl2ray.speed import spread_layout
    from dl2ray.world import build_simulator

    no_rm = learner.st.ablation == "no-rm"
    placed: list[int] = []

    def finish(job_id: int, reward: float) -> None:
        placed.append(job_id)
        learner.finish(job_id, None if no_rm else reward)

    sched = HarmonyScheduler(
        learner.choose, predict, finish=finish, rollback=learner.drop_open, max_nodes=max_nodes(cfg)
    )
    sim = build_simulator(cfg)
    view = sim.reset(seed)
    while not sim.done:
        alloc = sched.decide(view)
        learner.drop_open()
        step = sim.step(alloc)
        if no_rm:
            for j in list(learner.open):
                job = sim.jobs.get(j) or sim.finished[j]
                obs = job.history[-1]
                spread = sim.speed.epochs_per_second(job.type_index, spread_layout(obs.workers, obs.ps))
                learner.resolve(j, obs.epochs / max(obs.seconds, 1e-9) / spread)
        view = step.view
    return len(placed)


def evaluate(cfg, learner: ACLearner, seeds) -> float:
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.harmony.nets import NumpyPolicy
    from dl2ray.harmony.policy import HarmonyScheduler
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    net = NumpyPolicy(learner.m, learner.sd, learner.weights())
    sched = HarmonyScheduler(lambda s, mk, h: net.greedy(s, mk))
    return float(np.mean([censored_avg_jct(run_episode(build_simulator(cfg), sched, s)) for s in seeds]))


def warm_start(cfg, st: HarmonySettings, learner: ACLearner, predict, train_seeds: list[int]) -> dict:
    """Imitate the baseline ``st.warm_start`` (:mod:`dl2ray.harmony.imitate`) on ``train_seeds``;
    accuracy on one validation trace not used for model selection."""
    from dl2ray import seeds
    from dl2ray.harmony.imitate import REPLAYED, accuracy, collect, imitate, teacher_choose

    teacher = st.warm_start if st.warm_start in REPLAYED else teacher_choose(st.warm_start, cfg)
    data = collect(cfg, teacher, predict, train_seeds)
    held = collect(cfg, teacher, predict, seeds.validation(1, offset=st.rm_val_traces + st.val_traces))
    imitate(learner.net, data, st.imitation_steps, st.batch, st.imitation_lr, st.seed)
    return {
        "teacher": st.warm_start,
        "steps": len(data[2]),
        "train_accuracy": accuracy(learner.net, data),
        "heldout_accuracy": accuracy(learner.net, held),
        "train_seeds": train_seeds,
    }


def reuse_reward_model(path):
    """The reward model (torch) and its report from an earlier ``dl2ray train harmony`` checkpoint."""
    import torch

    from dl2ray.errors import UserError
    from dl2ray.harmony.nets import build_reward_model

    ck = torch.load(path, map_location="cpu", weights_only=True)
    if "node.0.weight" not in ck["rm"]:
        raise UserError(f"--reward-model: {path}: an older reward-model format; train a new one")
    node_in, base_in = ck["rm"]["node.0.weight"].shape[1], ck["rm"]["base.0.weight"].shape[1]
    types = round(np.sqrt(1 + node_in)) - 1
    model = build_reward_model(types, (base_in - types - 2) // 2)
    model.load_state_dict(ck["rm"])
    return model, {**ck["record"]["reward_model"], "reused_from": str(path)}


def train(cfg, st: HarmonySettings, out_path, on_row=None, rm_from=None) -> dict:
    """Reward model (or ``rm_from``'s), then actor-critic; writes the best-on-validation checkpoint."""
    import torch

    from dl2ray import seeds
    from dl2ray.harmony.nets import numpy_reward_model, save_checkpoint

    torch.set_num_threads(1)
    t0 = time.time()
    if rm_from is not None:
        rm, rm_report = reuse_reward_model(rm_from)
    else:
        rm, rm_report = train_reward_model(cfg, st)
        rm_report["seconds"] = time.time() - t0
    if on_row:
        on_row({"reward_model": rm_report})
    predict = numpy_reward_model({k: v.detach().numpy() for k, v in rm.state_dict().items()})
    learner = ACLearner(cfg, st)
    val = seeds.validation(st.val_traces, offset=st.rm_val_traces)
    best, rows = float("inf"), []
    record: dict = {"reward_model": rm_report, "settings": st.__dict__, "val_seeds": val, "config": cfg.name}
    if st.warm_start != "none":
        teach = seeds.training(st.imitation_traces, st.rm_traces + st.episodes)
        row = warm_start(cfg, st, learner, predict, teach)
        row["val_jct"] = best = evaluate(cfg, learner, val)
        row["seconds"] = time.time() - t0
        record.update({"imitation": row, "episode": -1, "val_jct": best})
        save_checkpoint(out_path, learner.m, len(cfg.catalogue), rm, learner.net, record)
        if on_row:
            on_row({"imitation": row})
    for ep in range(st.episodes):
        if st.ablation != "no-explore":
            learner.eps = st.eps_start + (st.eps_end - st.eps_start) * ep / max(1, st.episodes - 1)
        placed = run_training_episode(cfg, learner, predict, seeds.training(1, st.rm_traces + ep)[0])
        row = {
            "episode": ep,
            "eps": learner.eps,
            "placed": placed,
            **learner.update(),
            "seconds": time.time() - t0,
        }
        if (ep + 1) % st.eval_every == 0 or ep == st.episodes - 1:
            row["val_jct"] = evaluate(cfg, learner, val)
            if row["val_jct"] < best:
                best = row["val_jct"]
                record.update({"episode": ep, "val_jct": best})
                save_checkpoint(out_path, learner.m, len(cfg.catalogue), rm, learner.net, record)
        rows.append(row)
        if on_row:
            on_row(row)
    record["rows"] = rows
    return record
