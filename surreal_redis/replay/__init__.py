"""Replay memories: FIFO (on-policy), uniform and prioritized (off-policy), rate limiting.

:func:`make_replay` builds the off-policy replay the ``off_policy.replay`` section selects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from surreal_redis.replay.prioritized import PrioritizedReplay, PrioritizedReplayConfig
from surreal_redis.replay.storage import Replay
from surreal_redis.replay.uniform import UniformReplay

__all__ = ["Replay", "ReplayConfig", "make_replay"]


@dataclass(frozen=True)
class ReplayConfig(PrioritizedReplayConfig):
    """The off-policy replay (YAML ``off_policy.replay``): which selector samples it, with Reverb's
    names, and its storage. ``alpha``, ``beta0``, ``beta_steps``, ``eps`` and ``kernels`` apply to
    ``prioritized`` only."""

    selector: Literal["uniform", "prioritized"] = "uniform"
    """``uniform`` (every stored transition equally likely) or ``prioritized`` (proportional to its
    last TD error: the algorithm's loss is weighted by ``batch.weights`` and the TD errors its
    update returns become the new priorities)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.selector not in ("uniform", "prioritized"):
            raise ValueError(f"selector must be 'uniform' or 'prioritized', got {self.selector!r}")


def make_replay(config: ReplayConfig) -> Replay:
    """The replay ``config.selector`` names, with ``config``'s capacity and settings."""
    return PrioritizedReplay(config) if config.selector == "prioritized" else UniformReplay(config)
