"""DDPG (Lillicrap et al. 2016, arXiv:1509.02971), declared once: ``config`` (torch-free
section), ``noise`` (action and parameter noise), ``policy`` (torch networks and agent policy),
``trainer`` (the critic and actor update)."""

from __future__ import annotations

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy, Trainer
from surreal_redis.algos.ddpg.config import DDPGConfig
from surreal_redis.algos.spec import AlgorithmSpec, PolicyRequest


def _trainer(section: DDPGConfig, obs_space: gym.Space, action_space: gym.Space, seed: int) -> Trainer:
    from surreal_redis.algos.ddpg.trainer import DDPGTrainer

    return DDPGTrainer(section, obs_space, action_space)


def _policy(section: DDPGConfig, obs_space: gym.Space, action_space: gym.Space,
            request: PolicyRequest) -> AgentPolicy:
    # torch only: parameter-space noise perturbs the actor's weights each episode
    from surreal_redis.algos.ddpg.policy import DDPGPolicy

    return DDPGPolicy(section, obs_space, action_space, num_envs=request.num_envs, agent_id=request.agent_id,
                      num_agents=max(1, request.num_agents), seed=request.seed)


SPEC = AlgorithmSpec(
    name="ddpg", config_class=DDPGConfig, on_policy=False, make_trainer=_trainer, make_policy=_policy,
    summary="DDPG: deterministic actor and critic on n-step replay; Gaussian, OU or parameter noise")
