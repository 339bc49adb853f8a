"""Twin credit and on-policy advantages in one update of the shape policy (``--algo mix``).

Issue 22's third direction. The two learners it mixes fail in opposite ways
(docs/notebook/2026-11-28.md): the counterfactual learner (:mod:`dl2ray.learn.shape.counterfactual`)
measures one job's choice exactly, but only for the few jobs and rows it tries per slot, on the states
the *greedy* policy visits and under a greedy continuation; the on-policy learner
(:mod:`dl2ray.learn.shape.pg`) credits *every* decision of the sampled policy, but with a return so
noisy that its updates are matched by its shuffled control. The mix takes both kinds of experience
each update from the same twin and steps on the sum of the two objectives:

``L(θ) = L_cf(θ) + w · L_pg(θ)``

- ``L_cf``: the KL-limited improvement loss of the counterfactual learner on its tries, with the
  entropy bonus ``β·H`` (:class:`~dl2ray.learn.shape.counterfactual.ImprovementTarget`);
- ``L_pg``: PPO's clipped surrogate on the sampled episodes' per-job advantages (credit ``job`` or
  ``slot`` minus the learned baseline ``V(x_j, g)``; :class:`~dl2ray.learn.shape.pg.SurrogateTarget`),
  without a second entropy bonus;
- ``w``: ``mix_weight`` (``--mix-weight``, default 1: both terms' gradients are of the same order,
  the first a cross-entropy to targets, the second standardised advantages).

Up to ``epochs`` Adam steps, stopped once the policy moved more than ``trust`` (mean
``KL(π_old ‖ π_θ)``) on *either* batch's jobs. The control (``zero_advantage``) shuffles both: each
try's advantages among its rows and the on-policy advantages among the update's decisions.

The on-policy episodes run on simulators of their own
(:meth:`~dl2ray.learn.shape.twin.TwinExperience.simulators`):
the counterfactual collector's side-by-side episodes continue across updates and must not be reset.
"""

from __future__ import annotations

import numpy as np
import torch

from dl2ray.config import ShapeConfig
from dl2ray.learn.records import MixRow
from dl2ray.learn.shape.counterfactual import Collected, ImprovementTarget
from dl2ray.learn.shape.pg import JobValue, Played, SurrogateTarget
from dl2ray.policy.shape_net import ShapePolicyNet


def mix_update(net: ShapePolicyNet, value: JobValue, opt: torch.optim.Optimizer,
               value_opt: torch.optim.Optimizer, tries: Collected, played: Played, s: ShapeConfig,
               weight: float, update: int = -1, control: np.random.Generator | None = None) -> MixRow:
    """One update of ``net`` (and the baseline ``value``) on ``tries`` and ``played`` with
    ``s``'s ``kl``, ``epochs``, ``trust`` and ``entropy_weight`` (module docstring); its record."""
    if weight < 0:
        raise ValueError(f"mix_weight: {weight}: need ≥ 0")
    cf = ImprovementTarget(net, tries, s.kl, control)
    pg = SurrogateTarget(net, value, value_opt, played, s.epochs, control)
    losses = (0.0, 0.0, 0.0)
    entropy = kl = 0.0
    steps = 0
    for _ in range(s.epochs):
        if cf.empty:  # no try had two rows: the on-policy term alone, with the entropy bonus
            loss_pg, ent = pg.loss(net, s.entropy_weight)
            loss, loss_cf = weight * loss_pg, torch.zeros(())
        else:
            loss_cf, ent = cf.loss(net, s.entropy_weight)
            loss_pg, _ = pg.loss(net, 0.0)
            loss = loss_cf + weight * loss_pg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        losses = (float(loss.detach()), float(loss_cf.detach()), float(loss_pg.detach()))
        entropy = float(ent.detach())
        kl = max(pg.moved(net), 0.0 if cf.empty else cf.moved(net))
        if s.trust is not None and kl > s.trust:
            break
    return MixRow(update, *losses, pg.value_loss, kl, entropy, tries.reward,
                  0.0 if cf.empty else cf.mean_gain, pg.mean_credit, len(tries.tries), pg.decisions,
                  tries.rollouts, played.episodes, steps)
