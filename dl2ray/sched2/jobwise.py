"""SCHED²'s Q-network with one scorer shared by every window job (``arch: jobwise``).

The paper's network (:mod:`dl2ray.sched2.qnet`) reads all J window jobs through one dense
layer and has one output per window position, so "which job is shortest" must be learned for
every position separately (at J = 80 it agreed with SAF on 27.5 % of held-out decisions).
Here the same weights score each job against a summary of the cluster, so the network is
permutation-equivariant in the jobs and the window can grow without more weights:

- servers: each row ``S_n`` (M,) of the GPU matrix through the shared layer
  ``F_n = relu(W_s S_n + b_s)`` (width ``hs``; SCHED²'s per-server branch), pooled over servers
  by mean and max;
- context ``c = relu(W_c [mean_n F_n, max_n F_n, stats] + b_c)`` (width ``hc``; stats = the 4
  numbers about jobs outside the window);
- job ``i`` (its ``F_job`` features, :mod:`dl2ray.sched2.state`):
  ``h_i = relu(W_2 relu(W_1 [x_i, c] + b_1) + b_2)``, ``Q(s, i) = w_q · h_i + b_q``;
- ϕ: ``Q(s, ϕ) = w_φ · relu(W_φ [mean_{i present} h_i, c] + b_φ) + b_φ'`` (a job is present when
  its GPU-count feature is > 0).

Output (B, J+1) like the dense network, so DQN, imitation and the decision loop are unchanged.
:class:`NumpyJobwiseQNet` runs the same arithmetic in numpy for ``sched2:PATH``.
"""

from __future__ import annotations

import numpy as np

from dl2ray.sched2.state import K_LEVELS, Sched2Shape, masked_greedy

HIDDEN = (32, 64, 64)
"""Widths: per-server layer ``hs``, context ``hc``, job scorer ``h``."""

GPU_COLUMN = len(K_LEVELS)
"""Index of a window job's GPU-count feature (> 0 for every present job)."""


def _split(shape: Sched2Shape, x):
    """Flat states (B, state_dim) → (servers (B, N, M), jobs (B, J, F), stats (B, 4)); torch or numpy."""
    nm = shape.servers * shape.gpus
    jd = shape.window * shape.job_features
    servers = x[:, :nm].reshape(-1, shape.servers, shape.gpus)
    jobs = x[:, nm : nm + jd].reshape(-1, shape.window, shape.job_features)
    return servers, jobs, x[:, nm + jd :]


def build_jobwise(shape: Sched2Shape, hidden: tuple[int, int, int] = HIDDEN, seed: int = 0):
    """A freshly initialised torch module (torch's default init from ``torch.manual_seed(seed)``)."""
    import torch
    from torch import nn

    hs, hc, h = hidden

    class JobwiseQNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shape, self.hidden = shape, hidden
            self.server = nn.Linear(shape.gpus, hs)
            self.context = nn.Linear(2 * hs + 4, hc)
            self.job1 = nn.Linear(shape.job_features + hc, h)
            self.job2 = nn.Linear(h, h)
            self.q = nn.Linear(h, 1)
            self.phi1 = nn.Linear(h + hc, h)
            self.phi2 = nn.Linear(h, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """``x`` (B, state_dim) → Q (B, J+1)."""
            servers, jobs, stats = _split(shape, x)
            f = torch.relu(self.server(servers))
            c = torch.relu(self.context(torch.cat([f.mean(1), f.amax(1), stats], dim=1)))
            cj = c[:, None, :].expand(-1, shape.window, -1)
            hj = torch.relu(self.job2(torch.relu(self.job1(torch.cat([jobs, cj], dim=2)))))
            q_jobs = self.q(hj)[:, :, 0]
            present = (jobs[:, :, GPU_COLUMN] > 0).to(hj.dtype)[:, :, None]
            pooled = (hj * present).sum(1) / present.sum(1).clamp(min=1.0)
            q_phi = self.phi2(torch.relu(self.phi1(torch.cat([pooled, c], dim=1))))
            return torch.cat([q_jobs, q_phi], dim=1)

    torch.manual_seed(seed)
    return JobwiseQNet()


class NumpyJobwiseQNet:
    """The same forward pass in numpy from a checkpoint's weights."""

    def __init__(self, shape: Sched2Shape, weights: dict[str, np.ndarray]) -> None:
        self.shape = shape
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}

    def _lin(self, name: str, x: np.ndarray) -> np.ndarray:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def q(self, x: np.ndarray) -> np.ndarray:
        """``x`` (state_dim,) or (B, state_dim) → Q (J+1,) or (B, J+1)."""
        x2 = np.atleast_2d(np.asarray(x, dtype=np.float64))
        servers, jobs, stats = _split(self.shape, x2)
        f = np.maximum(self._lin("server", servers), 0)
        c = np.maximum(self._lin("context", np.concatenate([f.mean(1), f.max(1), stats], 1)), 0)
        cj = np.broadcast_to(c[:, None, :], (len(x2), self.shape.window, c.shape[1]))
        hj = np.maximum(self._lin("job1", np.concatenate([jobs, cj], 2)), 0)
        hj = np.maximum(self._lin("job2", hj), 0)
        q_jobs = self._lin("q", hj)[:, :, 0]
        present = (jobs[:, :, GPU_COLUMN] > 0).astype(np.float64)[:, :, None]
        pooled = (hj * present).sum(1) / np.maximum(present.sum(1), 1.0)
        q_phi = self._lin("phi2", np.maximum(self._lin("phi1", np.concatenate([pooled, c], 1)), 0))
        out = np.concatenate([q_jobs, q_phi], 1)
        return out[0] if np.ndim(x) == 1 else out

    def greedy(self, state: np.ndarray, mask: np.ndarray) -> int:
        """``argmax_a Q(s, a)`` over the allowed actions (lowest index on ties)."""
        return masked_greedy(self.q(state), mask)
