"""What every env family is put through: vector env -> policy -> ExperienceSender -> Redis ->
ExperienceReceiver (dtypes and shapes checked against the spaces), a few PPO updates on the
received chunks, and an eval-mode episode played like ``rollout`` does."""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import redis

from surreal_redis.agent import with_final_rows
from surreal_redis.algos.base import ActMode, AgentPolicy
from surreal_redis.algos.ppo.policy import PPOConfig, PPOPolicy
from surreal_redis.algos.ppo.trainer import PPOTrainer
from surreal_redis.chunks import Chunk
from surreal_redis.envs import EnvConfig, EpisodeResult, make_env, make_vector_env, step_vector_env
from surreal_redis.evaluator import play_episode
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig, SenderStats
from surreal_redis.keys import RunKeys
from surreal_redis.learner.chunk_check import ChunkCheck
from surreal_redis.trees import tree_leaves_with_paths

RUN = "envs"


class Played(NamedTuple):
    observations: list  # the batched observation before each step, then the last one
    episodes: list[EpisodeResult]
    ends: int  # steps x envs where terminated or truncated was set
    sender: SenderStats
    obs_space: gym.Space
    action_space: gym.Space


def play_into_hub(client: redis.Redis, config: EnvConfig, steps: int, policy_config: PPOConfig,
                  flush_steps: int = 8) -> tuple[Played, PPOPolicy]:
    """``steps`` vector steps of ``config.num_envs`` envs acted by a fresh PPO policy (training
    mode, so the chunks carry its extras), sent to the hub and flushed."""
    envs = make_vector_env(config, seed=0)
    policy = PPOPolicy(policy_config, envs.single_observation_space, envs.single_action_space,
                       num_envs=envs.num_envs, seed=0)
    sender = ExperienceSender(client, SenderConfig(flush_steps=flush_steps), RUN, 0, 1)
    obs, _ = envs.reset(seed=0)
    observations, episodes, ends = [obs], [], 0
    for _ in range(steps):
        out = policy.act(obs)
        step = step_vector_env(envs, out.actions)
        sender.add(obs, out.actions, step.rewards, step.terminated, step.truncated,
                   with_final_rows(step.obs, step.final_obs), out.extras, policy.version)
        obs = step.obs
        observations.append(obs)
        episodes += step.episodes.values()
        ends += int((step.terminated | step.truncated).sum())
    sender.flush(obs)
    played = Played(observations, episodes, ends, sender.stats(), envs.single_observation_space,
                    envs.single_action_space)
    envs.close()
    return played, policy


def receive_and_check(client: redis.Redis, played: Played, required_extras: tuple[str, ...] = ("logp",)) -> list[Chunk]:
    """Every chunk from the hub passes the learner's check, keeps the spaces' dtypes, and its
    observations are exactly what the envs showed."""
    items = ExperienceReceiver(client, ReceiverConfig(), RUN, 1).receive(10_000, 0)
    chunks = [item.chunk for item in items]
    assert chunks and sum(c.num_steps for c in chunks) == played.sender.steps
    check = ChunkCheck(played.obs_space, played.action_space, required_extras)
    dtypes = {path: space.dtype for path, space in tree_leaves_with_paths(_space_tree(played.obs_space))}
    for i, chunk in enumerate(chunks):
        assert check.problem(chunk) is None, check.problem(chunk)
        assert {path: leaf.dtype for path, leaf in tree_leaves_with_paths(chunk.obs)} == dtypes
        start = sum(c.num_steps for c in chunks[:i] if c.env_index == chunk.env_index)  # chunks come in order
        for t in range(chunk.num_steps + 1):
            sent = dict(tree_leaves_with_paths(played.observations[start + t]))
            for path, got in tree_leaves_with_paths(chunk.obs):
                np.testing.assert_array_equal(got[t], sent[path][chunk.env_index], err_msg=f"obs{path}[{t}]")
    return chunks


def _space_tree(space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _space_tree(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_space_tree(s) for s in space.spaces)
    return space


def obs_keys(client: redis.Redis) -> int:
    """Observation blobs stored in shard 0 of the test run."""
    return sum(1 for _ in client.scan_iter(match=RunKeys(RUN).shard(0).obs_prefix + "*", count=1000))


def ppo_updates(chunks: list[Chunk], played: Played, config: PPOConfig, updates: int = 2) -> PPOTrainer:
    algo = PPOTrainer(config, played.obs_space, played.action_space, device="cpu")
    for _ in range(updates):
        stats = algo.update(chunks)
        assert all(np.isfinite(stats[k]) for k in ("policy_loss", "value_loss", "entropy", "approx_kl"))
    return algo


def play_eval_episode(config: EnvConfig, policy: AgentPolicy) -> tuple[float, int]:
    """One eval-mode episode with a single env, as ``surreal-redis rollout`` plays it."""
    env = make_env(config, seed=1, mode="eval")
    try:
        return play_episode(env, policy, ActMode.EVAL_DETERMINISTIC, seed=1)
    finally:
        env.close()


def loaded_policy(algo: PPOTrainer, config: PPOConfig, played: Played) -> PPOPolicy:
    policy = PPOPolicy(config, played.obs_space, played.action_space, num_envs=1, seed=0)
    policy.load_params(algo.actor_params(), algo.iteration)
    return policy
