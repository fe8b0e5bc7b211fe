"""Segment trees against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surreal_redis.replay.segment_tree import MinSegmentTree, SumSegmentTree


@st.composite
def trees_with_updates(draw):
    capacity = draw(st.integers(1, 70))
    rounds = draw(st.lists(
        st.lists(st.tuples(st.integers(0, capacity - 1), st.integers(0, 50)), min_size=1, max_size=20),
        min_size=1, max_size=4))
    return capacity, rounds


class SmallDenseSum(SumSegmentTree):
    DENSE_NODES = 4  # so small trees exercise the node-by-node levels too


class SmallDenseMin(MinSegmentTree):
    DENSE_NODES = 1


@settings(max_examples=150, deadline=None)
@given(trees_with_updates(), st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=30),
       st.booleans())
def test_sum_min_and_prefix_search_match_brute_force(case, fractions, small_dense):
    capacity, rounds = case
    if small_dense:
        sums, mins = SmallDenseSum(capacity), SmallDenseMin(capacity)
    else:
        sums, mins = SumSegmentTree(capacity), MinSegmentTree(capacity)
    values = np.zeros(capacity)
    ever_set = np.zeros(capacity, dtype=bool)
    for updates in rounds:
        # integer values keep every float sum exact, so comparisons can be exact
        last = dict(updates)  # a batch with repeated indices keeps the last value
        indices = np.array(list(last), dtype=np.int64)
        new = np.array(list(last.values()), dtype=np.float64)
        sums[indices] = new
        mins[indices] = new
        values[indices] = new
        ever_set[indices] = True
        assert sums.sum() == values.sum()
        assert mins.min() == values[ever_set].min()
        np.testing.assert_array_equal(sums[np.arange(capacity)], values)
    total = values.sum()
    if total == 0:
        return
    prefixsums = np.array(fractions) * total
    expected = np.searchsorted(np.cumsum(values), prefixsums, side="right")
    found = sums.find_prefixsum_idx(prefixsums)
    np.testing.assert_array_equal(found, expected)
    assert np.all(values[found] > 0)


def test_index_outside_capacity_is_an_error():
    tree = SumSegmentTree(5)
    with pytest.raises(IndexError, match=r"index 5 is outside \[0, 5\)"):
        tree[np.array([1, 5])] = 1.0
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        SumSegmentTree(0)
