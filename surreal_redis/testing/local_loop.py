"""An in-process on-policy loop: vector env -> policy -> chunks -> learner -> parameters -> policy.

No Redis and no processes: :class:`ChunkCollector` cuts experience into chunks exactly as an agent
does, and :func:`run_local` alternates collection and one update through the learner's own
:class:`~surreal_redis.replay.feeds.OnPolicyFeed`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActMode, AgentPolicy, ParamDict
from surreal_redis.chunks import INITIAL_STATE, Chunk
from surreal_redis.codec import Tree
from surreal_redis.envs import step_vector_env
from surreal_redis.replay.feeds import OnPolicyFeed, OnPolicyTrainer
from surreal_redis.replay.fifo import FIFOReplayConfig
from surreal_redis.trees import tree_map, tree_stack

log = logging.getLogger(__name__)



class OnPolicyLearner(OnPolicyTrainer, Protocol):
    def actor_params(self) -> ParamDict: ...


@dataclass(frozen=True)
class LocalLoopConfig:
    total_steps: int = 500_000
    """Environment steps (all envs together) before stopping."""
    chunk_steps: int = 128
    """T: steps per env per chunk; one update per ``num_envs * chunk_steps`` steps."""
    target_return: float | None = None
    """Stop early once the mean return of the last ``return_window`` episodes reaches this."""
    return_window: int = 100
    seed: int = 0
    """Seed of the first ``envs.reset``."""
    log_every: int = 10
    """Log progress every this many updates."""

    def __post_init__(self) -> None:
        if self.total_steps < 1 or self.chunk_steps < 1 or self.return_window < 1 or self.log_every < 1:
            raise ValueError(f"total_steps, chunk_steps, return_window and log_every must be >= 1: {self}")


def mean_return(episode_returns: list[float], window: int) -> float:
    """Mean of the last ``window`` episode returns (NaN before the first episode)."""
    recent = episode_returns[-window:]
    return float(np.mean(recent)) if recent else float("nan")


class LoopResult(NamedTuple):
    """What an in-process training loop (on- or off-policy) did."""

    steps: int
    updates: int
    wall_s: float
    episode_returns: list[float]  # every finished training episode's, in order
    mean_return: float  # see mean_return()
    last_stats: dict[str, float]


class ChunkCollector:
    """Steps ``envs`` with ``policy`` in training mode and returns one chunk per env per call: T
    steps, the true final observation of every episode that ends, the recurrent state at the start."""

    def __init__(self, envs: gym.vector.VectorEnv, policy: AgentPolicy, seed: int = 0, agent_id: int = 0) -> None:
        if envs.metadata.get("autoreset_mode") != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError("ChunkCollector needs a vector env with autoreset_mode=SAME_STEP "
                             "(see surreal_redis.envs.make_vector_env)")
        self.envs = envs
        self.policy = policy
        self.agent_id = agent_id
        self.obs, _ = envs.reset(seed=seed)
        self.episode_returns: list[float] = []
        self._return = np.zeros(envs.num_envs)
        self._length = np.zeros(envs.num_envs, dtype=np.int64)
        for i in range(envs.num_envs):
            policy.on_episode_start(i)

    def collect(self, num_steps: int) -> list[Chunk]:
        """Run ``num_steps`` vector steps; returns ``num_envs`` chunks of T = ``num_steps``."""
        num_envs = self.envs.num_envs
        obs, actions, rewards, terminated, truncated, extras = [self.obs], [], [], [], [], []
        final_obs: list[dict[int, object]] = [{} for _ in range(num_envs)]
        initial_state = {}
        for t in range(num_steps):
            self.policy.before_act(self.obs, ActMode.TRAINING)  # the hooks, called as the agent does
            output = self.policy.act(self.obs, ActMode.TRAINING)
            self.policy.after_act(self.obs, output, ActMode.TRAINING)
            step_extras = dict(output.extras)
            # like the sender: the recurrent state is kept at the first step of each chunk only
            state = step_extras.pop(INITIAL_STATE, {})
            if t == 0:
                initial_state = state
            step = step_vector_env(self.envs, output.actions)
            self._return += step.rewards
            self._length += 1
            for i, last_obs in step.final_obs.items():
                final_obs[i][t] = last_obs
                self.episode_returns.append(float(self._return[i]))
                self.policy.on_episode_end(i, float(self._return[i]), int(self._length[i]))
                self.policy.on_episode_start(i)
                self._return[i], self._length[i] = 0.0, 0
            self.obs = step.obs
            obs.append(step.obs)
            actions.append(output.actions)
            rewards.append(step.rewards)
            terminated.append(step.terminated)
            truncated.append(step.truncated)
            extras.append(step_extras)

        def stack(items: list) -> Tree:
            return tree_stack(lambda leaves: np.stack(leaves, axis=0), items)  # [T(+1), N, ...]

        obs_seq, extras_seq, actions_seq = stack(obs), stack(extras), np.stack(actions)
        rewards_seq, terminated_seq, truncated_seq = np.stack(rewards), np.stack(terminated), np.stack(truncated)
        version = np.full(num_steps, self.policy.version, dtype=np.int64)
        chunks = []
        for i in range(num_envs):
            chunk_extras = tree_map(lambda v, i=i: v[:, i], extras_seq)
            if initial_state:
                chunk_extras[INITIAL_STATE] = tree_map(lambda v, i=i: v[i], initial_state)
            chunks.append(Chunk(
                agent_id=self.agent_id, env_index=i, obs=tree_map(lambda v, i=i: v[:, i], obs_seq),
                actions=actions_seq[:, i], rewards=rewards_seq[:, i], terminated=terminated_seq[:, i],
                truncated=truncated_seq[:, i], final_obs=final_obs[i], policy_version=version, extras=chunk_extras,
            ))
        return chunks


def run_local(learner: OnPolicyLearner, policy: AgentPolicy, envs: gym.vector.VectorEnv,
              config: LocalLoopConfig) -> LoopResult:
    """Collect ``config.chunk_steps`` steps per env, update once, publish to the policy; repeat
    until ``total_steps`` or the target return. Blocks; returns the run's summary."""
    start = time.perf_counter()
    steps_per_update = config.chunk_steps * envs.num_envs
    feed = OnPolicyFeed(FIFOReplayConfig(capacity_steps=steps_per_update, max_policy_lag=None), steps_per_update)
    never = threading.Event()
    policy.load_params(learner.actor_params(), 0)
    collector = ChunkCollector(envs, policy, seed=config.seed)
    steps, updates, stats = 0, 0, {}
    mean = float("nan")
    while steps < config.total_steps:
        for chunk in collector.collect(config.chunk_steps):
            feed.ingest(chunk)
        steps += steps_per_update
        for update_stats in feed.train(learner, never):
            stats = update_stats
            updates += 1
        feed.on_publish(updates)
        policy.load_params(learner.actor_params(), updates)
        mean = mean_return(collector.episode_returns, config.return_window)
        if updates % config.log_every == 0:
            log.info("steps %d updates %d episodes %d mean return %.1f (%.0f s)", steps, updates,
                     len(collector.episode_returns), mean, time.perf_counter() - start)
        if (config.target_return is not None and len(collector.episode_returns) >= config.return_window
                and mean >= config.target_return):
            break
    wall_s = time.perf_counter() - start
    log.info("done: %d steps, %d updates, mean return %.1f, %.1f s", steps, updates, mean, wall_s)
    return LoopResult(steps, updates, wall_s, list(collector.episode_returns), mean, stats)
