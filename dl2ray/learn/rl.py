"""The paper's trainer: online actor-critic training of the DL2 paper's policy (``--algo paper``), or
rollout policy improvement of it (``--algo improve``); :mod:`dl2ray.learn.train` drives it.

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

from dataclasses import asdict
from pathlib import Path

import numpy as np

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.envs.cluster_env import learning_environment
from dl2ray.learn.actor_critic import ActorCriticOptimizer, LossConfig, compute_gradients
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.improve import ImitationBuffer, ImprovementCollector, imitation_update
from dl2ray.learn.records import (
    RLOptions,
    RLResult,
    UpdateRow,
    ValidationRow,
    algorithm,
    restore_result,
    result_doc,
    rng_state,
)
from dl2ray.learn.replay import ReplayBuffer
from dl2ray.learn.rollout import Collector, to_batch
from dl2ray.learn.shape.search import ShapeSearchCollector
from dl2ray.learn.validation import read_traces, validation_row
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import (
    NumpyPolicy,
    PolicyNet,
    ValueNet,
    build_networks,
    load_checkpoint,
    save_checkpoint,
)


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
        self.algorithm = algorithm(opts.algo)
        self.buffer: ReplayBuffer | None = None
        if self.algorithm.rollout_labels:
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
            train = learning_environment(cfg, seedsets.training(opts.traces),
                                         traces=read_traces(cfg, opts.train_files))
            self.collector = Collector(train, self.enc,
                                       self.sample_rng, explore, self.explore_rng)
            self.buffer = (ReplayBuffer(cfg.policy.replay_size, self.enc.state_dim, self.enc.action_dim,
                                        opts.prioritized) if opts.replay else None)
        self.val_seeds = seedsets.validation(opts.val_traces)
        self.val_traces = read_traces(cfg, opts.val_files)
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
        return (self.improver if self.algorithm.rollout_labels else self.collector).episodes

    @episodes.setter
    def episodes(self, n: int) -> None:
        (self.improver if self.algorithm.rollout_labels else self.collector).episodes = n

    def update(self) -> UpdateRow:
        """One update (see the module docstring): :meth:`_improve`, or collect, (replay), learn."""
        if self.algorithm.rollout_labels:
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
        return validation_row(self)

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
