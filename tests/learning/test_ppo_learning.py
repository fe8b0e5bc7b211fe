"""PPO learns CartPole-v1 in one process: vector env -> NumpyPPOPolicy (what agents act with on
vector observations) -> chunks -> PPOTrainer. The torch PPOPolicy learns in
tests/envs/test_pixel_learning.py, and computes what the numpy one does (tests/unit/test_numpy_nets.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
from surreal_redis.algos.ppo.trainer import PPOConfig, PPOTrainer
from surreal_redis.envs import EnvConfig, make_vector_env
from surreal_redis.testing.local_loop import LocalLoopConfig, run_local

log = logging.getLogger(__name__)

NUM_ENVS = 8
# CleanRL's CartPole settings (8 envs x 128 steps, 4 epochs x 4 minibatches, gamma 0.99, lambda 0.95,
# clip 0.2, ent 0.01) with a 10x larger learning rate, which gets there in fewer steps.
CARTPOLE = PPOConfig(learning_rate=2.5e-3, device="cpu")


@pytest.mark.slow
def test_ppo_solves_cartpole():
    seed = 0
    torch.manual_seed(seed)
    envs = make_vector_env(EnvConfig(env_id="CartPole-v1"), NUM_ENVS, seed=seed)
    algo = PPOTrainer(CARTPOLE, envs.single_observation_space, envs.single_action_space, seed=seed)
    policy = NumpyPPOPolicy(CARTPOLE, envs.single_observation_space, envs.single_action_space, NUM_ENVS, seed=seed)
    result = run_local(algo, policy, envs, LocalLoopConfig(total_steps=300_000, chunk_steps=128,
                                                           target_return=475.0, seed=seed))
    envs.close()
    log.info("CartPole: mean return %.1f over the last 100 episodes after %d steps, %d updates, %.0f s",
             result.mean_return, result.steps, result.updates, result.wall_s)
    assert len(result.episode_returns) >= 100
    assert result.mean_return >= 475.0, f"reached only {result.mean_return:.1f} in {result.steps} steps"
