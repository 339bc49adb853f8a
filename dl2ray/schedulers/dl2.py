"""DL2: a saved policy network run through the incremental decision loop.

``dl2:PATH`` in the CLI (e.g. ``dl2ray compare --schedulers drf,dl2:models/x.pt``).
The checkpoint must match the config's ``policy.window`` and job-type
catalogue (:func:`dl2ray.policy.network.load_checkpoint` refuses otherwise).
Inference is the policy's numpy path; torch is imported only to read the
checkpoint, lazily, so this package stays importable without it.
"""

from __future__ import annotations

import numpy as np

from dl2ray.errors import UserError
from dl2ray.view import Allocation, ClusterView


class DL2Scheduler:
    """``decide(view)``: greedy (default) or sampled actions of the policy at ``policy_path``.

    Sampling draws from a generator seeded by ``(seed, run seed)`` at every
    :meth:`reset`, so a run is reproducible.
    """

    name = "dl2"

    def __init__(self, policy_path: str | None, cfg, greedy: bool = True, seed: int = 0) -> None:
        if not policy_path:
            raise UserError("dl2 needs a policy checkpoint: dl2:PATH (e.g. dl2:models/dl2-testbed.pt)")
        from dl2ray.policy.encoding import Encoding
        from dl2ray.policy.network import NumpyPolicy, load_checkpoint

        enc = Encoding.from_config(cfg)
        ckpt = load_checkpoint(policy_path, expect=enc, catalogue=cfg.catalogue.names)
        self.enc = ckpt.meta.encoding
        self.policy = NumpyPolicy.from_torch(ckpt.policy)
        self.greedy, self._seed = greedy, seed
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_policy(cls, policy, greedy: bool = True, seed: int = 0) -> DL2Scheduler:
        """From an in-memory :class:`~dl2ray.policy.network.NumpyPolicy` (e.g. during training)."""
        self = cls.__new__(cls)
        self.enc, self.policy = policy.enc, policy
        self.greedy, self._seed = greedy, seed
        self._rng = np.random.default_rng(seed)
        return self

    @classmethod
    def from_checkpoint_bytes(cls, data: bytes, cfg, greedy: bool = True, seed: int = 0) -> DL2Scheduler:
        """From the bytes of a checkpoint file (e.g. pulled from a training actor), read by the same
        :func:`~dl2ray.policy.network.load_checkpoint` as ``__init__``, with the same checks."""
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(prefix="dl2ray-ckpt-") as tmp:
            path = Path(tmp) / "policy.pt"
            path.write_bytes(data)
            return cls(str(path), cfg, greedy, seed)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng([self._seed, seed])

    def decide(self, view: ClusterView) -> Allocation:
        from dl2ray.policy.decision import decide_slot

        return decide_slot(view, self.policy, self.enc, self.greedy, self._rng).allocation
