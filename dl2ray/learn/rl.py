"""Single-process online actor-critic training of the DL2 policy.

One update:

1. **Collect** (:class:`~dl2ray.learn.rollout.Collector`): with the current
   policy (numpy copy), sampled actions and job-aware exploration, run slots
   of the training traces until at least ``steps_per_update`` new inference
   steps (``policy.minibatch`` by default) are recorded — whole episodes
   without a critic, whose Monte-Carlo returns need an episode's end.
2. **Replay** (:class:`~dl2ray.learn.replay.ReplayBuffer`): add the new steps,
   draw a minibatch of ``policy.minibatch`` (uniform or prioritised). Without
   replay, the minibatch is exactly the new steps (on-policy).
3. **Learn** (:mod:`dl2ray.learn.actor_critic`): gradients of the policy loss
   (TD advantage, entropy bonus) and the value loss; one Adam step each.
   For the first ``critic_warmup`` updates only the value network steps.

Every ``val_every`` updates (and before the first and after the last), the
greedy policy's average JCT on ``val_traces`` validation traces is measured
(:mod:`dl2ray.seeds`); the best one is kept in ``OUT.best.pt``. Every
``checkpoint_every`` updates ``OUT`` is written with both networks, the
optimiser state, the update and episode counts, the generators' states and the
history, so ``resume=True`` continues from it (the replay buffer and the
episode in progress are not saved: a resumed run refills the buffer and starts
the next trace). ``OUT.json`` holds the config, seed, options and history;
TensorBoard scalars go to ``logdir``.

Random streams: network initialisation (when not from ``init``) from
``seed``; action sampling, exploration and replay from three generators
seeded by ``[seed, 1]``, ``[seed, 2]``, ``[seed, 3]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.learn.actor_critic import ActorCriticOptimizer, LossConfig, compute_gradients
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.improve import ImitationBuffer, ImprovementCollector, imitation_update
from dl2ray.learn.records import (
    ALGOS,
    SHAPE_ALGOS,
    RLOptions,
    RLResult,
    UpdateRecord,
    UpdateRow,
    ValidationRow,
    restore_result,
    result_doc,
    rng_state,
    scalars,
)
from dl2ray.learn.replay import ReplayBuffer
from dl2ray.learn.rollout import Collector, to_batch
from dl2ray.learn.shape_search import ShapeSearchCollector
from dl2ray.learn.validation import heuristic_jct, validate
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import (
    CheckpointError,
    NumpyPolicy,
    PolicyNet,
    ValueNet,
    build_networks,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [  # the records and the validation live in their own modules; re-exported here for callers
    "ALGOS", "SHAPE_ALGOS", "RLOptions", "RLResult", "Trainer", "UpdateRecord", "UpdateRow", "ValidationRow",
    "heuristic_jct", "make_trainer", "train_rl", "validate", "write_run_json",
]


class Trainer:
    """The state of one run: networks, optimiser, collector, buffer, generators, history."""

    def __init__(self, cfg: ExperimentConfig, init: Path | None, seed: int, opts: RLOptions,
                 policy: PolicyNet | None = None, value: ValueNet | None = None,
                 val_cfg: ExperimentConfig | None = None) -> None:
        from dl2ray.world import build_simulator

        self.cfg, self.opts, self.seed = cfg, opts, seed
        self.val_cfg = val_cfg or cfg  # validation simulator; another one for OfflineRL
        self.enc = Encoding.from_config(cfg)
        if policy is None or value is None:
            policy, value = self._networks(init)
        self.policy, self.value = policy, value
        self.loss_cfg = LossConfig.from_config(cfg, critic=opts.critic, zero_advantage=opts.zero_advantage)
        self.opt = ActorCriticOptimizer(policy, value, cfg.policy.rl_lr, opts.max_grad_norm)
        self.sample_rng = np.random.default_rng([seed, 1])
        self.explore_rng = np.random.default_rng([seed, 2])
        self.replay_rng = np.random.default_rng([seed, 3])
        if opts.algo not in ALGOS:
            raise ValueError(f"unknown RL algorithm {opts.algo!r}; known: {list(ALGOS)}")
        self.buffer: ReplayBuffer | None = None
        if opts.algo == "improve":
            imp = cfg.policy.improve
            self.opt = ActorCriticOptimizer(policy, value, imp.lr, opts.max_grad_norm)
            sims = [build_simulator(cfg, world=cfg.policy.train_world) for _ in range(imp.envs)]
            train_seeds = seedsets.training(opts.traces)
            select = "random" if opts.zero_advantage else "best"
            self.improver = (
                ShapeSearchCollector(sims, self.enc, train_seeds, self.sample_rng, imp.horizon, imp.reward,
                                     imp.gamma, select=select, rounds=imp.rounds,
                                     min_gain=imp.min_gain, futures=imp.futures)
                if imp.operator == "shape" else
                ImprovementCollector(sims, self.enc, train_seeds, imp.alternatives, self.sample_rng,
                                     imp.horizon, imp.reward, imp.gamma, temperature=imp.temperature,
                                     points=imp.points, select=select))
            self.labels = ImitationBuffer(imp.buffer, self.enc.state_dim, self.enc.action_dim)
        else:
            explore = JobAwareExploration.from_config(cfg) if opts.exploration else None
            self.collector = Collector(build_simulator(cfg, world=cfg.policy.train_world), self.enc,
                                       seedsets.training(opts.traces),
                                       self.sample_rng, explore, self.explore_rng)
            self.buffer = (ReplayBuffer(cfg.policy.replay_size, self.enc.state_dim, self.enc.action_dim,
                                        opts.prioritized) if opts.replay else None)
        self.val_seeds = seedsets.validation(opts.val_traces)
        self.result = RLResult(seed, str(init) if init else None, 0, self.val_seeds, float("nan"))

    def _networks(self, init: Path | None) -> tuple[PolicyNet, ValueNet]:
        if init is None:
            return build_networks(self.enc, self.cfg.policy.hidden, self.seed)
        ckpt = load_checkpoint(init, expect=self.enc, catalogue=self.cfg.catalogue.names)
        return ckpt.policy, ckpt.value

    @property
    def updates(self) -> int:
        return self.opt.updates

    @property
    def episodes(self) -> int:
        return (self.improver if self.opts.algo == "improve" else self.collector).episodes

    @episodes.setter
    def episodes(self, n: int) -> None:
        (self.improver if self.opts.algo == "improve" else self.collector).episodes = n

    def update(self) -> UpdateRow:
        """One update (see the module docstring): :meth:`_improve`, or collect, (replay), learn."""
        if self.opts.algo == "improve":
            return self._improve()
        p = self.cfg.policy
        fresh = self.opts.steps_per_update or p.minibatch
        records = self.collector.collect(NumpyPolicy.from_torch(self.policy), fresh,
                                         whole_episodes=not self.opts.critic)
        batch = to_batch(records, self.enc, p.gamma)
        weights, indices = None, None
        if self.buffer is not None:
            self.buffer.add(batch)
            drawn = self.buffer.sample(p.minibatch, self.replay_rng)
            batch, weights, indices = drawn.batch, drawn.weights, drawn.indices
        self.loss_cfg = LossConfig.from_config(self.cfg, self.opts.critic, self.updates,
                                               self.opts.zero_advantage)
        grads, stats = compute_gradients(self.policy, self.value, batch, self.loss_cfg, weights)
        self.opt.apply_gradients(grads, train_policy=self.updates >= self.opts.critic_warmup)
        if self.buffer is not None and indices is not None:
            self.buffer.update_priorities(indices, stats.priorities)
        row = UpdateRow(self.updates, stats.policy_loss, stats.value_loss, stats.entropy,
                        float(np.mean([r.reward for r in records])), stats.mean_value,
                        sum(len(r.steps) for r in records), len(records), sum(r.explored for r in records))
        self.result.history.append(row)
        self.result.updates = self.updates
        return row

    def _improve(self) -> UpdateRow:
        """Label ``improve.slots_per_update`` slots by rollouts, then imitation steps on the labels."""
        imp = self.cfg.policy.improve
        items = self.improver.collect(NumpyPolicy.from_torch(self.policy), imp.slots_per_update)
        self.labels.add(items)
        loss, entropy = 0.0, 0.0
        if len(self.labels):
            loss, entropy = imitation_update(self.policy, self.opt.policy_opt, self.labels, imp.batches,
                                             imp.batch_size, self.cfg.policy.sl_label_smoothing,
                                             self.replay_rng)
        self.opt.updates += 1
        gains = [it.gain for it in items if it.tried]
        row = UpdateRow(self.updates, loss, 0.0, entropy, float(np.mean(gains)) if gains else 0.0,
                        0.0, len(items), imp.slots_per_update, sum(it.chosen != 0 for it in items))
        self.result.history.append(row)
        self.result.updates = self.updates
        return row

    def validate(self) -> ValidationRow:
        row = ValidationRow(self.updates, validate(self.val_cfg, self.policy, self.val_seeds))
        self.result.validation.append(row)
        return row

    # -- checkpoints ---------------------------------------------------------------------

    def save(self, path: Path) -> None:
        extra = {
            "kind": "rl", "seed": self.seed, "updates": self.updates, "optimizer": self.opt.state_dict(),
            "episodes": self.episodes, "options": asdict(self.opts),
            "rng": {k: rng_state(getattr(self, k)) for k in ("sample_rng", "explore_rng", "replay_rng")},
            "result": result_doc(self.result),
        }
        save_checkpoint(path, self.policy, self.value, self.cfg.catalogue.names, extra=extra)

    def restore(self, path: Path) -> None:
        """Continue from a checkpoint :meth:`save` wrote (see the module docstring for what is lost)."""
        ckpt = load_checkpoint(path, expect=self.enc, catalogue=self.cfg.catalogue.names)
        ex = ckpt.extra
        if ex.get("kind") != "rl":
            raise ValueError(f"{path}: not an RL checkpoint; cannot resume from it")
        self.policy.load_state_dict(ckpt.policy.state_dict())
        self.value.load_state_dict(ckpt.value.state_dict())
        self.opt.load_state_dict(ex["optimizer"])
        self.episodes = int(ex["episodes"])
        for k, state in ex["rng"].items():
            getattr(self, k).bit_generator.state = state
        restore_result(self.result, ex["result"], self.updates)


def make_trainer(cfg: ExperimentConfig, init: Path | None, seed: int, opts: RLOptions,
                 val_cfg: ExperimentConfig | None = None):
    """The trainer of ``opts.algo``: :class:`Trainer` (paper, improve: the paper's architecture) or
    :class:`~dl2ray.learn.shape_rl.ShapeTrainer` (counterfactual: the shape architecture).
    Refuses an ``init`` checkpoint of the other architecture."""
    from dl2ray.policy.shape_net import checkpoint_arch

    arch = "shape" if opts.algo in SHAPE_ALGOS else "paper"
    if init is not None and checkpoint_arch(init) != arch:
        raise CheckpointError(f"{init}: a {checkpoint_arch(init)!r} checkpoint; --algo {opts.algo} trains "
                              f"the {arch!r} architecture (train sl --arch {arch})")
    if arch == "shape":
        from dl2ray.learn.shape_rl import ShapeTrainer

        return ShapeTrainer(cfg, init, seed, opts, val_cfg)
    return Trainer(cfg, init, seed, opts, val_cfg=val_cfg)


def train_rl(
    cfg: ExperimentConfig, init: Path | None, updates: int, seed: int, out: Path | None,
    options: RLOptions | None = None, logdir: Path | None = None, resume: bool = False,
    on_update: Callable[[UpdateRecord, ValidationRow | None], None] | None = None,
    val_cfg: ExperimentConfig | None = None,
) -> tuple[Trainer, RLResult]:
    """Train until ``updates`` updates in total; see the module docstring for files written.

    ``val_cfg``: validate (and measure DRF's baseline) in this config's simulator
    instead of ``cfg``'s — e.g. train on the analytic speed model, validate on
    the measured one (OfflineRL).
    """
    opts = options or RLOptions()
    trainer = make_trainer(cfg, init, seed, opts, val_cfg)
    if resume and out is not None and out.exists():
        trainer.restore(out)
    clock = time.perf_counter()

    def tick() -> None:
        nonlocal clock
        now = time.perf_counter()
        trainer.result.wall_seconds += now - clock
        clock = now

    writer = _writer(logdir)
    if not trainer.result.validation:
        trainer.result.baseline_avg_jct = heuristic_jct(trainer.val_cfg, "drf", trainer.val_seeds)
        _log_validation(writer, trainer.validate())
        tick()
        if out is not None:
            trainer.save(out.with_suffix(".best.pt"))
    best = trainer.result.best
    while trainer.updates < updates:
        row = trainer.update()
        _log_update(writer, row)
        val = None
        u = trainer.updates
        if u % opts.val_every == 0 or u == updates:
            val = trainer.validate()
            _log_validation(writer, val)
            tick()
            if out is not None and (best is None or val.avg_jct < best.avg_jct):
                trainer.save(out.with_suffix(".best.pt"))
            best = trainer.result.best
        if out is not None and (u % opts.checkpoint_every == 0 or u == updates):
            tick()
            trainer.save(out)
            write_run_json(out.with_suffix(".json"), cfg, trainer)
        if on_update:
            on_update(row, val)
    tick()
    if writer is not None:
        writer.close()
    return trainer, trainer.result


def write_run_json(path: Path, cfg: ExperimentConfig, trainer: Trainer) -> None:
    """The run's config, seed, options, seed sets and history, next to its checkpoint."""
    doc = {
        "kind": "rl",
        "seed": trainer.seed,
        "options": asdict(trainer.opts),
        "config": cfg.model_dump(mode="json"),
        "train_seeds": seedsets.training(trainer.opts.traces),
        **result_doc(trainer.result),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _log_update(writer, row: UpdateRecord) -> None:
    if writer is not None:
        for k, v in scalars(row).items():
            writer.add_scalar(f"rl/{k}", v, row.update)


def _log_validation(writer, row: ValidationRow) -> None:
    if writer is not None:
        writer.add_scalar("rl/val_avg_jct", row.avg_jct, row.update)


def _writer(logdir: Path | None):
    if logdir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(logdir))
