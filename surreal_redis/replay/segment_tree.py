"""Sum and min segment trees over numpy arrays, updated and searched a whole batch at a time.

The tree is an array of ``2 * size`` float64 nodes (``size`` = capacity rounded up to a power of
two): leaves at ``[size, 2 * size)``, node i's children at 2i and 2i+1, the root at 1. A batch
update writes the leaves and then recomputes one level of parents per iteration, so the work is
O(B log N) in numpy calls of length B, with no Python loop per item. Parents are recomputed from
their children rather than adjusted by deltas, so sums do not drift.
"""

from __future__ import annotations

import numpy as np


class SegmentTree:
    """A binary tree whose internal nodes hold ``operation(left, right)``.

    Args:
        capacity: number of leaves addressed by callers (indices ``0 <= i < capacity``).
        operation: an associative binary numpy ufunc (``np.add``, ``np.minimum``).
        neutral: the operation's identity, the value of leaves never set.
    """

    def __init__(self, capacity: int, operation: np.ufunc, neutral: float) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._size = 1 << (capacity - 1).bit_length()
        self._operation = operation
        self._tree = np.full(2 * self._size, neutral, dtype=np.float64)

    def __setitem__(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set leaves ``indices`` (int ``[B]``) to ``values`` (``[B]`` or a scalar)."""
        nodes = self._leaf_nodes(indices)
        if len(nodes) == 0:
            return
        self._tree[nodes] = values
        while nodes[0] > 1:
            # duplicate parents just recompute the same value, so no np.unique is needed
            nodes = nodes >> 1
            self._tree[nodes] = self._operation(self._tree[2 * nodes], self._tree[2 * nodes + 1])

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices`` (int ``[B]``), float64 ``[B]``."""
        return self._tree[self._leaf_nodes(indices)]

    def reduce(self) -> float:
        """``operation`` over all leaves (the root)."""
        return float(self._tree[1])

    def _leaf_nodes(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.capacity):
            bad = indices[(indices < 0) | (indices >= self.capacity)][0]
            raise IndexError(f"segment tree index {bad} is outside [0, {self.capacity})")
        return indices + self._size


class SumSegmentTree(SegmentTree):
    """Sums of non-negative leaves, with prefix-sum search for proportional sampling."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.add, 0.0)

    def sum(self) -> float:
        """Sum of all leaves."""
        return self.reduce()

    def find_prefixsum_idx(self, prefixsums: np.ndarray) -> np.ndarray:
        """For each p in ``prefixsums`` (float ``[B]``, 0 <= p < :meth:`sum`), the leaf i with
        ``sum(leaves[:i]) <= p < sum(leaves[:i+1])``; int64 ``[B]``.

        Leaves holding 0 are never returned for p in range. A p at or above the sum (rounding)
        walks to the last leaf, which may be unused: callers clip to their size.
        """
        remaining = np.array(prefixsums, dtype=np.float64).reshape(-1)
        nodes = np.ones(len(remaining), dtype=np.int64)
        while len(nodes) and nodes[0] < self._size:  # all nodes are on the same level
            left = 2 * nodes
            left_sum = self._tree[left]
            go_right = remaining >= left_sum
            remaining -= np.where(go_right, left_sum, 0.0)
            nodes = left + go_right
        return nodes - self._size


class MinSegmentTree(SegmentTree):
    """Minimum of the leaves set so far (unset leaves hold +inf)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, float("inf"))

    def min(self) -> float:
        """Minimum over all leaves."""
        return self.reduce()
