"""Proportional prioritized replay (Schaul et al. 2016, "Prioritized Experience Replay").

Transition i is sampled with probability P(i) = p_i / sum_j p_j, where p_i = (|td_i| + eps)^alpha
from the learner's last :meth:`PrioritizedReplay.update_priorities` (new transitions get the
largest priority seen so far, so each is sampled soon). A batch of B is stratified: one draw from
each of B equal slices of the total priority mass. Importance weights correct the bias:
w_i = (N * P(i))^-beta / max_j w_j, with beta annealed linearly from ``beta0`` to 1 over
``beta_steps`` calls to :meth:`~PrioritizedReplay.sample`.
Priorities live in segment trees beside the :class:`~surreal_redis.replay.storage.TransitionStorage`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np

from surreal_redis.chunks import TransitionBatch
from surreal_redis.codec import Tree
from surreal_redis.replay.segment_tree import NUMBA_INSTALLED, MinSegmentTree, SumSegmentTree
from surreal_redis.replay.storage import Replay, TransitionStorage
from surreal_redis.replay.uniform import UniformReplayConfig

log = logging.getLogger(__name__)

KERNELS = ("auto", "numba", "numpy")


@dataclass(frozen=True)
class PrioritizedReplayConfig(UniformReplayConfig):
    """Settings of :class:`PrioritizedReplay` (plus those of :class:`UniformReplayConfig`)."""

    alpha: float = 0.6
    """priority exponent; 0 is uniform sampling."""
    beta0: float = 0.4
    """importance-weight exponent at the first sample."""
    beta_steps: int = 100_000
    """number of ``sample`` calls over which beta rises linearly to 1."""
    eps: float = 1e-6
    """added to |td error| so no transition gets probability 0."""
    kernels: Literal["auto", "numba", "numpy"] = "auto"
    """segment-tree kernels: "numba" (compiled, needs numba), "numpy", or "auto" (numba when
    installed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.alpha >= 0.0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if not 0.0 <= self.beta0 <= 1.0:
            raise ValueError(f"beta0 must be in [0, 1], got {self.beta0}")
        if self.beta_steps < 1:
            raise ValueError(f"beta_steps must be >= 1, got {self.beta_steps}")
        if not self.eps > 0.0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {self.kernels!r}")
        if self.kernels == "numba" and not NUMBA_INSTALLED:
            raise ValueError("kernels 'numba' needs numba (pip install 'surreal-redis[fast]')")


class PrioritizedReplay(Replay):
    """Transitions sampled in proportion to their priority (DDPG or SAC with PER). A slot overwritten between ``sample`` and ``update_priorities`` takes the priority meant for
    the transition it replaced.
    """

    def __init__(self, config: PrioritizedReplayConfig) -> None:
        super().__init__(TransitionStorage(config.capacity, config.dedup_min_bytes))
        self.config = config
        compiled = None if config.kernels == "auto" else config.kernels == "numba"
        self._sum = SumSegmentTree(config.capacity, compiled)
        self._min = MinSegmentTree(config.capacity, compiled)
        if config.kernels == "auto" and not self._sum.compiled:
            log.info("prioritized replay: numba is not installed, so the priority trees run numpy kernels "
                     "(the 'fast' extra samples about twice as fast)")
        self._max_priority = 1.0  # largest p_i = (|td| + eps)^alpha so far
        self._num_samples = 0

    @property
    def beta(self) -> float:
        """Importance-weight exponent used by the next :meth:`sample`."""
        progress = min(1.0, self._num_samples / self.config.beta_steps)
        return self.config.beta0 + (1.0 - self.config.beta0) * progress

    def insert(self, obs: Tree, actions: np.ndarray, rewards: np.ndarray, next_obs: Tree,
               discounts: np.ndarray) -> np.ndarray:
        with self._lock:  # the new transitions get the largest priority so far
            indices = super().insert(obs, actions, rewards, next_obs, discounts)
            self._sum[indices] = self._max_priority
            self._min[indices] = self._max_priority
            return indices

    def sample(self, batch_size: int, rng: np.random.Generator) -> TransitionBatch:
        """``batch_size`` transitions drawn in proportion to priority (stratified), with float32 ``[B]``
        importance weights in (0, 1]. Raises ValueError when empty; never blocks."""
        with self._lock:
            self.storage.check_can_sample(batch_size)
            total = self._sum.sum()
            prefixsums = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
            # rounding can push a prefix sum to the end of the tree, past the last stored slot
            indices = np.minimum(self._sum.find_prefixsum_idx(prefixsums), len(self) - 1)
            # w_i / max w = (N P_i)^-beta / (N P_min)^-beta = (p_i / p_min)^-beta
            weights = (self._sum[indices] / self._min.min()) ** -self.beta
            self._num_samples += 1
            return self.storage.gather(indices, weights.astype(np.float32))

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Priorities (|td| + eps)^alpha of slots ``indices`` (int ``[B]``, ``TransitionBatch.indices``)
        from their TD errors (float ``[B]``, any sign)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        td_errors = np.asarray(td_errors, dtype=np.float64).reshape(-1)
        if indices.shape != td_errors.shape:
            raise ValueError(f"update_priorities: {len(indices)} indices but {len(td_errors)} td errors")
        if not np.all(np.isfinite(td_errors)):
            raise ValueError(f"update_priorities: td errors must be finite, got {td_errors[~np.isfinite(td_errors)][:4]}")
        with self._lock:
            if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
                raise ValueError(f"update_priorities: indices must be in [0, {len(self)}), got "
                                 f"{indices.min()}..{indices.max()}")
            priorities = (np.abs(td_errors) + self.config.eps) ** self.config.alpha
            self._sum[indices] = priorities
            self._min[indices] = priorities
            if len(priorities):
                self._max_priority = max(self._max_priority, float(priorities.max()))
