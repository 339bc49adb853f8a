"""The sharder keeps the global batch and data order whatever the number of workers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from elastic_mxnet.training.sharder import DataSharder


@given(
    st.integers(1, 300),
    st.integers(1, 64),
    st.integers(0, 50),
    st.integers(1, 9),
    st.integers(0, 5),
)
def test_ranks_partition_the_global_batch(num_samples, batch, iteration, workers, seed):
    sharder = DataSharder(num_samples, batch, seed)
    parts = [sharder.indices(iteration, r, workers) for r in range(workers)]
    assert np.array_equal(np.concatenate(parts), sharder.global_indices(iteration))
    assert sum(len(p) for p in parts) == batch
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_each_epoch_is_a_permutation_and_batches_straddle_epochs():
    sharder = DataSharder(num_samples=10, global_batch=4, seed=3)
    stream = np.concatenate([sharder.global_indices(t) for t in range(5)])  # 20 = two epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert len(sharder.global_indices(2)) == 4  # positions 8..11 cross the epoch boundary


def test_same_seed_same_order_other_seed_other_order():
    a, b, c = DataSharder(100, 8, 1), DataSharder(100, 8, 1), DataSharder(100, 8, 2)
    assert np.array_equal(a.global_indices(3), b.global_indices(3))
    assert not np.array_equal(a.global_indices(3), c.global_indices(3))
    assert a.epochs_done(25) == 2.0
