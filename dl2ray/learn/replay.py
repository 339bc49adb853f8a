"""Experience replay: a ring buffer of the most recent decision steps, optionally prioritised (numpy).

Slots are added whole (every step of a slot, in order); when full, the
oldest steps are overwritten. :meth:`ReplayBuffer.sample` draws a minibatch
(``policy.minibatch``, 256 by default) with an explicit generator:

- **uniform**: ``min(n, size)`` distinct steps, each equally likely
  (with replacement only when the buffer holds fewer than ``n``);
- **prioritised** (Schaul et al., 2016): step ``i`` has priority
  ``p_i = |A_i| + ε_p`` — the magnitude of its advantage (the TD error
  ``y − V(s)``) when it was last in a minibatch; a new step gets the largest
  priority seen so far, so it is sampled soon. Draws are with replacement,
  ``P(i) = p_i^α / Σ_k p_k^α``, and the loss weighs step ``i`` by the
  importance weight ``w_i = (size·P(i))^(−β) / max_k w_k`` (in (0, 1]), which
  undoes the bias of the non-uniform draw as β → 1. Defaults α = 0.6,
  β = 0.4, ε_p = 1e-3. (The published DL2 code used the slot reward as the
  priority and no importance weights.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.learn.rollout import Batch


@dataclass
class Sample:
    """A drawn minibatch: the steps, their buffer indices (n,), importance weights (n,) or None."""

    batch: Batch
    indices: np.ndarray
    weights: np.ndarray | None


class ReplayBuffer:
    """Ring buffer of ``capacity`` steps of state dim ``state_dim`` and ``action_dim`` actions."""

    def __init__(self, capacity: int, state_dim: int, action_dim: int, prioritized: bool = False,
                 alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-3) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity, self.prioritized = capacity, prioritized
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self._data = Batch(
            np.zeros((capacity, state_dim), np.float32), np.zeros((capacity, action_dim), bool),
            np.zeros(capacity, np.int64), np.zeros(capacity, np.float32),
            np.zeros((capacity, state_dim), np.float32), np.zeros(capacity, bool),
            np.zeros(capacity, np.float32),
        )
        self._priority = np.zeros(capacity, np.float64)
        self._max_priority = 1.0
        self._next = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Batch) -> None:
        """Append ``batch``'s steps, overwriting the oldest when full."""
        n = len(batch)
        if n == 0:
            return
        if n > self.capacity:  # only the newest `capacity` steps survive anyway
            batch = batch.take(np.arange(n - self.capacity, n))
            n = self.capacity
        idx = (self._next + np.arange(n)) % self.capacity
        for f in Batch.FIELDS:
            getattr(self._data, f)[idx] = getattr(batch, f)
        self._priority[idx] = self._max_priority
        self._next = int((self._next + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def probabilities(self) -> np.ndarray:
        """``P(i)`` over the ``size`` stored steps (uniform unless prioritised)."""
        if not self.prioritized:
            return np.full(self.size, 1.0 / self.size)
        scaled = self._priority[:self.size] ** self.alpha
        return scaled / scaled.sum()

    def sample(self, n: int, rng: np.random.Generator) -> Sample:
        """A minibatch of ``n`` steps (see the module docstring)."""
        if self.size == 0:
            raise ValueError("sample() from an empty replay buffer")
        if not self.prioritized:
            idx = rng.choice(self.size, size=n, replace=self.size < n)
            return Sample(self._data.take(idx), idx, None)
        p = self.probabilities()
        idx = rng.choice(self.size, size=n, replace=True, p=p)
        w = (self.size * p[idx]) ** (-self.beta)
        return Sample(self._data.take(idx), idx, (w / w.max()).astype(np.float32))

    def update_priorities(self, indices: np.ndarray, errors: np.ndarray) -> None:
        """Set ``p_i = |errors_i| + ε_p`` for the sampled ``indices`` (no-op when not prioritised)."""
        if not self.prioritized:
            return
        p = np.abs(np.asarray(errors, np.float64)) + self.eps
        self._priority[indices] = p
        self._max_priority = max(self._max_priority, float(p.max()))
