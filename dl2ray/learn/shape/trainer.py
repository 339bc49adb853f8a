"""The shape policy's RL trainer: :mod:`dl2ray.learn.shape.counterfactual` (or, ``--algo pg``, the on-policy
:mod:`dl2ray.learn.shape.pg`; ``--algo mix``, both in one update, :mod:`dl2ray.learn.shape.mix`)
behind the :class:`~dl2ray.learn.records.Learner` interface that
:func:`~dl2ray.learn.train.train_rl` drives.

``dl2ray train rl --algo counterfactual`` (and ``experiment ablation --rl-opt
algo=counterfactual``): the same files (``OUT.pt``, ``OUT.best.pt``,
``OUT.json``, TensorBoard), validation, best-checkpoint selection and resume
as the paper's trainer. The network starts from ``--init`` (a shape
checkpoint, e.g. from ``train sl --arch shape``) or from scratch
(``policy.shape``'s widths, seeded by ``seed``).

Each update is a :class:`~dl2ray.learn.records.CounterfactualRow`: ``policy_loss`` the
improvement loss, ``kl`` the KL of the update's target (nats; there is no
critic), ``entropy`` the tried jobs' mean policy entropy, ``reward`` the
mean slot reward (−jobs in the system) of the greedy training episodes,
``mean_gain`` the mean over tries of the best row's gain over the greedy
row (job-slots), ``tries``, ``slots`` and ``rollouts`` simulated. (Runs
written before the two record types were told apart hold these in an
``UpdateRow``'s fields: ``value_loss`` the KL, ``mean_value`` the gain.)

Random streams: network initialisation (from scratch) from ``seed``; the tried
jobs and rows from a generator seeded by ``[seed, 1]``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from dl2ray.config import ExperimentConfig
from dl2ray.envs.cluster_env import ClusterEnvironment, learning_environment
from dl2ray.learn import seeds as seedsets
from dl2ray.learn.records import (
    CounterfactualRow,
    MixRow,
    PolicyGradientRow,
    RLOptions,
    RLResult,
    ValidationRow,
    algorithm,
    restore_result,
    result_doc,
    rng_state,
)
from dl2ray.learn.shape.counterfactual import Collected, improve_policy
from dl2ray.learn.shape.mix import mix_update
from dl2ray.learn.shape.pg import (
    EnvironmentOf,
    OnPolicyCollector,
    build_job_value,
    entropy_bonus,
    environments,
    pg_update,
)
from dl2ray.learn.shape.twin import TwinExperience
from dl2ray.learn.validation import read_traces, validation_row
from dl2ray.policy.network import CheckpointError
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import (
    NumpyShapePolicy,
    ShapePolicyNet,
    build_shape_policy,
    load_shape_checkpoint,
    save_shape_checkpoint,
)


def counterfactual_update(net: ShapePolicyNet, opt: torch.optim.Optimizer, data: Collected,
                          cfg: ExperimentConfig, control: np.random.Generator | None,
                          update: int = -1) -> CounterfactualRow:
    """The KL-limited improvement of ``net`` on ``data``'s tries with ``cfg.policy.shape``'s settings
    (``control``: the zero-advantage control's generator); the update's record, numbered ``update``."""
    s = cfg.policy.shape
    st = improve_policy(net, opt, data, s.epochs, s.kl, s.entropy_weight, control, s.trust)
    return CounterfactualRow(update, st.loss, st.kl, st.entropy, data.reward, st.mean_gain,
                             len(data.tries), len(data.slots), data.rollouts)


class ShapeTrainer:
    """The state of one counterfactual run: network, optimiser, collector, generator, history."""

    def __init__(self, cfg: ExperimentConfig, init: Path | None, seed: int, opts: RLOptions,
                 val_cfg: ExperimentConfig | None = None) -> None:
        self.cfg, self.opts, self.seed = cfg, opts, seed
        self.val_cfg = val_cfg or cfg
        self.enc = ShapeEncoding.from_config(cfg)
        s = cfg.policy.shape
        if init is None:
            self.policy = build_shape_policy(self.enc, s.embed, s.head, seed)
        else:
            self.policy = load_shape_checkpoint(init, expect=self.enc, decoding="config").policy
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=s.lr)
        self.sample_rng = np.random.default_rng([seed, 1])
        self.algorithm = algorithm(opts.algo)
        self.train_traces = read_traces(cfg, opts.train_files)  # None: generated (make_trainer checks)
        self.val_traces = read_traces(cfg, opts.val_files)
        # the twin: where the tries of a counterfactual learner run, and an on-policy learner's in twin mode
        # (an online pg learner has none: it plays on its own cluster alone)
        self.experience: TwinExperience | None = None
        if self.algorithm.counterfactual or cfg.policy.experience == "twin":
            self.experience = TwinExperience(cfg, seedsets.training(opts.traces), self.sample_rng, opts.twin)
        self.pg: OnPolicyCollector | None = None
        if self.algorithm.on_policy:  # on-policy per-job policy gradient, own baseline
            self.pg = OnPolicyCollector(self._on_policy_environments(), self.enc, self.sample_rng,
                                        opts.credit, explore=opts.exploration, discount=s.credit_discount)
            self.value = build_job_value(self.enc, s.head, seed)
            self.value_opt = torch.optim.Adam(self.value.parameters(), lr=s.lr)
        self.updates = 0
        self.val_seeds = seedsets.validation(opts.val_traces)
        self.result = RLResult(seed, str(init) if init else None, 0, self.val_seeds, float("nan"))

    def _on_policy_environments(self) -> EnvironmentOf:
        """``policy.experience: cluster``: the learner's own cluster (online); ``twin``: the twin's simulators
        (pg plays on the collector's; mix needs its own beside the tries')."""
        if self.cfg.policy.experience == "cluster":
            return environments([learning_environment(self.cfg, seedsets.training(self.opts.traces),
                                                      traces=self.train_traces)])
        assert self.experience is not None
        collector = self.experience.collector
        sims = self.experience.simulators() if self.algorithm.counterfactual else collector.sims
        return environments([ClusterEnvironment(sim, collector.source) for sim in sims])

    @property
    def episodes(self) -> int:
        if self.pg is not None and not self.algorithm.counterfactual:
            return self.pg.episodes
        assert self.experience is not None
        return self.experience.collector.episodes

    def update(self) -> CounterfactualRow | PolicyGradientRow | MixRow:
        """Collect one update's experience (greedy episodes and counterfactual rollouts; ``pg``: episodes
        of the sampled policy; ``mix``: both), then improve."""
        policy = NumpyShapePolicy(self.policy)
        self.updates += 1
        row: CounterfactualRow | PolicyGradientRow | MixRow
        control = self.sample_rng if self.opts.zero_advantage else None
        if self.pg is not None and self.algorithm.counterfactual:
            assert self.experience is not None
            tries = self.experience.collect(policy)
            played = self.pg.collect(policy, self.cfg.policy.shape.envs)
            row = mix_update(self.policy, self.value, self.opt, self.value_opt, tries, played,
                             self.cfg.policy.shape, self.opts.mix_weight, self.updates, control)
        elif self.pg is not None:
            if self.experience is not None:
                self.experience.observe_if_due(policy)
            s = self.cfg.policy.shape
            played = self.pg.collect(policy, s.envs)
            beta = entropy_bonus(s, self.updates - 1, self.opts.exploration)
            row = pg_update(self.policy, self.value, self.opt, self.value_opt, played, s.epochs, s.trust,
                            beta, self.updates, control, self.opts.critic)
        else:
            assert self.experience is not None
            data = self.experience.collect(policy)
            row = counterfactual_update(self.policy, self.opt, data, self.cfg, control, self.updates)
        self.result.history.append(row)
        self.result.updates = self.updates
        return row

    def validate(self) -> ValidationRow:
        return validation_row(self)

    def save(self, path: Path) -> None:
        extra = {"kind": "rl", "seed": self.seed, "updates": self.updates,
                 "optimizer": self.opt.state_dict(), "episodes": self.episodes, "options": asdict(self.opts),
                 "rng": {"sample_rng": rng_state(self.sample_rng)}, "result": result_doc(self.result)}
        if self.pg is not None:  # the baseline is the learner's own: kept for resuming, never shipped
            extra["value"] = {"net": self.value.state_dict(), "optimizer": self.value_opt.state_dict()}
            extra["pg_episodes"] = self.pg.episodes
        save_shape_checkpoint(path, self.policy, self.cfg.catalogue.names, extra=extra)

    def rewind(self, path: Path) -> None:
        """Go back to the learning state a checkpoint :meth:`save` wrote — weights, optimiser, baseline —
        and keep everything else (updates, episodes, the sampling generator, the history): the run
        continues from the best checkpoint with new stretches (``policy.shape.rollback``)."""
        ckpt = load_shape_checkpoint(path, expect=self.enc)
        self.policy.load_state_dict(ckpt.policy.state_dict())
        self.opt.load_state_dict(ckpt.extra["optimizer"])
        if self.pg is not None:
            self.value.load_state_dict(ckpt.extra["value"]["net"])
            self.value_opt.load_state_dict(ckpt.extra["value"]["optimizer"])

    def restore(self, path: Path) -> None:
        """Continue from a checkpoint :meth:`save` wrote (the episodes in progress restart)."""
        ckpt = load_shape_checkpoint(path, expect=self.enc)
        ex = ckpt.extra
        if ex.get("kind") != "rl":
            raise CheckpointError(f"{path}: not an RL checkpoint; cannot resume from it")
        self.policy.load_state_dict(ckpt.policy.state_dict())
        self.opt.load_state_dict(ex["optimizer"])
        self.updates = int(ex["updates"])
        if self.experience is not None:
            self.experience.collector.episodes = int(ex["episodes"])
        if self.pg is not None:
            self.pg.episodes = int(ex.get("pg_episodes", ex["episodes"]))
            if "value" not in ex:
                raise CheckpointError(f"{path}: no value baseline in it: not a --algo {self.opts.algo} run")
            self.value.load_state_dict(ex["value"]["net"])
            self.value_opt.load_state_dict(ex["value"]["optimizer"])
        self.sample_rng.bit_generator.state = ex["rng"]["sample_rng"]
        restore_result(self.result, ex["result"], self.updates)
