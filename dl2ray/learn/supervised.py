"""What supervised learning of either architecture shares: the simulators the teacher is recorded in, the
label-smoothed cross-entropy, the per-epoch record. Below :mod:`dl2ray.learn.sl` (the paper architecture and
the ``train sl`` driver) and :mod:`dl2ray.learn.shape.sl` (the shape architecture), which import it and
not each other's internals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dl2ray.config import ExperimentConfig
from dl2ray.workload import Trace


@dataclass
class EpochStats:
    epoch: int
    loss: float
    accuracy: float
    val_loss: float
    val_accuracy: float


def simulators(cfg: ExperimentConfig, trace_seeds: Sequence[int], traces: Sequence[Trace] | None):
    """``(simulator, seed)`` per run: generated traces by seed, or the fixed ``traces`` (seed: noise only)."""
    from dl2ray.world import build_simulator

    world = cfg.policy.train_world
    if traces is None:
        sim = build_simulator(cfg, world=world)
        return [(sim, seed) for seed in trace_seeds]
    return [(build_simulator(cfg, t, world=world), seed)
            for t, seed in zip(traces, trace_seeds, strict=False)]


def smoothed_cross_entropy(logits: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor,
                           eps: float) -> torch.Tensor:
    """``mean_i [−(1−ε)·log π(a_i|s_i) − ε·mean_{a allowed} log π(a|s_i)]`` over the masked softmax.

    ``logits`` (N, A) already masked (−inf where ``masks`` is False), ``actions`` (N,).
    """
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(1, actions[:, None]).squeeze(1)
    if eps == 0:
        return -chosen.mean()
    allowed = torch.where(masks, logp, torch.zeros_like(logp)).sum(1) / masks.sum(1)
    return (-(1 - eps) * chosen - eps * allowed).mean()
