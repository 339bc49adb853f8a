"""The networks of A3C as one flat vector: what travels between the GlobalPolicy, its agents, the live
learner and a federation's members (gradients and weights alike), and how they are saved."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dl2ray.config import ExperimentConfig
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import PolicyNet, ValueNet, build_networks, load_checkpoint, save_checkpoint


def networks(cfg: ExperimentConfig, init: str | None, seed: int) -> tuple[PolicyNet, ValueNet]:
    """Policy and value networks: from the ``init`` checkpoint, else fresh from ``seed``."""
    enc = Encoding.from_config(cfg)
    if init is None:
        return build_networks(enc, cfg.policy.hidden, seed)
    ckpt = load_checkpoint(init, expect=enc, catalogue=cfg.catalogue.names)
    return ckpt.policy, ckpt.value


def params_vector(policy: PolicyNet, value: ValueNet) -> np.ndarray:
    """All parameters, policy then value, as one float32 vector (the order of every gradient list)."""
    with torch.no_grad():
        vec = torch.nn.utils.parameters_to_vector([*policy.parameters(), *value.parameters()])
    return vec.numpy().astype(np.float32, copy=True)


def load_vector(policy: PolicyNet, value: ValueNet, vec: np.ndarray) -> None:
    # Arrays from ray.get are read-only views of the object store: copy before torch owns them.
    t = torch.from_numpy(np.array(vec, dtype=np.float32, copy=True))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(t, [*policy.parameters(), *value.parameters()])


def atomic_save(target: Path, policy: PolicyNet, value: ValueNet, catalogue, extra: dict) -> None:
    """Write a checkpoint so that a kill mid-write leaves the previous one intact (write, then rename)."""
    tmp = target.with_name(target.name + ".tmp")
    save_checkpoint(tmp, policy, value, catalogue, extra=extra)
    os.replace(tmp, target)


def with_hidden_of(cfg: ExperimentConfig, init: Path | None) -> ExperimentConfig:
    """``cfg`` with the ``init`` checkpoint's ``policy.hidden``: agents and validator build its shapes."""
    if init is None:
        return cfg
    hidden = load_checkpoint(init).meta.hidden
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"hidden": hidden})})


def checkpoint_kind(path: Path) -> str | None:
    """The ``kind`` a checkpoint records (``"a3c"``, ``"rl"``, ...) or None; CheckpointError if unreadable."""
    return load_checkpoint(path).extra.get("kind")
