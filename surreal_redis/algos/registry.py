"""Builds what the learner needs from an algorithm's config section (``ExperimentConfig.algo_config``):
the trainer, the extras its chunks must carry, and the learner's feed
(the one place that knows PPO is on-policy and DDPG off-policy)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from surreal_redis.algos.base import Algorithm
from surreal_redis.algos.ddpg import DDPGAlgorithm
from surreal_redis.algos.ddpg_config import DDPGConfig
from surreal_redis.algos.ppo import PPOAlgorithm
from surreal_redis.algos.ppo_config import PPOConfig
from surreal_redis.replay.feeds import Feed, OffPolicyFeed, OffPolicyFeedConfig, OnPolicyFeed
from surreal_redis.replay.fifo import FIFOReplayConfig
from surreal_redis.replay.prioritized import PrioritizedReplayConfig
from surreal_redis.replay.rate_limiter import RateLimiterConfig

AlgoConfig = PPOConfig | DDPGConfig


@dataclass(frozen=True)
class FeedSettings:
    """The learner's settings of both regimes (the ``replay`` section and parts of ``learner``);
    each feed takes the ones it uses."""

    fifo: FIFOReplayConfig
    off_policy: PrioritizedReplayConfig
    rate_limiter: RateLimiterConfig
    steps_per_update: int
    learning_starts: int
    updates_per_step: float


def _unknown(section: object) -> TypeError:
    return TypeError(f"no algorithm has the config section {type(section).__name__} "
                     f"(expected one of PPOConfig, DDPGConfig)")


def make_algorithm(section: AlgoConfig, obs_space: gym.Space, action_space: gym.Space, seed: int = 0) -> Algorithm:
    """The learner-side trainer, on CUDA when available (``device: auto``)."""
    if isinstance(section, PPOConfig):
        return PPOAlgorithm(section, obs_space, action_space, seed=seed)
    if isinstance(section, DDPGConfig):
        return DDPGAlgorithm(section, obs_space, action_space)
    raise _unknown(section)


def required_extras(section: AlgoConfig, action_space: gym.Space) -> tuple[str, ...]:
    """The per-step extras the learner's update reads from every chunk (the rest may be absent):
    PPO's importance ratio needs the behaviour ``logp``, and for Box actions the unclipped
    ``raw_action`` it was computed for."""
    if isinstance(section, PPOConfig):
        return ("logp",) + (("raw_action",) if isinstance(action_space, gym.spaces.Box) else ())
    if isinstance(section, DDPGConfig):
        return ()
    raise _unknown(section)


def make_feed(section: AlgoConfig, settings: FeedSettings, seed: int) -> Feed:
    """The learner's feed for the algorithm's regime (``seed``: replay sampling)."""
    if isinstance(section, PPOConfig):
        return OnPolicyFeed(settings.fifo, settings.steps_per_update)
    if isinstance(section, DDPGConfig):
        return OffPolicyFeed(OffPolicyFeedConfig(
            n_step=section.n_step, gamma=section.gamma, batch_size=section.batch_size, prioritized=section.use_per,
            replay=settings.off_policy, rate_limiter=settings.rate_limiter, learning_starts=settings.learning_starts,
            updates_per_step=settings.updates_per_step), seed)
    raise _unknown(section)
