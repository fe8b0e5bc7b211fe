"""dm_control through shimmy: state (a Dict of float32 vectors) and pixels (rendered headless,
frames stored once in the hub), PPO updates, an eval episode."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from surreal_redis.algos.networks import ObservationEncoder
from surreal_redis.algos.ppo.policy import PPOConfig, PPOPolicy
from surreal_redis.envs import EnvConfig, PixelConfig, make_env

from .family import loaded_policy, obs_keys, play_eval_episode, play_into_hub, ppo_updates, receive_and_check

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("dm_control") is None or importlib.util.find_spec("shimmy") is None,
    reason="the 'dmc' extra (dm-control, shimmy) is not installed")
PPO = PPOConfig(normalize_obs=True, update_epochs=1, num_minibatches=2, device="cpu")


def test_cheetah_run_state_through_the_hub_ppo_and_eval(fake_redis):
    config = EnvConfig(env_id="dm_control/cheetah-run-v0", num_envs=2, max_episode_steps=10)
    played, _ = play_into_hub(fake_redis, config, steps=16, policy_config=PPO)
    assert played.obs_space == gym.spaces.Dict({"position": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
                                                "velocity": gym.spaces.Box(-np.inf, np.inf, (9,), np.float32)})
    assert played.ends == 2  # truncated at 10 steps, never terminated
    chunks = receive_and_check(fake_redis, played, ("logp", "raw_action"))
    assert not any(c.terminated.any() for c in chunks) and sum(c.truncated.sum() for c in chunks) == 2
    algo = ppo_updates(chunks, played, PPO)
    assert set(algo.net.obs_normalizer.stats) == {"position", "velocity"}
    total, length = play_eval_episode(config, loaded_policy(algo, PPO, played))
    assert length == 10 and np.isfinite(total)


def test_cheetah_run_pixels_with_frame_stack(fake_redis):
    config = EnvConfig(env_id="dm_control/cheetah-run-v0", num_envs=2, frame_stack=3, action_repeat=2,
                       max_episode_steps=5, pixels=PixelConfig(enabled=True, size=48))
    played, _ = play_into_hub(fake_redis, config, steps=8, policy_config=PPO, flush_steps=4)
    frame = gym.spaces.Box(0, 255, (48, 48, 3), np.uint8)
    assert played.obs_space == gym.spaces.Tuple([frame] * 3)
    chunks = receive_and_check(fake_redis, played, ("logp", "raw_action"))
    assert obs_keys(fake_redis) <= 2 * (8 + 1 + played.ends) < 3 * obs_keys(fake_redis)
    algo = ppo_updates(chunks, played, PPO, updates=1)
    assert algo.net.encoder.layouts["_"].channels == 9  # 3 RGB frames, channels-last in the env
    total, length = play_eval_episode(config, loaded_policy(algo, PPO, played))
    assert length == 5 and np.isfinite(total)


def test_pixels_beside_state_mix_a_cnn_and_vectors():
    env = make_env(EnvConfig(env_id="dm_control/walker-walk-v0",
                             pixels=PixelConfig(enabled=True, size=40, camera="1", keep_state=True)), seed=0)
    space = env.observation_space
    assert set(space.spaces) == {"pixels", "orientations", "height", "velocity"}
    assert space["pixels"] == gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)
    encoder = ObservationEncoder(space)
    assert list(encoder.stems) == ["pixels"] and encoder.out_dim == 512 + 14 + 1 + 9
    policy = PPOPolicy(PPO, space, env.action_space, num_envs=1, seed=0)
    obs, _ = env.reset()
    out = policy.act({k: np.asarray(v)[None] for k, v in obs.items()})
    assert out.actions.shape == (1, 6) and np.isfinite(out.extras["logp"]).all()
    env.close()
