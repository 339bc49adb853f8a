"""SCHED²'s Q-network (the paper's, ``arch: dense``): a branch shared by every server, a job
branch, and a joint head. :func:`build_qnet` / :func:`numpy_qnet` also build the ``jobwise``
network of :mod:`dl2ray.sched2.jobwise`.

For state ``x`` (:mod:`dl2ray.sched2.state`): server ``i``'s row of the GPU matrix ``S_i``
(M,) goes through the *same* layer ``F_i = relu(W_s S_i + b_s)`` (width ``server_hidden``);
the window jobs and statistics ``J`` ((k+2)J+4,) through ``G = relu(W_1 J + b_1)`` (width
``job_hidden``); then ``Q = W_3 relu(W_2 [F_1..F_N, G] + b_2) + b_3``, J+1 values. Invalid
actions are never taken (the caller masks them).

:class:`QNet` is the torch module the trainer updates; :class:`NumpyQNet` runs the same
arithmetic in numpy for ``sched2:PATH`` (no torch at decision time).
Checkpoint (``torch.save``): ``{"shape": Sched2Shape fields, "hidden": (server, job, joint),
"state_dict": tensors, "record": training record}``.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from dl2ray.sched2.state import Sched2Shape, masked_greedy

HIDDEN = (32, 64, 128)
"""Widths: per-server branch, job branch, joint layer."""


def build_qnet(shape: Sched2Shape, hidden: tuple[int, int, int] | None = None, seed: int = 0):
    """A freshly initialised Q-network for ``shape.arch``: the paper's :class:`QNet` (``dense``)
    or :mod:`dl2ray.sched2.jobwise`'s; torch's default init from ``torch.manual_seed(seed)``."""
    import torch
    from torch import nn

    if shape.arch == "jobwise":
        from dl2ray.sched2.jobwise import HIDDEN as JOBWISE_HIDDEN
        from dl2ray.sched2.jobwise import build_jobwise

        return build_jobwise(shape, hidden or JOBWISE_HIDDEN, seed)
    sizes: tuple[int, int, int] = hidden or HIDDEN

    class QNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            hs, hj, h = sizes
            self.shape, self.hidden = shape, sizes
            self.server = nn.Linear(shape.gpus, hs)
            self.jobs = nn.Linear(shape.job_dim, hj)
            self.joint = nn.Linear(shape.servers * hs + hj, h)
            self.out = nn.Linear(h, shape.actions)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """``x`` (B, state_dim) → Q (B, J+1)."""
            nm = shape.servers * shape.gpus
            s = x[:, :nm].reshape(-1, shape.servers, shape.gpus)
            f = torch.relu(self.server(s)).flatten(1)
            g = torch.relu(self.jobs(x[:, nm:]))
            return self.out(torch.relu(self.joint(torch.cat([f, g], dim=1))))

    torch.manual_seed(seed)
    return QNet()


class NumpyQNet:
    """The same forward pass in numpy from a checkpoint's weights."""

    def __init__(self, shape: Sched2Shape, weights: dict[str, np.ndarray]) -> None:
        self.shape = shape
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}

    def q(self, x: np.ndarray) -> np.ndarray:
        """``x`` (state_dim,) or (B, state_dim) → Q (J+1,) or (B, J+1)."""
        w, sh = self.w, self.shape
        x2 = np.atleast_2d(np.asarray(x, dtype=np.float64))
        nm = sh.servers * sh.gpus
        s = x2[:, :nm].reshape(-1, sh.servers, sh.gpus)
        f = np.maximum(s @ w["server.weight"].T + w["server.bias"], 0).reshape(len(x2), -1)
        g = np.maximum(x2[:, nm:] @ w["jobs.weight"].T + w["jobs.bias"], 0)
        h = np.maximum(np.concatenate([f, g], 1) @ w["joint.weight"].T + w["joint.bias"], 0)
        out = h @ w["out.weight"].T + w["out.bias"]
        return out[0] if np.ndim(x) == 1 else out

    def greedy(self, state: np.ndarray, mask: np.ndarray) -> int:
        """``argmax_a Q(s, a)`` over the allowed actions (lowest index on ties)."""
        return masked_greedy(self.q(state), mask)


def numpy_qnet(shape: Sched2Shape, weights: dict[str, np.ndarray]):
    """The numpy forward pass for ``shape.arch`` (``.q(x)``, ``.greedy(state, mask)``)."""
    if shape.arch == "jobwise":
        from dl2ray.sched2.jobwise import NumpyJobwiseQNet

        return NumpyJobwiseQNet(shape, weights)
    return NumpyQNet(shape, weights)


def save_checkpoint(path, net, record: dict) -> None:
    import torch

    torch.save(
        {
            "shape": asdict(net.shape),
            "hidden": list(net.hidden),
            "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()},
            "record": record,
        },
        path,
    )


def read_checkpoint(path) -> tuple[Sched2Shape, dict[str, np.ndarray], dict]:
    """``(shape, weights as numpy, record)`` of a checkpoint."""
    import torch

    ck = torch.load(path, map_location="cpu", weights_only=True)
    weights = {k: v.numpy() for k, v in ck["state_dict"].items()}
    return Sched2Shape(**ck["shape"]), weights, ck.get("record", {})
