"""Builds what the learner needs from an algorithm's section, through its spec: the trainer, the
feed of its regime (on-policy FIFO or off-policy replay) and what its chunks must carry.
The learner loop itself never names an algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from surreal_redis.algos.base import Trainer
from surreal_redis.algos.registry import spec_of
from surreal_redis.algos.spec import ChunkNeeds
from surreal_redis.replay.feeds import Feed, OffPolicyConfig, OffPolicyFeed, OnPolicyFeed
from surreal_redis.replay.fifo import FIFOReplayConfig


@dataclass(frozen=True)
class FeedSettings:
    """The learner's settings of both regimes; each feed takes the ones it uses.

    Attributes:
        fifo, steps_per_update: the on-policy FIFO (``replay.fifo``, ``learner.steps_per_update``).
        off_policy: the shared off-policy section (``off_policy``).
    """

    fifo: FIFOReplayConfig
    steps_per_update: int
    off_policy: OffPolicyConfig

    @classmethod
    def of(cls, config: Any) -> FeedSettings:
        """The settings of an :class:`~surreal_redis.config.ExperimentConfig`."""
        return cls(config.replay.fifo, config.learner.steps_per_update, config.off_policy)


def make_trainer(section: Any, obs_space: gym.Space, action_space: gym.Space, seed: int = 0) -> Trainer:
    """The learner-side trainer of the algorithm ``section`` belongs to (CUDA when its device says so)."""
    return spec_of(section).make_trainer(section, obs_space, action_space, seed)


def make_feed(section: Any, settings: FeedSettings, seed: int) -> Feed:
    """The learner's feed for the algorithm's regime (``seed``: replay sampling)."""
    if spec_of(section).on_policy:
        return OnPolicyFeed(settings.fifo, settings.steps_per_update)
    return OffPolicyFeed(settings.off_policy, gamma=section.gamma, seed=seed)


def chunk_needs(section: Any, action_space: gym.Space) -> ChunkNeeds:
    """What the algorithm's update reads from every chunk."""
    return spec_of(section).chunk_needs(section, action_space)
