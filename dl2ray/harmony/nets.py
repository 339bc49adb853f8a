"""Harmony's networks (torch for training, numpy for decisions) and checkpoints.

**Reward-prediction model** ``ŷ = g(features)``: an MLP (two ReLU layers of ``RM_HIDDEN``) from a
placed job's features (:func:`rm_features`: one-hot type, size, foreign tasks of each type on
its nodes (mean and max over its tasks), layout) to its speed relative to the same job with
every task on a node of its own and no interference (``Logged.speed``). Trained on logged
placements with the mean relative error ``|ŷ − y| / y``.

**Actor-critic** over the placement state (:mod:`dl2ray.harmony.policy`): each server's row
goes through one shared layer (``relu(W_s v_m + b_s)``, the per-server FC of Harmony), the job
part through its own layer, then a shared joint layer feeds the policy logits (2M: a worker
or a PS on server m; masked, softmax) and the value ``V(s)``.

Checkpoint (``torch.save``): ``{"kind": "harmony", "servers", "types", "rm": state_dict,
"ac": state_dict, "record": dict}``.
"""

from __future__ import annotations

import numpy as np

RM_HIDDEN = (64, 64)
AC_HIDDEN = (32, 64, 128)
"""Actor-critic widths: per-server branch, job branch, joint layer."""


def rm_features(type_index: int, size, mean_foreign, max_foreign, layout, types: int) -> np.ndarray:
    """Shape (3L + 5,): the reward model's input for one placed job."""
    onehot = np.zeros(types)
    onehot[type_index] = 1.0
    return np.concatenate(
        [
            onehot,
            np.asarray(size, dtype=np.float64) / 4.0,
            np.asarray(mean_foreign) / 4.0,
            np.asarray(max_foreign) / 4.0,
            layout,
        ]
    )


def logged_features(data, types: int) -> np.ndarray:
    """Shape (S, 3L + 5) for a :class:`~dl2ray.harmony.linear.Logged`."""
    return np.stack(
        [
            rm_features(int(t), s, a, b, lay, types)
            for t, s, a, b, lay in zip(
                data.type, data.size, data.mean_foreign, data.max_foreign, data.layout, strict=True
            )
        ]
    )


def build_reward_model(inputs: int, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    h1, h2 = RM_HIDDEN
    return nn.Sequential(
        nn.Linear(inputs, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(), nn.Linear(h2, 1), nn.Softplus()
    )


def numpy_reward_model(weights: dict[str, np.ndarray]):
    """``f(x (B, F)) -> (B,)``: the reward model's forward pass in numpy."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}

    def f(x: np.ndarray) -> np.ndarray:
        h = np.maximum(np.atleast_2d(x) @ w["0.weight"].T + w["0.bias"], 0)
        h = np.maximum(h @ w["2.weight"].T + w["2.bias"], 0)
        z = (h @ w["4.weight"].T + w["4.bias"])[:, 0]
        return np.logaddexp(0.0, z)  # softplus

    return f


def build_actor_critic(servers: int, server_dim: int, job_dim: int, seed: int = 0):
    import torch
    from torch import nn

    hs, hj, h = AC_HIDDEN

    class ActorCritic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.servers, self.server_dim, self.job_dim = servers, server_dim, job_dim
            self.server = nn.Linear(server_dim, hs)
            self.job = nn.Linear(job_dim, hj)
            self.joint = nn.Linear(servers * hs + hj, h)
            self.pi = nn.Linear(h, 2 * servers)
            self.v = nn.Linear(h, 1)

        def forward(self, x):
            """``x`` (B, state_dim) → (logits (B, 2M), value (B,))."""
            n = servers * server_dim
            s = torch.relu(self.server(x[:, :n].reshape(-1, servers, server_dim))).flatten(1)
            g = torch.relu(self.job(x[:, n:]))
            z = torch.relu(self.joint(torch.cat([s, g], 1)))
            return self.pi(z), self.v(z)[:, 0]

    torch.manual_seed(seed)
    return ActorCritic()


class NumpyPolicy:
    """The actor's forward pass in numpy (greedy: highest allowed logit)."""

    def __init__(self, servers: int, server_dim: int, weights: dict[str, np.ndarray]) -> None:
        self.servers, self.server_dim = servers, server_dim
        self.w = {k: np.asarray(v, np.float64) for k, v in weights.items()}

    def logits(self, x: np.ndarray) -> np.ndarray:
        w, n = self.w, self.servers * self.server_dim
        rows = x[:n].reshape(self.servers, self.server_dim)
        s = np.maximum(rows @ w["server.weight"].T + w["server.bias"], 0)
        g = np.maximum(x[n:] @ w["job.weight"].T + w["job.bias"], 0)
        z = np.maximum(np.concatenate([s.ravel(), g]) @ w["joint.weight"].T + w["joint.bias"], 0)
        return z @ w["pi.weight"].T + w["pi.bias"]

    def greedy(self, x: np.ndarray, mask: np.ndarray) -> int:
        return int(np.argmax(np.where(mask, self.logits(x), -np.inf)))


def save_checkpoint(path, servers: int, types: int, rm, ac, record: dict) -> None:
    import torch

    torch.save(
        {
            "kind": "harmony",
            "servers": servers,
            "types": types,
            "rm": {k: v.detach().cpu() for k, v in rm.state_dict().items()},
            "ac": {k: v.detach().cpu() for k, v in ac.state_dict().items()},
            "record": record,
        },
        path,
    )


def read_checkpoint(path) -> dict:
    """The checkpoint with numpy weights under ``rm`` and ``ac``."""
    import torch

    ck = torch.load(path, map_location="cpu", weights_only=True)
    for part in ("rm", "ac"):
        ck[part] = {k: v.numpy() for k, v in ck[part].items()}
    return ck
