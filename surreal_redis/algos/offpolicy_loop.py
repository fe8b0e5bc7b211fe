"""The off-policy data path of surreal-redis in one process, without Redis: for learning checks and
for debugging an algorithm apart from the hub.

    vector env -> DDPGPolicy.act -> one Chunk per env every ``chunk_steps`` (as an agent sends them)
    -> NStepBuilder -> replay -> DDPGAlgorithm.update -> actor_params -> DDPGPolicy.load_params

Transitions reach the replay a chunk late and the policy acts with parameters up to
``publish_every`` updates old, as in the distributed run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from surreal_redis.algos.base import ActMode
from surreal_redis.algos.ddpg import DDPGAlgorithm
from surreal_redis.algos.ddpg_policy import DDPGConfig, DDPGPolicy
from surreal_redis.algos.nstep import NStepBuilder
from surreal_redis.algos.trees import tree_map
from surreal_redis.codec import Tree
from surreal_redis.experience import Chunk
from surreal_redis.replay.prioritized import PrioritizedReplay, PrioritizedReplayConfig
from surreal_redis.replay.uniform import UniformReplay, UniformReplayConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffPolicyLoopConfig:
    env_id: str = "Pendulum-v1"
    num_envs: int = 1
    seed: int = 1
    total_steps: int = 20_000
    """Env steps, summed over the envs."""
    chunk_steps: int = 50
    """Steps per chunk (the agents' ``sender.flush_steps``)."""
    learning_starts: int = 1_000
    """Transitions in replay before the first update."""
    updates_per_step: float = 1.0
    """Gradient updates per env step (the replay ratio)."""
    publish_every: int = 10
    """Updates between loads of the learner's actor into the acting policy."""
    replay_capacity: int = 100_000
    eval_episodes: int = 10
    """Deterministic episodes run with the final actor."""
    log_every: int = 2_000
    """Env steps between progress log lines."""

    def __post_init__(self) -> None:
        for name in ("num_envs", "total_steps", "chunk_steps", "publish_every", "replay_capacity",
                     "eval_episodes", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.updates_per_step <= 0:
            raise ValueError(f"updates_per_step must be > 0, got {self.updates_per_step}")


class OffPolicyResult(NamedTuple):
    env_steps: int
    updates: int
    wall_s: float
    train_returns: list[float]
    """Undiscounted return of every finished training episode, in order."""
    eval_returns: list[float]
    """Returns of the final deterministic evaluation episodes."""
    last_stats: dict[str, float]


def run_ddpg(loop: OffPolicyLoopConfig, config: DDPGConfig) -> OffPolicyResult:
    """Train DDPG on ``loop.env_id`` in this process (CPU unless ``config.device`` says otherwise)."""
    start = time.perf_counter()
    torch.manual_seed(loop.seed)
    rng = np.random.default_rng(loop.seed)
    envs = gym.make_vec(loop.env_id, num_envs=loop.num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    algo = DDPGAlgorithm(config, obs_space, action_space)
    policy = DDPGPolicy(config, obs_space, action_space, loop.num_envs, seed=loop.seed)
    policy.load_params(algo.actor_params(), version=0)
    nstep = NStepBuilder(config.n_step, config.gamma)
    replay = (PrioritizedReplay(PrioritizedReplayConfig(capacity=loop.replay_capacity)) if config.use_per
              else UniformReplay(UniformReplayConfig(capacity=loop.replay_capacity)))

    obs, _ = envs.reset(seed=loop.seed)
    recorder = _ChunkRecorder(loop.num_envs, obs)
    episode_return, episode_length = np.zeros(loop.num_envs), np.zeros(loop.num_envs, np.int64)
    train_returns: list[float] = []
    stats: dict[str, float] = {}
    updates, updates_due, env_steps = 0, 0.0, 0
    while env_steps < loop.total_steps:
        actions = policy.act(obs, ActMode.TRAINING).actions
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        env_steps += loop.num_envs
        recorder.add(actions, obs, rewards, terminated, truncated, infos, policy.version)
        episode_return += rewards
        episode_length += 1
        for i in np.flatnonzero(terminated | truncated):
            train_returns.append(float(episode_return[i]))
            policy.on_episode_end(int(i), float(episode_return[i]), int(episode_length[i]))
            policy.on_episode_start(int(i))
            episode_return[i], episode_length[i] = 0.0, 0

        if recorder.num_steps == loop.chunk_steps:
            for chunk in recorder.chunks():
                batch = nstep.add(chunk)
                if batch is not None:
                    replay.insert(*batch)
            recorder = _ChunkRecorder(loop.num_envs, obs)

        if len(replay) < loop.learning_starts:
            continue
        updates_due += loop.num_envs * loop.updates_per_step
        while updates_due >= 1.0:
            batch = replay.sample(config.batch_size, rng)
            stats, td_errors = algo.update(batch)
            if isinstance(replay, PrioritizedReplay):
                replay.update_priorities(batch.indices, td_errors)
            updates += 1
            updates_due -= 1.0
            if updates % loop.publish_every == 0:
                policy.load_params(algo.actor_params(), version=updates)
        if env_steps % loop.log_every < loop.num_envs:
            logger.info("step %d: %d updates, mean return of last 10 episodes %.1f, %.0f steps/s",
                        env_steps, updates, np.mean(train_returns[-10:]) if train_returns else float("nan"),
                        env_steps / (time.perf_counter() - start))
    envs.close()

    eval_returns = evaluate(algo, config, loop.env_id, loop.eval_episodes, seed=loop.seed + 10_000)
    wall_s = time.perf_counter() - start
    logger.info("done: %d env steps, %d updates, %.0f s, eval return %.1f +- %.1f over %d episodes",
                env_steps, updates, wall_s, np.mean(eval_returns), np.std(eval_returns), len(eval_returns))
    return OffPolicyResult(env_steps, updates, wall_s, train_returns, eval_returns, stats)


def evaluate(algo: DDPGAlgorithm, config: DDPGConfig, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` deterministic episodes (one per env of a vector env) with the
    learner's current actor."""
    envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    policy = DDPGPolicy(config, envs.single_observation_space, envs.single_action_space, episodes)
    policy.load_params(algo.actor_params(), version=algo.iteration)
    obs, _ = envs.reset(seed=seed)
    returns, running = np.full(episodes, np.nan), np.zeros(episodes)
    while np.isnan(returns).any():
        obs, rewards, terminated, truncated, _ = envs.step(policy.act(obs, ActMode.EVAL_DETERMINISTIC).actions)
        running += rewards
        first_end = (terminated | truncated) & np.isnan(returns)
        returns[first_end] = running[first_end]
    envs.close()
    return returns.tolist()


class _ChunkRecorder:
    """Steps of N lockstep envs, cut into one :class:`Chunk` per env (what each agent would send)."""

    def __init__(self, num_envs: int, first_obs: Tree) -> None:
        self.num_envs = num_envs
        self.obs = [first_obs]  # T+1 trees, leaves [N, ...]
        self.actions: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []
        self.terminated: list[np.ndarray] = []
        self.truncated: list[np.ndarray] = []
        self.versions: list[int] = []
        self.final_obs: list[dict[int, Tree]] = [{} for _ in range(num_envs)]

    @property
    def num_steps(self) -> int:
        return len(self.rewards)

    def add(self, actions: np.ndarray, next_obs: Tree, rewards: np.ndarray, terminated: np.ndarray,
            truncated: np.ndarray, infos: dict, version: int) -> None:
        """Record one step. With SAME_STEP autoreset ``next_obs`` is the reset observation where an
        episode ended, and ``infos["final_obs"][i]`` its true last observation."""
        for i in np.flatnonzero(terminated | truncated):
            self.final_obs[i][self.num_steps] = infos["final_obs"][i]
        self.obs.append(next_obs)
        self.actions.append(actions)
        self.rewards.append(rewards.astype(np.float32))
        self.terminated.append(terminated)
        self.truncated.append(truncated)
        self.versions.append(version)

    def chunks(self) -> list[Chunk]:
        obs = tree_map(lambda *steps: np.stack(steps), *self.obs)  # leaves [T+1, N, ...]
        actions, rewards = np.stack(self.actions), np.stack(self.rewards)
        terminated, truncated = np.stack(self.terminated), np.stack(self.truncated)
        versions = np.asarray(self.versions, np.int64)
        return [Chunk(agent_id=0, env_index=i, obs=tree_map(lambda x, i=i: x[:, i], obs),
                      actions=actions[:, i], rewards=rewards[:, i], terminated=terminated[:, i],
                      truncated=truncated[:, i], final_obs=self.final_obs[i], policy_version=versions,
                      extras={}) for i in range(self.num_envs)]
