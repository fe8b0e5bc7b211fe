"""Builds the algorithm objects an experiment config names (``algo: ppo | ddpg``)."""

from __future__ import annotations

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy, Algorithm
from surreal_redis.algos.ddpg import DDPGAlgorithm
from surreal_redis.algos.ddpg_policy import DDPGPolicy
from surreal_redis.algos.ppo import PPOAlgorithm
from surreal_redis.algos.ppo_policy import PPOPolicy
from surreal_redis.config import ExperimentConfig


def make_policy(config: ExperimentConfig, obs_space: gym.Space, action_space: gym.Space, num_envs: int,
                agent_id: int, seed: int) -> AgentPolicy:
    """The agent-side policy; agents differ in exploration by id (DDPG noise schedule) and seed."""
    if config.algo == "ppo":
        return PPOPolicy(config.ppo, obs_space, action_space, num_envs=num_envs, seed=seed)
    return DDPGPolicy(config.ddpg, obs_space, action_space, num_envs=num_envs, agent_id=agent_id,
                      num_agents=max(1, config.agent.num_agents), seed=seed)


def make_algorithm(config: ExperimentConfig, obs_space: gym.Space, action_space: gym.Space) -> Algorithm:
    """The learner-side trainer, on CUDA when available (``device: auto``)."""
    if config.algo == "ppo":
        return PPOAlgorithm(config.ppo, obs_space, action_space, seed=config.experiment.seed)
    return DDPGAlgorithm(config.ddpg, obs_space, action_space)
