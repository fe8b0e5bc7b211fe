"""An in-process off-policy loop: the data path of a distributed off-policy run (DDPG, SAC) in one
process, no Redis: chunks (:class:`~surreal_redis.testing.local_loop.ChunkCollector`) -> the
learner's :class:`~surreal_redis.replay.feeds.OffPolicyFeed` -> ``algo.update`` -> the policy.

Updates run between chunks, and the policy gets the new parameters after each chunk's updates: as
in the distributed run, transitions reach the replay a chunk late and the policy acts with
parameters up to a chunk old. Unlike the run's agents, the policy acts from the first step:
``off_policy.random_steps`` (the agents' random warm-up) does not apply here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActMode, AgentPolicy
from surreal_redis.codec import ParamDict
from surreal_redis.envs import step_vector_env
from surreal_redis.replay import ReplayConfig
from surreal_redis.replay.feeds import OffPolicyConfig, OffPolicyFeed, OffPolicyTrainer
from surreal_redis.testing.local_loop import ChunkCollector, LoopResult, mean_return

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffPolicyLoopConfig:
    total_steps: int = 20_000
    """Environment steps (all envs together) before stopping."""
    chunk_steps: int = 50
    """T: steps per env per chunk (the agents' ``sender.flush_steps``)."""
    off_policy: OffPolicyConfig = field(default_factory=lambda: OffPolicyConfig(
        replay=ReplayConfig(capacity=100_000), max_train_s=None))
    """Batch, n-step returns, replay and replay ratio, as the learner's ``off_policy`` section."""
    return_window: int = 10
    """``LoopResult.mean_return`` is the mean of the last this many training episodes."""
    seed: int = 0
    """Seed of the first ``envs.reset`` and of replay sampling."""
    log_every: int = 2_000
    """Log progress about every this many environment steps."""

    def __post_init__(self) -> None:
        for name in ("total_steps", "chunk_steps", "return_window", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class OffPolicyLearner(OffPolicyTrainer, Protocol):

    def actor_params(self) -> ParamDict: ...


def run_offpolicy(algo: OffPolicyLearner, policy: AgentPolicy, envs: gym.vector.VectorEnv,
                  config: OffPolicyLoopConfig, gamma: float) -> LoopResult:
    """Train ``algo`` from ``envs`` (SAME_STEP) stepped by ``policy``, n-step returns discounted by
    ``gamma``. Blocks; returns a summary."""
    start = time.perf_counter()
    feed = OffPolicyFeed(config.off_policy, gamma=gamma, seed=config.seed)
    never = threading.Event()
    policy.load_params(algo.actor_params(), 0)
    collector = ChunkCollector(envs, policy, seed=config.seed)
    steps, updates, next_log = 0, 0, config.log_every
    stats: dict[str, float] = {}
    while steps < config.total_steps:
        for chunk in collector.collect(config.chunk_steps):
            feed.ingest(chunk)
        steps += config.chunk_steps * envs.num_envs
        for update_stats in feed.train(algo, never):
            stats = update_stats
            updates += 1
        if updates:
            policy.load_params(algo.actor_params(), updates)

        if steps >= next_log:
            next_log += config.log_every
            logger.info("steps %d updates %d episodes %d mean return %.1f (%.0f s)", steps, updates,
                        len(collector.episode_returns), mean_return(collector.episode_returns, config.return_window),
                        time.perf_counter() - start)
    mean = mean_return(collector.episode_returns, config.return_window)
    wall_s = time.perf_counter() - start
    logger.info("done: %d steps, %d updates, mean return %.1f, %.1f s", steps, updates, mean, wall_s)
    return LoopResult(steps, updates, wall_s, list(collector.episode_returns), mean, stats)


def evaluate(policy: AgentPolicy, envs: gym.vector.VectorEnv, mode: ActMode = ActMode.EVAL_DETERMINISTIC,
             seed: int = 0) -> list[float]:
    """Run one episode in each of the N envs of ``envs`` (SAME_STEP) with ``policy`` in ``mode``;
    returns the N undiscounted returns, in env order."""
    obs, _ = envs.reset(seed=seed)
    returns, running = np.full(envs.num_envs, np.nan), np.zeros(envs.num_envs)
    while np.isnan(returns).any():
        step = step_vector_env(envs, policy.act(obs, mode).actions)
        running += step.rewards
        first_end = (step.terminated | step.truncated) & np.isnan(returns)
        returns[first_end] = running[first_end]
        obs = step.obs
    return returns.tolist()
