"""Builds what the learner needs from an algorithm's section, through its spec: the trainer and
what its chunks must carry (the feed of its regime: :mod:`surreal_redis.learner.parts`).
The learner loop itself never names an algorithm."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from surreal_redis.algos.base import Trainer
from surreal_redis.algos.registry import spec_of
from surreal_redis.algos.spec import ChunkNeeds


def make_trainer(section: Any, obs_space: gym.Space, action_space: gym.Space, seed: int = 0) -> Trainer:
    """The learner-side trainer of the algorithm ``section`` belongs to (CUDA when its device says so)."""
    return spec_of(section).make_trainer(section, obs_space, action_space, seed)


def chunk_needs(section: Any, action_space: gym.Space) -> ChunkNeeds:
    """What the algorithm's update reads from every chunk."""
    return spec_of(section).chunk_needs(section, action_space)
