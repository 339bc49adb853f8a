"""Property tests of chunking, best-fit balancing and minimal-movement rebalancing."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_mxnet.protocol.assignment import (
    UNASSIGNED,
    best_fit,
    is_balanced,
    loads,
    make_layout,
    moved_bytes,
    rebalance,
)

sizes_st = st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=60)
ps_st = st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=8, unique=True)


@given(
    st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=6),
    st.integers(1, 500),
)
def test_layout_covers_every_element_once_in_small_chunks(shapes, chunk_elems):
    layout = make_layout(shapes, chunk_elems)
    for index, shape in enumerate(shapes):
        n = 1
        for d in shape:
            n *= d
        pieces = [c for c in layout if c.param == index]
        assert pieces[0].start == 0 and pieces[-1].stop == n
        assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))
        assert all(0 < c.size <= chunk_elems for c in pieces)
        assert max(c.size for c in pieces) - min(c.size for c in pieces) <= 1
    assert [c.cid for c in layout] == list(range(len(layout)))


@given(sizes_st, ps_st)
def test_best_fit_is_balanced_within_one_chunk(sizes, ps):
    owners = best_fit(sizes, ps)
    assert is_balanced(sizes, owners, ps)
    held = loads(sizes, owners, ps)
    assert max(held.values()) - min(held.values()) <= max(sizes)
    assert sum(held.values()) == sum(sizes)


@given(sizes_st, ps_st, ps_st)
def test_rebalance_is_balanced_and_moves_only_when_needed(sizes, old_ps, new_ps):
    old = best_fit(sizes, old_ps)
    new = rebalance(sizes, old, new_ps)
    assert is_balanced(sizes, new, new_ps)
    # chunks of PS that stay are only moved if the old assignment is unbalanced over new_ps
    if set(new_ps) == set(old_ps):
        assert new == old
    gone = sum(s for s, o in zip(sizes, old, strict=True) if o not in new_ps)
    assert moved_bytes(sizes, old, new) >= gone


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 100), min_size=1, max_size=6),
    st.integers(1, 3),
    st.sampled_from(["add", "remove", "same"]),
    st.booleans(),
)
def test_rebalance_moves_at_most_one_chunk_more_than_the_optimum(
    sizes, n_old, change, from_best_fit
):
    """Exhaustive check on small instances: optimum over all balanced assignments."""
    old_ps = list(range(n_old))
    old = best_fit(sizes, old_ps) if from_best_fit else [i % n_old for i in range(len(sizes))]
    new_ps = {"add": [*old_ps, n_old], "remove": old_ps[1:] or old_ps, "same": old_ps}[change]
    new = rebalance(sizes, old, new_ps)
    optimum = min(
        moved_bytes(sizes, old, cand)
        for cand in itertools.product(new_ps, repeat=len(sizes))
        if is_balanced(sizes, cand, new_ps)
    )
    assert moved_bytes(sizes, old, new) <= optimum + max(sizes)


@given(sizes_st, ps_st)
def test_adding_a_ps_moves_about_its_fair_share(sizes, ps):
    old = best_fit(sizes, ps)
    new_id = max(ps) + 1
    new = rebalance(sizes, old, [*ps, new_id])
    fair = sum(sizes) / (len(ps) + 1)
    assert moved_bytes(sizes, old, new) <= fair + 2 * max(sizes)


def test_unassigned_chunks_are_placed():
    sizes = [5, 3, 3, 1]
    owners = rebalance(sizes, [UNASSIGNED] * 4, [7, 9])
    assert set(owners) == {7, 9} and is_balanced(sizes, owners, [7, 9])
