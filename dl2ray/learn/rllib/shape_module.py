"""The shape policy as an RLlib ``TorchRLModule`` (new API stack), with per-job menu masking.

The module holds exactly the shape network of our trainer
(:class:`~dl2ray.policy.shape_net.ShapePolicyNet`, ``pi``), so an RLlib run starts
from a fresh one or from a shipped or SL shape checkpoint (``init``) and exports to
the shape checkpoint format (:func:`~dl2ray.policy.shape_net.save_shape_checkpoint`)
that ``dl2:PATH`` and ``rllib:DIR`` run.

Input: a batch whose ``obs`` column is :class:`dl2ray.envs.shape_env.ShapeEnv`'s dict,
``jobs`` ``(B, J, F)``, ``global`` ``(B, G)``, ``job_mask`` ``(B, J)`` and
``action_mask`` ``(B, J, K)``, float32. Output: ``action_dist_inputs``
``(B, J·K)``, job-major: job ``j``'s ``K`` logits are ``pi``'s (the scores
``dl2:PATH`` ranks, padding rows excluded from its context) plus
``max(log action_mask, FLOAT_MIN)``, so infeasible rows, and every row but wait
of a padding job, get probability ~0. The action distribution is RLlib's
``TorchMultiCategorical`` (one categorical per job, ``MultiDiscrete([K] * J)``);
greedy (``forward_inference``) takes each job's argmax.

Value (``vf``, :class:`ShapeValueNet`): ``V = w·relu(W·[mean_j h_j, max_j h_j, g] + b) + c``
with ``h_j = relu(A·x_j + a)`` (width ``head``) over the shown jobs' full rows: a
DeepSets head like the policy's context, with weights of its own (the value loss
never moves ``pi``). The shape checkpoint has no value network: a run from ``init``
starts ``vf`` fresh, and the export holds ``pi`` only.

``model_config`` (a plain dict, :func:`shape_module_config`): the encoding
(``num_types``, ``menu``, ``slots_run_scale``, ``work_conserving``, ``interleaved``,
``profile_features`` and ``cost``, the operator's profile grid as nested lists
or ``None``: ``pi.enc`` computes features, so ``pi`` validates and runs as
``dl2:PATH`` does), ``embed`` and ``head`` (the policy's widths), ``max_jobs``
(``J``), ``seed`` (initialisation of both networks) and ``init`` (a shape
checkpoint path, or ``None``).

APPO (:class:`ShapeAPPOTorchRLModule`) adds ``TargetNetworkAPI``: ``_old_pi``, a
frozen copy of ``pi`` masked like it, as :class:`~dl2ray.learn.rllib.module.DL2APPOTorchRLModule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchMultiCategorical
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import (
    TARGET_NETWORK_ACTION_DIST_INPUTS,
    TargetNetworkAPI,
    ValueFunctionAPI,
)
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.torch_utils import FLOAT_MIN
from torch import nn

from dl2ray.policy.network import CheckpointError
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import ShapePolicyNet, build_shape_policy, load_shape_checkpoint


def shape_module_config(enc: ShapeEncoding, embed: Sequence[int], head: int, max_jobs: int, seed: int,
                        init: str | None) -> dict[str, Any]:
    """The ``model_config`` dict of :class:`ShapeTorchRLModule` (see the module docstring)."""
    if int(max_jobs) < 1:
        raise ValueError(f"max_jobs: {max_jobs}: must be at least 1")
    return {"num_types": enc.num_types, "menu": [list(s) for s in enc.menu],
            "slots_run_scale": enc.slots_run_scale, "work_conserving": enc.work_conserving,
            "profile_features": enc.profile, "interleaved": enc.interleaved, "layouts": list(enc.layouts),
            "cost": None if enc.cost is None else enc.cost.tolist(),
            "gain": None if enc.gain is None else enc.gain.tolist(),
            "embed": list(embed), "head": int(head),
            "max_jobs": int(max_jobs), "seed": int(seed), "init": None if init is None else str(init)}


class ShapeValueNet(nn.Module):
    """State value from the shown jobs' rows ``x`` (B, J, F), ``present`` (B, J) bool, ``g`` (B, G): (B,)."""

    def __init__(self, job_dim: int, global_dim: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Linear(job_dim, width)
        self.hidden = nn.Linear(2 * width + global_dim, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, present: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        keep = present.unsqueeze(-1)
        mean = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)
        mx = h.masked_fill(~keep, 0.0).amax(dim=1)  # h ≥ 0, so 0 is a neutral pad
        return self.out(torch.relu(self.hidden(torch.cat([mean, mx, g], dim=-1)))).squeeze(-1)


class ShapeTorchRLModule(TorchRLModule, ValueFunctionAPI):
    """Per-job masked categoricals over the menu and a state value (see the module docstring)."""

    pi: ShapePolicyNet
    vf: ShapeValueNet

    def setup(self) -> None:
        mc = self.model_config
        if not isinstance(mc, dict):  # RLlib also accepts a DefaultModelConfig; ours is a plain dict
            raise TypeError(f"ShapeTorchRLModule needs shape_module_config()'s dict, got {type(mc).__name__}")
        cost = None if mc.get("cost") is None else np.asarray(mc["cost"], dtype=np.float64)
        if cost is not None:
            cost.setflags(write=False)
        gain = None if mc.get("gain") is None else np.asarray(mc["gain"], dtype=np.float32)
        if gain is not None:
            gain.setflags(write=False)
        enc = ShapeEncoding(int(mc["num_types"]), tuple((int(w), int(p)) for w, p in mc["menu"]),
                            float(mc["slots_run_scale"]), bool(mc["work_conserving"]),
                            bool(mc["profile_features"]), cost, bool(mc.get("interleaved", False)),
                            tuple(mc.get("layouts", ())), gain)
        jobs, seed = int(mc["max_jobs"]), int(mc["seed"])
        if jobs < 1:
            raise ValueError(f"max_jobs: {jobs}: must be at least 1")
        if mc.get("init"):
            try:
                self.pi = load_shape_checkpoint(mc["init"], expect=enc, decoding="config").policy
            except CheckpointError as exc:
                raise CheckpointError(f"init: {exc}") from None
        else:
            self.pi = build_shape_policy(enc, tuple(mc["embed"]), int(mc["head"]), seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)  # its own stream: the same vf whether pi is fresh or loaded
            self.vf = ShapeValueNet(enc.job_dim, enc.global_dim, self.pi.head_width)
        # one categorical per job; RLlib types this classmethod's first argument as an instance
        self.action_dist_cls = TorchMultiCategorical.get_partial_dist_cls(  # type: ignore[misc]
            input_lens=[enc.num_shapes] * jobs)

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: masked_shape_logits(self.pi, batch[Columns.OBS])}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        obs = batch[Columns.OBS]
        return self.vf(obs["jobs"], obs["job_mask"] > 0.5, obs["global"])


class ShapeAPPOTorchRLModule(ShapeTorchRLModule, TargetNetworkAPI):
    """:class:`ShapeTorchRLModule` with APPO's target network ``_old_pi`` (a copy of ``pi``, masked like it;
    only the learner's module has it, as :class:`~dl2ray.learn.rllib.module.DL2APPOTorchRLModule`)."""

    _old_pi: ShapePolicyNet

    def make_target_networks(self) -> None:
        self._old_pi = make_target_network(self.pi)  # type: ignore[assignment]  # a deep copy of self.pi

    def get_target_network_pairs(self) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
        return [(self.pi, self._old_pi)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: masked_shape_logits(self._old_pi, batch[Columns.OBS])}


def masked_shape_logits(pi: ShapePolicyNet, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``pi``'s logits ``(B, J, K)`` plus ``max(log action_mask, FLOAT_MIN)``, flattened job-major to
    ``(B, J·K)``: ~0 probability where the mask is 0."""
    logits = pi(obs["jobs"], obs["job_mask"] > 0.5, obs["global"])
    return (logits + torch.clamp(torch.log(obs["action_mask"]), min=FLOAT_MIN)).flatten(start_dim=-2)
