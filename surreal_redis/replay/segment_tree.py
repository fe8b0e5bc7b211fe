"""Sum and min segment trees over numpy arrays, updated and searched a whole batch at a time.

The tree is an array of ``2 * size`` float64 nodes (``size`` = capacity rounded up to a power of
two): leaves at ``[size, 2 * size)``, node i's children at 2i and 2i+1, the root at 1. Parents are
always recomputed from their children, never adjusted by deltas, so sums do not drift.

Two interchangeable kernels do the batch work: compiled loops (numba, the ``fast`` extra) when
numba is installed, else numpy. A numpy call has a fixed cost however small, so the numpy kernels
handle the top of the tree (levels of at most ``DENSE_NODES`` nodes) whole: an update recomputes
the touched parents up to the dense part, then every dense node; a search finds each query's node
in the widest dense level with one ``searchsorted`` over its cumulative sums, then walks down.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from types import SimpleNamespace

import numpy as np

NUMBA_INSTALLED = importlib.util.find_spec("numba") is not None


@cache
def _compiled_kernels() -> SimpleNamespace:
    """The numba kernels, compiled on first use (and cached on disk by numba).

    Each walks the whole batch one tree level at a time, so the memory loads of different items
    overlap instead of waiting for one another, and every step is branch-free arithmetic.
    """
    from numba import njit

    @njit(nogil=True, cache=True)
    def set_leaves(tree: np.ndarray, size: int, indices: np.ndarray, values: np.ndarray, take_min: bool) -> None:
        nodes = indices + size
        for k in range(nodes.shape[0]):
            tree[nodes[k]] = values[k]
        while nodes[0] > 1:  # all nodes are on the same level
            for k in range(nodes.shape[0]):
                node = nodes[k] >> 1
                nodes[k] = node
                left, right = tree[2 * node], tree[2 * node + 1]
                tree[node] = min(left, right) if take_min else left + right

    @njit(nogil=True, cache=True)
    def find_prefixsum(tree: np.ndarray, size: int, remaining: np.ndarray, out: np.ndarray) -> None:
        out[:] = 1
        while out[0] < size:  # all nodes are on the same level
            for k in range(out.shape[0]):
                node = out[k] << 1
                left_sum = tree[node]
                go_right = remaining[k] >= left_sum
                remaining[k] -= left_sum if go_right else 0.0
                out[k] = node + go_right
        out -= size

    return SimpleNamespace(set_leaves=set_leaves, find_prefixsum=find_prefixsum)


class SegmentTree:
    """A binary tree of ``capacity`` leaves whose internal nodes hold ``operation(left, right)``
    (``np.add`` or ``np.minimum``); leaves never set hold ``neutral``. ``compiled``: use the numba
    kernels (default: when numba is installed); False forces numpy.
    """

    DENSE_NODES = 1024  # a power of two; levels this small are updated and searched whole (numpy)

    def __init__(self, capacity: int, operation: np.ufunc, neutral: float, compiled: bool | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if operation not in (np.add, np.minimum):
            raise ValueError(f"operation must be np.add or np.minimum, got {operation!r}")
        if compiled and not NUMBA_INSTALLED:
            raise ValueError("compiled segment tree kernels need numba (pip install 'surreal-redis[fast]')")
        self.capacity = capacity
        self._size = 1 << (capacity - 1).bit_length()
        self._operation = operation
        self._tree = np.full(2 * self._size, neutral, dtype=np.float64)
        self._dense = min(self._size, self.DENSE_NODES)  # first node of the widest dense level
        self._kernels = _compiled_kernels() if (NUMBA_INSTALLED if compiled is None else compiled) else None

    @property
    def compiled(self) -> bool:
        return self._kernels is not None  # the numba kernels do the work

    def __setitem__(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set leaves ``indices`` (int ``[B]``) to ``values`` (``[B]`` or a scalar); the last repeat wins."""
        indices = self._checked(indices)
        if len(indices) == 0:
            return
        if self._kernels is not None:
            values = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float64), indices.shape))
            self._kernels.set_leaves(self._tree, self._size, indices, values, self._operation is np.minimum)
            return
        tree, operation = self._tree, self._operation
        nodes = indices + self._size
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
        return self._tree.take(self._checked(indices) + self._size)

    def reduce(self) -> float:
        """``operation`` over all leaves (the root)."""
        return float(self._tree[1])

    def _checked(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` as a contiguous int64 ``[B]`` array (not copied: callers never write to it);
        IndexError names one outside."""
        indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.capacity):
            bad = indices[(indices < 0) | (indices >= self.capacity)][0]
            raise IndexError(f"segment tree index {bad} is outside [0, {self.capacity})")
        return indices


class SumSegmentTree(SegmentTree):
    """Sums of non-negative leaves, with prefix-sum search for proportional sampling."""

    def __init__(self, capacity: int, compiled: bool | None = None) -> None:
        super().__init__(capacity, np.add, 0.0, compiled)

    def sum(self) -> float:
        return self.reduce()

    def find_prefixsum_idx(self, prefixsums: np.ndarray) -> np.ndarray:
        """For each p in ``prefixsums`` (float ``[B]``, 0 <= p < :meth:`sum`), the leaf i with
        ``sum(leaves[:i]) <= p < sum(leaves[:i+1])`` (never a leaf holding 0); int64 ``[B]``. A p at
        or above the sum (rounding) walks to the last leaf, which may be unused: callers clip."""
        remaining = np.array(prefixsums, dtype=np.float64).reshape(-1)
        if self._kernels is not None:
            found = np.empty(len(remaining), dtype=np.int64)
            if len(found):
                self._kernels.find_prefixsum(self._tree, self._size, remaining, found)
            return found
        tree, first = self._tree, self._dense
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

    def __init__(self, capacity: int, compiled: bool | None = None) -> None:
        super().__init__(capacity, np.minimum, float("inf"), compiled)

    def min(self) -> float:
        return self.reduce()
