"""What a learner is built from (:class:`LearnerParts`). The loop never names an algorithm: the
spec (:func:`~surreal_redis.algos.registry.spec_of`) says which regime a section belongs to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from surreal_redis.algos.base import Trainer
from surreal_redis.algos.learning import make_trainer
from surreal_redis.algos.registry import spec_of
from surreal_redis.envs import make_env
from surreal_redis.learner.chunk_check import ChunkCheck
from surreal_redis.replay.feeds import Feed, OffPolicyConfig, OffPolicyFeed, OnPolicyFeed
from surreal_redis.replay.fifo import FIFOReplayConfig

if TYPE_CHECKING:
    from surreal_redis.config import ExperimentConfig


class LearnerParts(NamedTuple):
    """The trainer, the feed of its regime (on-policy FIFO or off-policy replay), and the check
    each chunk must pass."""

    algo: Trainer
    feed: Feed
    chunk_check: ChunkCheck

    @classmethod
    def of(cls, config: ExperimentConfig) -> LearnerParts:
        """The parts ``config`` names, seeded by ``experiment.seed`` (the env is made once, for its
        spaces; seed torch first: the trainer draws its initial weights). The trainer takes the
        section as the spec's ``for_run`` makes it for this run, and knows the
        ``hub.publisher.dtype`` its parameters travel as."""
        seed = config.experiment.seed
        env = make_env(config.env, seed=seed, mode="train")
        obs_space, action_space = env.observation_space, env.action_space
        env.close()
        section = config.algorithm.for_run(config)
        trainer = make_trainer(section, obs_space, action_space, seed)
        trainer.wire_dtype = config.hub.publisher.dtype
        return cls(trainer, make_feed(section, FeedSettings.of(config), seed),
                   ChunkCheck.for_experiment(config, obs_space, action_space))


@dataclass(frozen=True)
class FeedSettings:
    """The learner's settings of both regimes (``replay.fifo``, ``learner.steps_per_update``,
    ``off_policy``); each feed takes the ones it uses."""

    fifo: FIFOReplayConfig
    steps_per_update: int
    off_policy: OffPolicyConfig

    @classmethod
    def of(cls, config: Any) -> FeedSettings:
        """The settings of an :class:`~surreal_redis.config.ExperimentConfig`."""
        return cls(config.replay.fifo, config.learner.steps_per_update, config.off_policy)


def make_feed(section: Any, settings: FeedSettings, seed: int) -> Feed:
    """The learner's feed for the algorithm's regime (``seed``: replay sampling)."""
    if spec_of(section).on_policy:
        return OnPolicyFeed(settings.fifo, settings.steps_per_update)
    return OffPolicyFeed(settings.off_policy, gamma=section.gamma, seed=seed)
