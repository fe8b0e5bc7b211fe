"""Uniform off-policy replay: every stored transition equally likely (DDPG's and SAC's replay)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surreal_redis.chunks import TransitionBatch
from surreal_redis.replay.storage import Replay, TransitionStorage


@dataclass(frozen=True)
class UniformReplayConfig:
    """Settings of :class:`UniformReplay`."""

    capacity: int = 1_000_000
    """number of transitions kept; the oldest are overwritten first."""
    dedup_min_bytes: int = 1024
    """observation leaves of at least this many bytes per transition (images, frames) are stored
    once per distinct content in a reference-counted pool."""

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.dedup_min_bytes < 1:
            raise ValueError(f"dedup_min_bytes must be >= 1, got {self.dedup_min_bytes}")


class UniformReplay(Replay):
    """Transitions sampled uniformly with replacement."""

    def __init__(self, config: UniformReplayConfig) -> None:
        super().__init__(TransitionStorage(config.capacity, config.dedup_min_bytes))
        self.config = config

    def sample(self, batch_size: int, rng: np.random.Generator) -> TransitionBatch:
        """``batch_size`` transitions drawn uniformly with replacement; ``weights`` are ones.
        Raises ValueError when the replay is empty. Never blocks."""
        with self._lock:
            self.storage.check_can_sample(batch_size)
            indices = rng.integers(0, len(self.storage), size=batch_size, dtype=np.int64)
            return self.storage.gather(indices, np.ones(batch_size, dtype=np.float32))

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Nothing: every slot stays equally likely whatever its TD error."""
