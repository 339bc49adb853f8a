"""DL2: a saved policy network run through its decision loop.

``dl2:PATH`` in the CLI (e.g. ``dl2ray compare --schedulers drf,dl2:models/x.pt``).
Two architectures (``policy.arch``), told apart by the checkpoint itself:

- ``paper``: the DL2 paper's incremental loop over windows of J jobs
  (:mod:`dl2ray.policy.decision`); the checkpoint must match the config's
  ``policy.window`` and job-type catalogue
  (:func:`dl2ray.policy.network.load_checkpoint` refuses otherwise);
- ``shape``: one ``(workers, PS)`` menu row per job from a scorer shared by
  all jobs (:mod:`dl2ray.policy.shape`); the checkpoint must match the
  config's menu and catalogue.

Inference is numpy (plus the compiled loops; a shape policy decides in one compiled pass,
:mod:`dl2ray.policy.shape_fused`); torch is imported only to read the checkpoint, lazily, so this
package stays importable without it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from dl2ray.errors import UserError
from dl2ray.view import Allocation, ClusterView


class DL2Scheduler:
    """``decide(view)``: greedy (default) or sampled actions of the policy at ``policy_path``.

    Sampling draws from a generator seeded by ``(seed, run seed)`` at every
    :meth:`reset`, so a run is reproducible. ``placement``: the placer it decides under as its own
    (:mod:`dl2ray.schedulers.placed`) — the checkpoint's ``meta.placer``, chosen on validation when it
    was shipped (``dl2ray train ship --placer``); ``load_balancing`` for a checkpoint without one (every
    policy before issue 36 was trained and selected under it).
    """

    name = "dl2"
    placement = "load_balancing"

    def __init__(self, policy_path: str | None, cfg, greedy: bool = True, seed: int = 0) -> None:
        if not policy_path:
            raise UserError("dl2 needs a policy checkpoint: dl2:PATH (e.g. dl2:models/dl2-testbed.pt)")
        from dl2ray.policy.shape_net import checkpoint_arch, checkpoint_placer

        self.placement = checkpoint_placer(policy_path)
        if checkpoint_arch(policy_path) == "shape":
            from dl2ray.policy.shape_net import NumpyShapePolicy, load_shape_policy

            self._init(NumpyShapePolicy(load_shape_policy(policy_path, cfg)), greedy, seed)
            return
        from dl2ray.policy.encoding import Encoding
        from dl2ray.policy.network import NumpyPolicy, load_checkpoint

        ckpt = load_checkpoint(policy_path, expect=Encoding.from_config(cfg), catalogue=cfg.catalogue.names)
        self._init(NumpyPolicy.from_torch(ckpt.policy), greedy, seed)

    def _init(self, policy, greedy: bool, seed: int) -> None:
        from dl2ray.policy.shape import ShapeEncoding

        self.policy, self.enc = policy, policy.enc
        # the policy's architecture
        self.arch: Literal["paper", "shape"] = "shape" if isinstance(self.enc, ShapeEncoding) else "paper"
        self._fused = None
        if self.arch == "shape":
            from dl2ray.policy.shape_fused import FusedShapePolicy

            self._fused = FusedShapePolicy(policy)
        self.greedy, self._seed = greedy, seed
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_policy(cls, policy, greedy: bool = True, seed: int = 0) -> DL2Scheduler:
        """From an in-memory :class:`~dl2ray.policy.network.NumpyPolicy` or
        :class:`~dl2ray.policy.shape_net.NumpyShapePolicy` (e.g. during training; it decides under the
        view's placement, the training config's ``cluster.default_placement``)."""
        self = cls.__new__(cls)
        self._init(policy, greedy, seed)
        return self

    @classmethod
    def from_checkpoint_bytes(cls, data: bytes, cfg, greedy: bool = True, seed: int = 0) -> DL2Scheduler:
        """From the bytes of a checkpoint file (e.g. pulled from a training actor), read by the same
        loaders as ``__init__``, with the same checks."""
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(prefix="dl2ray-ckpt-") as tmp:
            path = Path(tmp) / "policy.pt"
            path.write_bytes(data)
            return cls(str(path), cfg, greedy, seed)

    @property
    def placement_label(self) -> str:
        """What a table's ``placement`` column says of this policy: ``policy(a|b|…)`` when it places every
        job by its own row's layout (``policy.shape.layouts``; the view's placer then plays no part, a
        forced one included), else the placer it decides under."""
        layouts = getattr(self.enc, "layouts", ())
        return f"policy({'|'.join(layouts)})" if layouts else self.placement

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng([self._seed, seed])

    def decide(self, view: ClusterView) -> Allocation:
        rng = None if self.greedy else self._rng
        if self._fused is not None:  # the shape policy's one compiled pass (dl2ray.policy.shape_fused)
            return self._fused.decide(view, rng).allocation
        from dl2ray.policy.decision import decide_slot

        return decide_slot(view, self.policy, self.enc, self.greedy, self._rng).allocation
