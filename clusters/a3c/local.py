"""What one cluster's learner computes between two pushes, for either architecture: :class:`LocalLearner`.

Every distributed learner (the A3C agents, the federation's members) holds a local copy of the
networks, takes weights from its master, computes one push from its own cluster's experience and
sends it. The two ways of computing a push:

- :class:`ActorCriticStep` (``paper``): ``steps_per_update`` decision steps with the sampled
  policy on the agent's own simulated cluster, the actor-critic gradient of the paper
  (:func:`~dl2ray.learn.actor_critic.compute_gradients`); the push is that gradient;
- :class:`CounterfactualStep` (``shape``): one update's tries in the agent's twin
  (:class:`~dl2ray.learn.shape.twin.TwinExperience`), the KL-limited improvement of the local copy
  with its own Adam (:func:`~dl2ray.learn.shape.trainer.counterfactual_update`); the push is the
  pseudo-gradient ``θ_taken − θ_improved`` (applied by :class:`~clusters.a3c.weights.OuterStep`).

:func:`local_learner` picks one by ``cfg.policy.arch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from clusters.a3c.weights import fresh_networks, load_vector, num_params, params_vector
from dl2ray.config import ExperimentConfig
from dl2ray.envs.cluster_env import learning_environment
from dl2ray.learn.actor_critic import LossConfig, compute_gradients, flatten
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.records import UpdateRecord, UpdateRow
from dl2ray.learn.rollout import Collector, to_batch
from dl2ray.learn.shape.pg import OnPolicyCollector, build_job_value, entropy_bonus, environments, pg_update
from dl2ray.learn.shape.trainer import counterfactual_update
from dl2ray.learn.shape.twin import TwinExperience
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import NumpyShapePolicy


@dataclass(frozen=True)
class LocalSettings:
    """A local learner's switches (from :class:`~clusters.a3c.global_policy.A3COptions` or a federation
    file's ``learning``)."""

    steps_per_update: int | None = None  # paper: decision steps per gradient; None: policy.minibatch
    critic: bool = True  # paper: False = REINFORCE over whole episodes; pg: no value baseline
    exploration: bool = True  # paper: job-aware exploration; pg: sampled rows and the entropy bonus
    twin: str = "config"  # shape: where the tries are simulated (dl2ray.learn.shape.twin)
    twin_window: int = 8
    observe_every: int = 1
    zero_advantage: bool = False  # shape: the control (advantages shuffled)
    own_cluster: bool = True  # shape, observed twin: run episodes of its simulated cluster (False: a live
    # learner adds what its live cluster showed to ``experience.twin`` itself)
    algo: str = "counterfactual"  # shape: counterfactual (tries in the twin) or pg (online, on-policy)
    credit: str = "job"  # shape, pg: a job choice's return (dl2ray.learn.shape.pg)
    share_baseline: bool = False  # shape, pg: the value baseline travels with the policy (the master's)


@dataclass
class Push:
    """One push: ``grad`` (flat float32: a gradient, or a pseudo-gradient for the shape policy), its
    record, and the experience behind it (slots of the cluster or the twin, decision steps or tries)."""

    grad: np.ndarray
    row: UpdateRecord
    slots: int
    steps: int


class LocalLearner(Protocol):
    """The local side of a distributed learner (module docstring): ``policy`` and ``value`` (None for the
    shape policy) are its local networks."""

    @property
    def policy(self) -> nn.Module: ...

    @property
    def value(self) -> nn.Module | None: ...

    def take(self, weights: np.ndarray) -> None:
        """Load the master's weights (a flat vector, :func:`~clusters.a3c.weights.params_vector`)."""
        ...

    def compute(self, version: int) -> Push:
        """One push from this cluster's experience with the weights taken (of update ``version``)."""
        ...

    def stats(self) -> dict[str, Any]:
        """What it saw of its own cluster (shape, observed twin: ``cluster_jct`` per episode)."""
        ...


class ActorCriticStep:
    """The paper's networks: on-policy steps of the sampled policy, the actor-critic gradient."""

    def __init__(self, cfg: ExperimentConfig, traces: list[int], seed: int, streams: list[int],
                 settings: LocalSettings) -> None:
        self.cfg, self.settings = cfg, settings
        self.enc = Encoding.from_config(cfg)
        self.policy, self.value = fresh_networks(cfg, seed)
        self.loss_cfg = LossConfig.from_config(cfg, critic=settings.critic)
        explore = JobAwareExploration.from_config(cfg) if settings.exploration else None
        self.collector = Collector(learning_environment(cfg, traces), self.enc,
                                   np.random.default_rng([seed, 1, *streams]), explore,
                                   np.random.default_rng([seed, 2, *streams]))
        self.steps = settings.steps_per_update or cfg.policy.minibatch
        self.numpy: NumpyPolicy | None = None

    def take(self, weights: np.ndarray) -> None:
        load_vector(self.policy, self.value, weights)
        self.numpy = NumpyPolicy.from_torch(self.policy)  # type: ignore[arg-type]

    def compute(self, version: int) -> Push:
        assert self.numpy is not None, "take weights before computing a push"
        records = self.collector.collect(self.numpy, self.steps, whole_episodes=not self.loss_cfg.critic)
        batch = to_batch(records, self.enc, self.loss_cfg.gamma)
        # The entropy weight may decay with the global update count: that of the weights in use.
        loss_cfg = LossConfig.from_config(self.cfg, self.settings.critic, max(version, 0))
        grads, st = compute_gradients(self.policy, self.value, batch, loss_cfg)  # type: ignore[arg-type]
        row = UpdateRow(-1, st.policy_loss, st.value_loss, st.entropy,
                        float(np.mean([r.reward for r in records])), st.mean_value, len(batch),
                        len(records), sum(r.explored for r in records))
        return Push(flatten(grads), row, len(records), len(batch))

    def stats(self) -> dict[str, Any]:
        return {}


class CounterfactualStep:
    """The shape policy: tries in the twin, the KL-limited improvement, the pseudo-gradient."""

    value = None

    def __init__(self, cfg: ExperimentConfig, traces: list[int], seed: int, streams: list[int],
                 settings: LocalSettings, salt: int = 0) -> None:
        self.cfg, self.settings = cfg, settings
        self.policy, _ = fresh_networks(cfg, seed)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.policy.shape.lr)
        self.rng = np.random.default_rng([seed, 1, *streams])
        self.experience = TwinExperience(cfg, traces, self.rng, settings.twin, settings.twin_window,
                                         settings.observe_every, salt, settings.own_cluster)

    def take(self, weights: np.ndarray) -> None:
        load_vector(self.policy, None, weights)

    def compute(self, version: int) -> Push:
        theta = params_vector(self.policy, None)
        data = self.experience.collect(NumpyShapePolicy(self.policy))  # type: ignore[arg-type]
        row = counterfactual_update(self.policy, self.opt, data, self.cfg,  # type: ignore[arg-type]
                                    self.rng if self.settings.zero_advantage else None)
        return Push(theta - params_vector(self.policy, None), row, len(data.slots), len(data.tries))

    def stats(self) -> dict[str, Any]:
        twin = self.experience.twin
        return {"cluster_jct": list(self.experience.cluster_jct), "observed": twin.observed if twin else 0}


class OnPolicyStep:
    """The shape policy learning online: whole stretches of the sampled policy on the agent's own cluster
    through the environment interface (:class:`~dl2ray.learn.shape.pg.OnPolicyCollector`), the clipped
    on-policy update of the local copy against its value baseline; the push is the pseudo-gradient
    ``θ_taken − θ_improved``, as :class:`CounterfactualStep`'s.

    The baseline is the agent's own (kept, never pushed) unless ``settings.share_baseline``: then it is
    the master's, as the paper's A3C shares its critic. The weights the agent takes and the push it sends
    are then ``[policy ; baseline]`` (lengths ``n_policy`` and ``n_baseline``), the push's baseline part
    ``β_taken − β_fitted`` (the update's fit of the baseline to this agent's experience); only the Adam
    moments of the baseline's fit stay local."""

    value = None  # the master's second network is never a critic of the paper's kind

    def __init__(self, cfg: ExperimentConfig, traces: list[int], seed: int, streams: list[int],
                 settings: LocalSettings) -> None:
        self.cfg, self.settings = cfg, settings
        s = cfg.policy.shape
        self.policy, _ = fresh_networks(cfg, seed)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=s.lr)
        self.rng = np.random.default_rng([seed, 1, *streams])
        enc = ShapeEncoding.from_config(cfg)
        self.collector = OnPolicyCollector(environments([learning_environment(cfg, traces)]), enc, self.rng,
                                           settings.credit,  # type: ignore[arg-type]
                                           explore=settings.exploration, discount=s.credit_discount)
        self.baseline = build_job_value(enc, s.head, seed)
        self.baseline_opt = torch.optim.Adam(self.baseline.parameters(), lr=s.lr)
        self.shared = self.baseline if settings.share_baseline else None  # what travels after the policy

    def take(self, weights: np.ndarray) -> None:
        """The policy's weights (``[policy ; baseline]`` with a shared baseline)."""
        if self.shared is not None and weights.shape != (expected := num_params(self.policy, self.shared),):
            raise ValueError(f"weights of {weights.shape[0]} values for a policy and a shared baseline of "
                             f"{expected}")
        load_vector(self.policy, self.shared, weights)

    def _vector(self) -> np.ndarray:
        """What travels: the policy's parameters, then the baseline's when it is shared."""
        return params_vector(self.policy, self.shared)

    def compute(self, version: int) -> Push:
        theta = self._vector()
        s = self.cfg.policy.shape
        played = self.collector.collect(NumpyShapePolicy(self.policy), s.envs)  # type: ignore[arg-type]
        beta = entropy_bonus(s, version, self.settings.exploration)  # by the global update; Table 2's switch
        row = pg_update(self.policy, self.baseline, self.opt, self.baseline_opt,  # type: ignore[arg-type]
                        played, s.epochs, s.trust, beta,  # (as in ShapeTrainer)
                        control=self.rng if self.settings.zero_advantage else None,
                        critic=self.settings.critic)
        decisions = sum(len(x.actions) for x in played.slots)
        return Push(theta - self._vector(), row, len(played.slots), decisions)

    def stats(self) -> dict[str, Any]:
        return {"stretches": self.collector.episodes}


def local_learner(cfg: ExperimentConfig, traces: list[int], seed: int, streams: list[int],
                  settings: LocalSettings, salt: int = 0) -> LocalLearner:
    """The local learner of ``cfg.policy.arch``. ``streams``: what separates this learner's random
    draws from its siblings' (``[agent, incarnation]``); ``salt``: its twin's seeds."""
    if cfg.policy.arch == "shape" and settings.algo == "pg":
        return OnPolicyStep(cfg, traces, seed, streams, settings)
    if cfg.policy.arch == "shape":
        return CounterfactualStep(cfg, traces, seed, streams, settings, salt)
    return ActorCriticStep(cfg, traces, seed, streams, settings)
