"""MuJoCo gymnasium v5 tasks: float32 state observations through the hub, PPO and DDPG updates,
an eval episode."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from surreal_redis.algos.ddpg.policy import DDPGConfig
from surreal_redis.algos.ddpg.trainer import DDPGTrainer
from surreal_redis.algos.ppo.policy import PPOConfig
from surreal_redis.chunks import TransitionBatch
from surreal_redis.envs import EnvConfig, make_env
from surreal_redis.replay.nstep import NStepBuilder

from .family import loaded_policy, play_eval_episode, play_into_hub, ppo_updates, receive_and_check

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="the 'mujoco' extra is not installed")
PPO = PPOConfig(normalize_obs=True, normalize_reward=True, update_epochs=1, num_minibatches=2, device="cpu")
TASKS = {"HalfCheetah-v5": (17, 6), "Hopper-v5": (11, 3), "Walker2d-v5": (17, 6), "Ant-v5": (105, 8),
         "Humanoid-v5": (348, 17)}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_task_through_the_hub_ppo_and_eval(fake_redis, task):
    obs_dim, action_dim = TASKS[task]
    config = EnvConfig(env_id=task, num_envs=2, max_episode_steps=12)
    played, _ = play_into_hub(fake_redis, config, steps=16, policy_config=PPO)
    assert played.obs_space == gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)  # float64 in the env
    assert played.action_space.shape == (action_dim,)
    assert played.ends >= 2  # every env was truncated at 12 steps (or fell earlier)
    chunks = receive_and_check(fake_redis, played, ("logp", "raw_action"))
    algo = ppo_updates(chunks, played, PPO)
    assert algo.net.obs_normalizer.stats["_"].count > 0
    total, length = play_eval_episode(config, loaded_policy(algo, PPO, played))
    assert 1 <= length <= 12 and np.isfinite(total)


def test_ddpg_updates_on_halfcheetah_chunks(fake_redis):
    config = EnvConfig(env_id="HalfCheetah-v5", num_envs=2, max_episode_steps=10)
    played, _ = play_into_hub(fake_redis, config, steps=16, policy_config=PPO)
    chunks = receive_and_check(fake_redis, played, ("logp", "raw_action"))
    ddpg = DDPGConfig(normalize_obs=True, device="cpu")
    builder = NStepBuilder(3, ddpg.gamma)
    batches = [batch for batch in map(builder.add, chunks) if batch is not None and batch.size]
    obs = np.concatenate([b.obs for b in batches])
    size = len(obs)
    batch = TransitionBatch(obs, np.concatenate([b.actions for b in batches]), np.concatenate([b.rewards for b in batches]),
                            np.concatenate([b.next_obs for b in batches]), np.concatenate([b.discounts for b in batches]),
                            np.ones(size, np.float32), np.arange(size))
    assert obs.dtype == np.float32 and obs.shape[1:] == (17,) and size >= 16
    algo = DDPGTrainer(ddpg, played.obs_space, played.action_space)
    for _ in range(3):
        stats, td_errors = algo.update(batch)
        assert np.isfinite(stats["losses/critic_loss"]) and td_errors.shape == (size,)


def test_time_limit_counts_agent_steps_with_action_repeat():
    env = make_env(EnvConfig(env_id="Hopper-v5", action_repeat=4, max_episode_steps=5), seed=0)
    env.reset()
    steps, truncated, terminated = 0, False, False
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(np.zeros(3, np.float32))
        steps += 1
    assert terminated or (truncated and steps == 5 and info["episode"]["l"] == 5)
