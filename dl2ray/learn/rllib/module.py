"""The DL2 policy and value networks as an RLlib ``TorchRLModule`` (new API stack), with action masking.

The module holds exactly the networks of our own trainer
(:class:`~dl2ray.policy.network.PolicyNet`, :class:`~dl2ray.policy.network.ValueNet`), so
an RLlib run starts from the same initialisation or the same SL warm start as
``dl2ray train rl`` and exports to the same checkpoint format
(:func:`dl2ray.policy.network.save_checkpoint`) that ``dl2:PATH`` and ``rllib:DIR`` run.

Input: a batch whose ``obs`` column is :class:`dl2ray.envs.dl2_env.DL2Env`'s dict,
``{"observations": (B, J·(L+5)) float32, "action_mask": (B, 3J+1) float32 0/1}``.
Output: ``action_dist_inputs`` ``(B, 3J+1)``, the policy's logits plus
``max(log mask, FLOAT_MIN)`` (infeasible actions get probability ~0, as
RLlib's action-masking example does); values ``(B,)`` from the value network.

``model_config`` (a plain dict, so RLlib can ship it to its workers):
``window``, ``num_types``, ``slots_run_scale`` (the :class:`~dl2ray.policy.encoding.Encoding`),
``hidden`` (layer widths), ``seed`` (initialisation, as
:func:`~dl2ray.policy.network.build_networks`), and ``init``: a dl2ray
checkpoint path to start from instead (its policy *and* value weights, as
``dl2ray train rl --init`` does), or ``None``.

Which module an algorithm needs (RLlib 2.60's ``Learner.rl_module_required_apis``):
PPO and IMPALA ``ValueFunctionAPI`` (:class:`DL2TorchRLModule`); APPO also
``TargetNetworkAPI`` (:class:`DL2APPOTorchRLModule`: a frozen copy of the policy
network, the "old" policy of its clipped surrogate and of V-trace).
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import (
    TARGET_NETWORK_ACTION_DIST_INPUTS,
    TargetNetworkAPI,
    ValueFunctionAPI,
)
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.torch_utils import FLOAT_MIN

from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import PolicyNet, ValueNet, build_networks, load_checkpoint


def module_config(enc: Encoding, hidden, seed: int, init: str | None) -> dict[str, Any]:
    """The ``model_config`` dict of :class:`DL2TorchRLModule` (see the module docstring)."""
    return {"window": enc.window, "num_types": enc.num_types, "slots_run_scale": enc.slots_run_scale,
            "hidden": list(hidden), "seed": int(seed), "init": None if init is None else str(init)}


class DL2TorchRLModule(TorchRLModule, ValueFunctionAPI):
    """Masked categorical policy and state-value function over the DL2 state (see the module docstring)."""

    pi: PolicyNet
    vf: ValueNet

    def setup(self) -> None:
        mc = self.model_config
        if not isinstance(mc, dict):  # RLlib also accepts a DefaultModelConfig; ours is a plain dict
            raise TypeError(f"DL2TorchRLModule needs module_config()'s dict, got {type(mc).__name__}")
        enc = Encoding(int(mc["window"]), int(mc["num_types"]), float(mc["slots_run_scale"]))
        if mc.get("init"):
            ckpt = load_checkpoint(mc["init"], expect=enc)
            self.pi, self.vf = ckpt.policy, ckpt.value
        else:
            self.pi, self.vf = build_networks(enc, tuple(mc["hidden"]), int(mc["seed"]))

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: _masked_logits(self.pi, batch[Columns.OBS])}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        return self.vf(batch[Columns.OBS]["observations"])


class DL2APPOTorchRLModule(DL2TorchRLModule, TargetNetworkAPI):
    """:class:`DL2TorchRLModule` with APPO's target network: ``_old_pi``, a copy of ``pi``.

    Only the learner's module has it: RLlib's APPO learner calls
    :meth:`make_target_networks` after ``setup`` (so the copy starts from the
    warm start, if any) and moves ``_old_pi`` towards ``pi`` every
    ``target_network_update_freq`` (× its circular buffer's size) trained env steps,
    with ``tau`` (1: a plain copy). :meth:`forward_target` masks the copy's logits
    exactly like ``_forward``, so old and new policy put no mass on infeasible actions.
    The sampler's copy of the module and the exported policy have no ``_old_pi``
    (RLlib's ``set_state`` ignores the extra keys).
    """

    _old_pi: PolicyNet

    def make_target_networks(self) -> None:
        self._old_pi = make_target_network(self.pi)  # type: ignore[assignment]  # a deep copy of self.pi

    def get_target_network_pairs(self) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
        return [(self.pi, self._old_pi)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: _masked_logits(self._old_pi, batch[Columns.OBS])}


def _masked_logits(pi: PolicyNet, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``pi``'s logits ``(B, 3J+1)`` plus ``max(log mask, FLOAT_MIN)``: ~0 probability where the mask is 0."""
    return pi(obs["observations"]) + torch.clamp(torch.log(obs["action_mask"]), min=FLOAT_MIN)
