"""Policy and value networks (torch), checkpoints, and the numpy inference path.

Both networks are MLPs on the flattened state (shape ``(B, J·(L+5))``): fully
connected layers of ``policy.hidden`` widths with ReLU, then a linear output —
``3J+1`` logits for the policy, one scalar for the value. The policy's
distribution is ``softmax(masked_logits(logits, mask))`` with infeasible
actions' logits set to ``-inf``.

The decision loop does not use torch: :class:`NumpyPolicy` copies the policy
weights into float32 numpy arrays once and runs the MLP for one state at a
time. It is the faster path for a single ``1×(J·(L+5))`` input (no dispatcher,
no autograd bookkeeping; see ``docs/policy.md`` for the measurement), and it
lets the loop update the first layer incrementally: an action changes three
state entries of one row, so the first pre-activation changes by
``delta @ W1[rows]`` instead of a full ``D×H`` product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dl2ray.errors import UserError
from dl2ray.policy.encoding import FEATURES, Encoding

CHECKPOINT_FORMAT = 1


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int) -> nn.Sequential:
    """Linear+ReLU for each width in ``hidden``, then a linear layer to ``out_dim``."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` with infeasible actions (``mask`` False) set to ``-inf``; shapes (B, A)."""
    return logits.masked_fill(~mask, float("-inf"))


class PolicyNet(nn.Module):
    """State ``(B, J·(L+5))`` → action logits ``(B, 3J+1)``."""

    def __init__(self, enc: Encoding, hidden: Sequence[int]) -> None:
        super().__init__()
        self.enc, self.hidden = enc, tuple(hidden)
        self.body = mlp(enc.state_dim, hidden, enc.action_dim)

    def forward(self, states: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.body(states)
        return logits if masks is None else masked_logits(logits, masks)


class ValueNet(nn.Module):
    """State ``(B, J·(L+5))`` → value ``(B,)`` (the same trunk architecture, own weights)."""

    def __init__(self, enc: Encoding, hidden: Sequence[int]) -> None:
        super().__init__()
        self.body = mlp(enc.state_dim, hidden, 1)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.body(states).squeeze(-1)


def build_networks(enc: Encoding, hidden: Sequence[int], seed: int) -> tuple[PolicyNet, ValueNet]:
    """Freshly initialised networks; the init draws only from a generator seeded by ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PolicyNet(enc, hidden), ValueNet(enc, hidden)


class CheckpointError(UserError, ValueError):
    """A checkpoint is missing, unreadable, or does not fit the config's dimensions."""


@dataclass(frozen=True)
class CheckpointMeta:
    """What it takes to rebuild the networks, and to refuse a mismatched config."""

    window: int
    num_types: int
    slots_run_scale: float
    hidden: tuple[int, ...]
    catalogue: tuple[str, ...]

    @property
    def encoding(self) -> Encoding:
        return Encoding(self.window, self.num_types, self.slots_run_scale)


@dataclass
class Checkpoint:
    policy: PolicyNet
    value: ValueNet
    meta: CheckpointMeta
    extra: dict


def save_checkpoint(
    path: str | Path, policy: PolicyNet, value: ValueNet, catalogue: Sequence[str], extra: dict | None = None
) -> None:
    """``torch.save`` of both state dicts, the rebuild fields and ``extra`` (plain data)."""
    enc = policy.enc
    meta = CheckpointMeta(enc.window, enc.num_types, enc.slots_run_scale, policy.hidden, tuple(catalogue))
    if len(meta.catalogue) != enc.num_types:
        raise ValueError(f"catalogue has {len(meta.catalogue)} names, the encoding {enc.num_types} types")
    doc = {
        "format": CHECKPOINT_FORMAT,
        "meta": {**asdict(meta), "hidden": list(meta.hidden), "catalogue": list(meta.catalogue)},
        "state_dim": enc.state_dim,
        "action_dim": enc.action_dim,
        "policy": policy.state_dict(),
        "value": value.state_dict(),
        "extra": extra or {},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(doc, path)


def read_checkpoint_doc(path: str | Path) -> dict:
    """The raw checkpoint dict (either architecture); a clear error for anything torch cannot read."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such policy checkpoint")
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch's own message is a page on weights_only, not about this file
        raise CheckpointError(f"{path}: not a dl2ray policy checkpoint (torch.load cannot read it)") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a dl2ray policy checkpoint (not a dict)")
    return doc


def set_checkpoint_placer(path: str | Path, placer: str) -> None:
    """Write ``meta.placer`` (the placement policy the checkpoint decides under as its own; either
    architecture) into the checkpoint at ``path``, weights unchanged; ValueError for an unknown policy."""
    from dl2ray.cluster import PLACEMENTS

    if placer not in PLACEMENTS:
        raise ValueError(f"placer: {placer!r}: must be one of {', '.join(PLACEMENTS)}")
    doc = read_checkpoint_doc(path)
    doc.setdefault("meta", {})["placer"] = placer
    torch.save(doc, path)


def load_checkpoint(path: str | Path, expect: Encoding | None = None,
                    catalogue: Sequence[str] | None = None) -> Checkpoint:
    """Rebuild the networks; refuse a checkpoint whose dimensions differ from ``expect``.

    ``catalogue`` (type names in order), when given, must equal the checkpoint's:
    the one-hot columns mean nothing under another catalogue.
    """
    path = Path(path)
    doc = read_checkpoint_doc(path)
    if doc.get("arch", "paper") != "paper":
        raise CheckpointError(f"{path}: a {doc['arch']!r}-architecture checkpoint; this needs the paper's "
                              "(policy.arch: paper)")
    try:
        m = doc["meta"]
        meta = CheckpointMeta(int(m["window"]), int(m["num_types"]), float(m["slots_run_scale"]),
                              tuple(m["hidden"]), tuple(m["catalogue"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a dl2ray policy checkpoint (meta: {exc!r})") from None
    enc = meta.encoding
    if expect is not None and (enc.state_dim, enc.action_dim) != (expect.state_dim, expect.action_dim):
        raise CheckpointError(
            f"{path}: checkpoint has state dim {enc.state_dim} (J={enc.window}, L={enc.num_types}) and "
            f"{enc.action_dim} actions; the config needs state dim {expect.state_dim} "
            f"(J={expect.window}, L={expect.num_types}) and {expect.action_dim} actions "
            "(policy.window or the job-type catalogue differ)"
        )
    if catalogue is not None and tuple(catalogue) != meta.catalogue:
        raise CheckpointError(
            f"{path}: checkpoint was trained on job types {list(meta.catalogue)}, "
            f"the config has {list(catalogue)}"
        )
    policy, value = PolicyNet(enc, meta.hidden), ValueNet(enc, meta.hidden)
    policy.load_state_dict(doc["policy"])
    value.load_state_dict(doc["value"])
    return Checkpoint(policy, value, meta, dict(doc.get("extra", {})))


class NumpyPolicy:
    """The policy MLP in float32 numpy for single-state inference (no torch, no autograd).

    ``first(state)`` is the first layer's pre-activation ``state @ W1 + b1``
    (shape (H1,)); ``first_delta(row, delta)`` is how it changes when state
    columns ``L+2 .. L+4`` of ``row`` change by ``delta`` (shape (3,));
    ``head(pre1)`` finishes the forward pass to the ``(3J+1,)`` raw logits.
    """

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], enc: Encoding) -> None:
        self.enc = enc
        self.w = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]  # (in, out)
        self.b = [np.ascontiguousarray(b, dtype=np.float32) for b in biases]
        # First-layer rows of the three dynamic columns, per window row: (J, 3, H1).
        r, L = enc.row_dim, enc.num_types
        idx = np.arange(enc.window)[:, None] * r + (L + FEATURES - 3) + np.arange(3)[None, :]
        self._w1_dyn = self.w[0][idx]

    @classmethod
    def from_torch(cls, policy: PolicyNet) -> NumpyPolicy:
        linears = [m for m in policy.body if isinstance(m, nn.Linear)]
        with torch.no_grad():
            ws = [m.weight.detach().cpu().numpy().T for m in linears]
            bs = [m.bias.detach().cpu().numpy() for m in linears]
        return cls(ws, bs, policy.enc)

    def dense_layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(weight (in, out), bias (out,))`` float32 C-contiguous per layer, first to last.

        The hidden layers take ReLU of the previous output; the last gives the logits.
        (What the compiled decision loop, :mod:`dl2ray.policy.decision`, runs.)
        """
        return list(zip(self.w, self.b, strict=True))

    def first(self, state: np.ndarray) -> np.ndarray:
        return state @ self.w[0] + self.b[0]

    def first_delta(self, row: int, delta: np.ndarray) -> np.ndarray:
        return delta @ self._w1_dyn[row]

    def head(self, pre1: np.ndarray) -> np.ndarray:
        h = np.maximum(pre1, 0.0)
        last = len(self.w) - 1
        for k in range(1, last):
            h = np.maximum(h @ self.w[k] + self.b[k], 0.0)
        return h @ self.w[last] + self.b[last]

    def logits(self, states: np.ndarray) -> np.ndarray:
        """Raw logits for states of shape (D,) or (B, D)."""
        return self.head(self.first(states))
