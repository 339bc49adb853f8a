"""The networks of A3C as one flat vector: what travels between the GlobalPolicy, its agents, the live
learner and a federation's members (gradients and weights alike), and how they are saved.

Two architectures travel the same way (``policy.arch``):

- ``paper``: the DL2 paper's policy and value networks; a push is their gradient, the master steps
  them with :class:`~dl2ray.learn.actor_critic.ActorCriticOptimizer` (two Adams);
- ``shape``: the shipped shape policy (one network, no critic); a push is the *pseudo-gradient*
  ``θ_pulled − θ_improved`` of the agent's KL-limited improvement
  (:class:`clusters.a3c.local.CounterfactualStep`), which the master applies with :class:`OuterStep`
  (``θ ← θ − g``, outer SGD with rate 1, as in federated averaging): with one agent and no lag the
  master's weights are exactly the agent's.

``value`` is ``None`` for the shape architecture wherever a ``(policy, value)`` pair is taken. The online
shape learner with a shared baseline (``A3COptions.share_baseline``) appends the baseline's parameters to
the policy's in what travels (:class:`clusters.a3c.local.OnPolicyStep`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dl2ray.config import ExperimentConfig
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import (
    ValueNet,
    build_networks,
    load_checkpoint,
    read_checkpoint_doc,
    save_checkpoint,
)
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import (
    build_shape_policy,
    checkpoint_arch,
    load_shape_checkpoint,
    save_shape_checkpoint,
)


def networks(cfg: ExperimentConfig, init: str | None, seed: int) -> tuple[nn.Module, ValueNet | None]:
    """``(policy, value)`` of ``cfg.policy.arch``: from the ``init`` checkpoint, else fresh from ``seed``
    (``value`` is None for the shape policy)."""
    if cfg.policy.arch == "shape":
        senc = ShapeEncoding.from_config(cfg)
        if init is None:
            s = cfg.policy.shape
            return build_shape_policy(senc, s.embed, s.head, seed), None
        return load_shape_checkpoint(init, expect=senc, decoding="config").policy, None
    enc = Encoding.from_config(cfg)
    if init is None:
        return build_networks(enc, cfg.policy.hidden, seed)
    ckpt = load_checkpoint(init, expect=enc, catalogue=cfg.catalogue.names)
    return ckpt.policy, ckpt.value


def fresh_networks(cfg: ExperimentConfig, seed: int = 0) -> tuple[nn.Module, ValueNet | None]:
    """Networks of ``cfg``'s architecture and widths (weights to be overwritten by :func:`load_vector`)."""
    return networks(cfg, None, seed)


def _params(policy: nn.Module, value: nn.Module | None) -> list[nn.Parameter]:
    return [*policy.parameters(), *(value.parameters() if value is not None else ())]


def params_vector(policy: nn.Module, value: nn.Module | None) -> np.ndarray:
    """All parameters, policy then value, as one float32 vector (the order of every gradient list)."""
    with torch.no_grad():
        vec = torch.nn.utils.parameters_to_vector(_params(policy, value))
    return vec.numpy().astype(np.float32, copy=True)


def num_params(policy: nn.Module, value: nn.Module | None) -> int:
    """Length of :func:`params_vector` (and of every gradient pushed for these networks)."""
    return sum(p.numel() for p in _params(policy, value))


def load_vector(policy: nn.Module, value: nn.Module | None, vec: np.ndarray) -> None:
    # Arrays from ray.get are read-only views of the object store: copy before torch owns them.
    t = torch.from_numpy(np.array(vec, dtype=np.float32, copy=True))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(t, _params(policy, value))


class OuterStep:
    """The master's step for pseudo-gradients (the shape architecture): ``θ ← θ − g``, over the policy's
    parameters and then ``baseline``'s (the shared value baseline, if any: ``[policy ; baseline]``).

    Has :class:`~dl2ray.learn.actor_critic.ActorCriticOptimizer`'s interface (``updates``,
    ``apply_gradients``, ``state_dict``), so the GlobalPolicy drives either the same way.
    """

    def __init__(self, policy: nn.Module, baseline: nn.Module | None = None) -> None:
        self.policy, self.baseline = policy, baseline
        self.updates = 0

    def apply_gradients(self, grads: np.ndarray, train_policy: bool = True) -> None:
        theta = params_vector(self.policy, self.baseline)
        if grads.shape != theta.shape:
            raise ValueError(f"pseudo-gradient of {grads.shape[0]} values for {theta.shape[0]} parameters")
        load_vector(self.policy, self.baseline, theta - grads)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])


def save_networks(path: Path, policy: nn.Module, value: ValueNet | None, catalogue, extra: dict) -> None:
    """The checkpoint of either architecture (``value`` None: a shape checkpoint)."""
    if value is None:
        save_shape_checkpoint(path, policy, catalogue, extra=extra)  # type: ignore[arg-type]
    else:
        save_checkpoint(path, policy, value, catalogue, extra=extra)  # type: ignore[arg-type]


def atomic_save(target: Path, policy: nn.Module, value: ValueNet | None, catalogue, extra: dict) -> None:
    """Write a checkpoint so that a kill mid-write leaves the previous one intact (write, then rename)."""
    tmp = target.with_name(target.name + ".tmp")
    save_networks(tmp, policy, value, catalogue, extra)
    os.replace(tmp, target)


def with_hidden_of(cfg: ExperimentConfig, init: Path | None) -> ExperimentConfig:
    """``cfg`` with the ``init`` checkpoint's widths (``policy.hidden``, or ``policy.shape.embed/head``),
    its layouts (``policy.shape.layouts``: a policy that places each job by its row's placer keeps doing
    so) and architecture: agents and validator build its shapes."""
    if init is None:
        return cfg
    if checkpoint_arch(init) == "shape":
        meta = read_checkpoint_doc(init)["meta"]
        shape = cfg.policy.shape.model_copy(update={"embed": tuple(meta["embed"]), "head": int(meta["head"]),
                                                    "layouts": tuple(meta.get("layouts", ()))})
        policy = cfg.policy.model_copy(update={"arch": "shape", "shape": shape})
        return cfg.model_copy(update={"policy": policy})
    hidden = load_checkpoint(init).meta.hidden
    policy = cfg.policy.model_copy(update={"arch": "paper", "hidden": hidden})
    return cfg.model_copy(update={"policy": policy})


def checkpoint_kind(path: Path) -> str | None:
    """The ``kind`` a checkpoint records (``"a3c"``, ``"rl"``, ...) or None; CheckpointError if unreadable."""
    return read_checkpoint_doc(path).get("extra", {}).get("kind")

