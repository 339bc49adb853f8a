"""Harmony's networks (torch for training, numpy for decisions) and checkpoints.

**Reward-prediction model** ``ŷ = b · min_n s_n`` (:func:`build_reward_model`) from a placed job's
features (:func:`rm_features`: one-hot type, size, and for every node it uses its own workers/PS
there and the foreign tasks of each type there) to its speed relative to the same job with
every task on a node of its own and no interference (``Logged.speed``). Trained on logged
placements with the mean relative error ``|ŷ − y| / y``. It never reads the hidden interference
parameters; its structure (a layout factor times the slowest node's factor) is what a
synchronous job is known to do.

**Actor-critic** over the placement state (:mod:`dl2ray.harmony.policy`): each server's row
goes through one shared layer (``relu(W_s v_m + b_s)``, the per-server FC of Harmony), the job
part through its own layer, then a shared joint layer feeds the policy logits (2M: a worker
or a PS on server m; masked, softmax) and the value ``V(s)``.

Checkpoint (``torch.save``): ``{"kind": "harmony", "servers", "types", "rm": state_dict,
"ac": state_dict, "record": dict}``.
"""

from __future__ import annotations

import numpy as np

RM_HIDDEN = 64
"""Width of the reward model's two ReLU layers (both branches)."""
AC_HIDDEN = (32, 64, 128)
"""Actor-critic widths: per-server branch, job branch, joint layer."""


def rm_features(type_index: int, worker_nodes, ps_nodes, counts: np.ndarray, max_nodes: int) -> np.ndarray:
    """Shape ``((K + 1)(L + 2),)``, ``K = max_nodes``, ``L = counts.shape[1]``: a placed job, fully.

    ``counts`` (N, L): tasks of each job type on each node, *this job's own tasks included*.
    Block 0: one-hot type (L), workers / 4, PS / 4. Then one row per node the job uses (sorted by
    its own workers, PS and foreign tasks, descending; zero rows pad to ``K``): its own workers / 4
    and PS / 4 there, and the *foreign* tasks of each type there / 4 (all tasks minus its own). So
    the features say which task types meet this job on every one of its servers — what co-location
    interference depends on — and its exact layout (what the placement speed factor depends on).
    """
    from collections import Counter

    types = counts.shape[1]
    wc, pc = Counter(worker_nodes), Counter(ps_nodes)
    nodes = sorted(set(wc) | set(pc))
    if len(nodes) > max_nodes:
        raise ValueError(f"rm_features: the job uses {len(nodes)} nodes, more than max_nodes={max_nodes}")
    rows = []
    for n in nodes:
        foreign = np.asarray(counts[n], dtype=np.float64).copy()
        foreign[type_index] -= wc[n] + pc[n]
        rows.append(np.concatenate([[wc[n], pc[n]], foreign]))
    rows.sort(key=lambda r: tuple(-r), reverse=False)
    block = np.zeros((max_nodes, types + 2))
    if rows:
        block[: len(rows)] = np.array(rows)
    job = np.zeros(types + 2)
    job[type_index] = 1.0
    job[types:] = (len(worker_nodes) / 4.0, len(ps_nodes) / 4.0)
    return np.concatenate([job, block.ravel() / 4.0])


def max_nodes(cfg) -> int:
    """``K`` of :func:`rm_features` for a gang config: a job's workers and PS at most."""
    return 2 * int(cfg.gang.max_tasks)


def build_reward_model(types: int, max_nodes: int, seed: int = 0):
    """The reward model ``ŷ = b(job, layout) · min_n s(type, foreign tasks on n)`` (torch).

    - ``b``: MLP (``RM_HIDDEN`` × 2, softplus) from block 0 and every node's own workers / PS:
      the speed of this layout relative to the spread one, without interference;
    - ``s``: MLP (``RM_HIDDEN`` × 2, sigmoid, so in (0, 1)) on one node: one-hot type ``e_t`` (L),
      foreign tasks ``f`` (L) and the type-pair products ``e_t ⊗ f`` (L²);
    - the job runs at its slowest task (synchronous training), hence the min over its nodes.

    Input (B, (K+1)(L+2)) as :func:`rm_features`; output (B, 1).
    """
    import torch
    from torch import nn

    h = RM_HIDDEN

    def mlp(n_in: int):
        return nn.Sequential(nn.Linear(n_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))

    class RewardModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = mlp(types + 2 + 2 * max_nodes)
            self.node = mlp(2 * types + types * types)

        def forward(self, x):
            job = x[:, : types + 2]
            rows = x[:, types + 2 :].reshape(-1, max_nodes, types + 2)
            own, foreign = rows[:, :, :2], rows[:, :, 2:]
            b = nn.functional.softplus(self.base(torch.cat([job, own.flatten(1)], 1)))[:, 0]
            onehot = job[:, None, :types].expand(-1, max_nodes, -1)
            pair = (onehot[:, :, :, None] * foreign[:, :, None, :]).flatten(2)
            s = torch.sigmoid(self.node(torch.cat([onehot, foreign, pair], 2)))[:, :, 0]
            s = torch.where(own.sum(2) > 0, s, torch.ones_like(s))
            return (b * s.min(1).values)[:, None]

    torch.manual_seed(seed)
    return RewardModel()


def numpy_reward_model(weights: dict[str, np.ndarray]):
    """``f(x (B, F)) -> (B,)``: :func:`build_reward_model`'s forward pass in numpy."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    types = round(np.sqrt(1 + w["node.0.weight"].shape[1])) - 1  # node inputs: L² + 2L
    k = (w["base.0.weight"].shape[1] - types - 2) // 2  # base inputs: L + 2 + 2K

    def mlp(name: str, z: np.ndarray) -> np.ndarray:
        z = np.maximum(z @ w[f"{name}.0.weight"].T + w[f"{name}.0.bias"], 0)
        z = np.maximum(z @ w[f"{name}.2.weight"].T + w[f"{name}.2.bias"], 0)
        return (z @ w[f"{name}.4.weight"].T + w[f"{name}.4.bias"])[..., 0]

    def f(x: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float64))
        job = x[:, : types + 2]
        rows = x[:, types + 2 :].reshape(len(x), k, types + 2)
        own, foreign = rows[:, :, :2], rows[:, :, 2:]
        b = np.logaddexp(0.0, mlp("base", np.concatenate([job, own.reshape(len(x), -1)], 1)))
        onehot = np.broadcast_to(job[:, None, :types], (len(x), k, types))
        pair = (onehot[:, :, :, None] * foreign[:, :, None, :]).reshape(len(x), k, -1)
        s = 1.0 / (1.0 + np.exp(-mlp("node", np.concatenate([onehot, foreign, pair], 2))))
        s = np.where(own.sum(2) > 0, s, 1.0)
        return b * s.min(1)

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
