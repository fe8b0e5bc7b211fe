"""An in-process off-policy loop: the data path of a distributed DDPG run in one process, no Redis.

    vector env -> DDPGPolicy.act -> one Chunk per env every ``chunk_steps`` steps (ChunkCollector,
    as an agent sends them) -> the learner's OffPolicyFeed (n-step builder, replay) ->
    DDPGAlgorithm.update -> actor_params -> DDPGPolicy.load_params

Updates run between chunks, ``updates_per_step`` per transition inserted once the replay holds
``learning_starts``, and the policy gets the new parameters after each chunk's updates: transitions
reach the replay a chunk late and the policy acts with parameters up to a chunk old, as in the
distributed run. Used by the learning tests.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActMode, AgentPolicy
from surreal_redis.algos.ddpg import DDPGAlgorithm
from surreal_redis.envs import step_vector_env
from surreal_redis.replay.feeds import OffPolicyFeed, OffPolicyFeedConfig
from surreal_redis.replay.prioritized import PrioritizedReplayConfig
from surreal_redis.testing.local_loop import ChunkCollector, LoopResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffPolicyLoopConfig:
    total_steps: int = 20_000
    """Environment steps (all envs together) before stopping."""
    chunk_steps: int = 50
    """T: steps per env per chunk (the agents' ``sender.flush_steps``)."""
    learning_starts: int = 1_000
    """Transitions in replay before the first update."""
    updates_per_step: float = 1.0
    """Gradient updates per transition inserted (the replay ratio)."""
    replay_capacity: int = 100_000
    return_window: int = 10
    """``LoopResult.mean_return`` is the mean of the last this many training episodes."""
    seed: int = 0
    """Seed of the first ``envs.reset`` and of replay sampling."""
    log_every: int = 2_000
    """Log progress about every this many environment steps."""

    def __post_init__(self) -> None:
        for name in ("total_steps", "chunk_steps", "replay_capacity", "return_window", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_starts < 0 or self.updates_per_step <= 0:
            raise ValueError(f"need learning_starts >= 0 and updates_per_step > 0, got "
                             f"{self.learning_starts} and {self.updates_per_step}")


def run_offpolicy(algo: DDPGAlgorithm, policy: AgentPolicy, envs: gym.vector.VectorEnv,
                  config: OffPolicyLoopConfig) -> LoopResult:
    """Train ``algo`` from ``envs`` (a SAME_STEP vector env, see ``envs.make_vector_env``) stepped by
    ``policy``; the replay is prioritized when ``algo.config.use_per``. Blocks; returns a summary."""
    start = time.perf_counter()
    ddpg = algo.config
    feed = OffPolicyFeed(OffPolicyFeedConfig(
        n_step=ddpg.n_step, gamma=ddpg.gamma, batch_size=ddpg.batch_size, prioritized=ddpg.use_per,
        replay=PrioritizedReplayConfig(capacity=config.replay_capacity), learning_starts=config.learning_starts,
        updates_per_step=config.updates_per_step, max_train_s=None), seed=config.seed)
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
            recent = collector.episode_returns[-config.return_window:]
            logger.info("steps %d updates %d episodes %d mean return %.1f (%.0f s)", steps, updates,
                        len(collector.episode_returns), np.mean(recent) if recent else float("nan"),
                        time.perf_counter() - start)
    recent = collector.episode_returns[-config.return_window:]
    mean_return = float(np.mean(recent)) if recent else float("nan")
    wall_s = time.perf_counter() - start
    logger.info("done: %d steps, %d updates, mean return %.1f, %.1f s", steps, updates, mean_return, wall_s)
    return LoopResult(steps, updates, wall_s, list(collector.episode_returns), mean_return, stats)


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
