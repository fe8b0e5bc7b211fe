"""Segment trees against brute force, with the numpy and (where numba is installed) the compiled kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surreal_redis.replay.segment_tree import NUMBA_INSTALLED, MinSegmentTree, SumSegmentTree

needs_numba = pytest.mark.skipif(not NUMBA_INSTALLED, reason="numba is not installed (the fast extra)")


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


@pytest.mark.parametrize("kernels", ["numpy", "numpy-small-dense", pytest.param("compiled", marks=needs_numba)])
@settings(max_examples=150, deadline=None)
@given(trees_with_updates(), st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=30))
def test_sum_min_and_prefix_search_match_brute_force(kernels, case, fractions):
    capacity, rounds = case
    if kernels == "numpy-small-dense":
        sums, mins = SmallDenseSum(capacity, compiled=False), SmallDenseMin(capacity, compiled=False)
    else:
        compiled = kernels == "compiled"
        sums, mins = SumSegmentTree(capacity, compiled), MinSegmentTree(capacity, compiled)
        assert sums.compiled == mins.compiled == compiled
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


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_large_batches_match_brute_force(compiled):
    rng = np.random.default_rng(7)
    capacity = 5000  # several levels below the numpy kernels' dense part
    sums, mins = SumSegmentTree(capacity, compiled), MinSegmentTree(capacity, compiled)
    values = rng.integers(0, 100, capacity).astype(np.float64)  # integers: every sum is exact
    sums[np.arange(capacity)] = values
    mins[np.arange(capacity)] = values
    for _ in range(5):
        indices = rng.choice(capacity, 256, replace=False)
        values[indices] = rng.integers(0, 100, 256)
        sums[indices] = values[indices]
        mins[indices] = values[indices]
        assert sums.sum() == values.sum() and mins.min() == values.min()
        prefixsums = np.sort(rng.random(256)) * values.sum()
        expected = np.searchsorted(np.cumsum(values), prefixsums, side="right")
        np.testing.assert_array_equal(sums.find_prefixsum_idx(prefixsums), expected)
    assert sums.find_prefixsum_idx(np.array([])).shape == (0,)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_index_outside_capacity_is_an_error(compiled):
    tree = SumSegmentTree(5, compiled)
    with pytest.raises(IndexError, match=r"index 5 is outside \[0, 5\)"):
        tree[np.array([1, 5])] = 1.0
    with pytest.raises(IndexError, match=r"index -1 is outside"):
        tree[np.array([-1])]
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        SumSegmentTree(0)
