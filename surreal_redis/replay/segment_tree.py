"""Sum and min segment trees over numpy arrays, updated and searched a whole batch at a time.

The tree is an array of ``2 * size`` float64 nodes (``size`` = capacity rounded up to a power of
two): leaves at ``[size, 2 * size)``, node i's children at 2i and 2i+1, the root at 1. Nothing
loops in Python per item; the loops below run once per tree level, each step one numpy call over
the whole batch, and each numpy call costs microseconds however small. So the top of the tree
(the levels with at most ``DENSE_NODES`` nodes) is handled whole rather than node by node:

- a batch update writes the leaves, recomputes the touched parents level by level up to the
  dense part, then recomputes every node of the dense levels (a few thousand additions);
- a prefix-sum search takes the cumulative sums of the first dense-sized level, finds each query's
  node there with one ``searchsorted``, and walks down the remaining levels.

Parents are always recomputed from their children, never adjusted by deltas, so sums do not drift.
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

    DENSE_NODES = 1024  # a power of two; levels this small are updated and searched whole

    def __init__(self, capacity: int, operation: np.ufunc, neutral: float) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._size = 1 << (capacity - 1).bit_length()
        self._operation = operation
        self._tree = np.full(2 * self._size, neutral, dtype=np.float64)
        self._dense = min(self._size, self.DENSE_NODES)  # first node of the widest dense level

    def __setitem__(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set leaves ``indices`` (int ``[B]``) to ``values`` (``[B]`` or a scalar)."""
        nodes = self._leaf_nodes(indices)
        if len(nodes) == 0:
            return
        tree, operation = self._tree, self._operation
        tree[nodes] = values
        while nodes[0] >= 2 * self._dense:  # all nodes are on the same level
            # duplicate parents recompute the same value, so no np.unique is needed
            nodes >>= 1
            left = nodes << 1
            tree[nodes] = operation(tree.take(left), tree.take(left + 1))
        level = (1 << (int(nodes[0]).bit_length() - 1)) >> 1  # first node of the parents' level
        while level >= 1:
            operation(tree[2 * level : 4 * level : 2], tree[2 * level + 1 : 4 * level : 2],
                      out=tree[level : 2 * level])
            level >>= 1

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices`` (int ``[B]``), float64 ``[B]``."""
        return self._tree.take(self._leaf_nodes(indices))

    def reduce(self) -> float:
        """``operation`` over all leaves (the root)."""
        return float(self._tree[1])

    def _leaf_nodes(self, indices: np.ndarray) -> np.ndarray:
        indices = np.array(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.capacity):
            bad = indices[(indices < 0) | (indices >= self.capacity)][0]
            raise IndexError(f"segment tree index {bad} is outside [0, {self.capacity})")
        indices += self._size
        return indices


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
        tree, first = self._tree, self._dense
        remaining = np.array(prefixsums, dtype=np.float64).reshape(-1)
        cumsum = np.cumsum(tree[first : 2 * first])
        offset = np.searchsorted(cumsum, remaining, side="right")
        np.minimum(offset, first - 1, out=offset)
        remaining -= np.where(offset > 0, cumsum[offset - 1], 0.0)
        nodes = offset + first
        while len(nodes) and nodes[0] < self._size:  # all nodes are on the same level
            nodes <<= 1
            left_sum = tree.take(nodes)
            go_right = remaining >= left_sum
            remaining -= left_sum * go_right  # arithmetic, not a masked subtract: no branches
            nodes += go_right
        return nodes - self._size


class MinSegmentTree(SegmentTree):
    """Minimum of the leaves set so far (unset leaves hold +inf)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, float("inf"))

    def min(self) -> float:
        """Minimum over all leaves."""
        return self.reduce()
