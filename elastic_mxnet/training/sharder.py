"""Data sharding that follows membership: the global batch is fixed, its split is not.

Sample order is a stream of epochs, each a permutation of ``range(num_samples)``
drawn from ``numpy.random.default_rng((seed, epoch))``. Global batch ``t`` is
positions ``[t*B, (t+1)*B)`` of that stream (a batch may straddle two epochs).
Worker ``rank`` of ``n`` takes a contiguous slice of it: the first ``B % n``
ranks get ``B // n + 1`` samples, the others ``B // n``. So the union over
ranks of iteration ``t`` is the same for every ``n``: scaling changes each
worker's batch size, never the global batch or the data order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DataSharder:
    """Indices of the samples a worker trains on at a given iteration.

    Attributes:
        num_samples: size of the dataset (samples).
        global_batch: samples per iteration summed over all workers.
        seed: seed of the per-epoch permutations.
    """

    num_samples: int
    global_batch: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.global_batch < 1:
            raise ValueError("num_samples and global_batch must be >= 1")

    def local_batch(self, rank: int, num_workers: int) -> int:
        """Samples per iteration of worker ``rank`` out of ``num_workers``."""
        if not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} outside [0, {num_workers})")
        base, extra = divmod(self.global_batch, num_workers)
        return base + (1 if rank < extra else 0)

    def global_indices(self, iteration: int) -> np.ndarray:
        """Sample indices of global batch ``iteration``, shape ``(global_batch,)``, int64."""
        first = iteration * self.global_batch
        last = first + self.global_batch
        parts = []
        epoch = first // self.num_samples
        while epoch * self.num_samples < last:
            perm = self._permutation(epoch)
            lo = max(first - epoch * self.num_samples, 0)
            hi = min(last - epoch * self.num_samples, self.num_samples)
            parts.append(perm[lo:hi])
            epoch += 1
        return np.concatenate(parts)

    def indices(self, iteration: int, rank: int, num_workers: int) -> np.ndarray:
        """Sample indices of worker ``rank`` of ``num_workers`` at ``iteration`` (int64)."""
        size = self.local_batch(rank, num_workers)
        base, extra = divmod(self.global_batch, num_workers)
        start = rank * base + min(rank, extra)
        return self.global_indices(iteration)[start : start + size]

    def epochs_done(self, iteration: int) -> float:
        """Epochs completed after ``iteration`` iterations."""
        return iteration * self.global_batch / self.num_samples

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_samples)
