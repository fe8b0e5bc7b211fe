"""SAC (Haarnoja et al. 2018, arXiv:1801.01290; automatic temperature from arXiv:1812.05905),
declared once: ``config`` (torch-free section), ``policy`` (torch networks and agent policy),
``numpy_policy`` (the same actor without torch), ``trainer`` (the twin-critic, actor and
temperature update)."""

from __future__ import annotations

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy, Trainer
from surreal_redis.algos.sac.config import SACConfig, numpy_unsupported
from surreal_redis.algos.spec import AlgorithmSpec, PolicyRequest


def _trainer(section: SACConfig, obs_space: gym.Space, action_space: gym.Space, seed: int) -> Trainer:
    from surreal_redis.algos.sac.trainer import SACTrainer

    return SACTrainer(section, obs_space, action_space, seed=seed)


def _policy(section: SACConfig, obs_space: gym.Space, action_space: gym.Space,
            request: PolicyRequest) -> AgentPolicy:
    if request.backend == "numpy":
        from surreal_redis.algos.sac.numpy_policy import NumpySACPolicy

        return NumpySACPolicy(section, obs_space, action_space, num_envs=request.num_envs, seed=request.seed)
    from surreal_redis.algos.sac.policy import SACPolicy

    return SACPolicy(section, obs_space, action_space, num_envs=request.num_envs, seed=request.seed)


SPEC = AlgorithmSpec(
    name="sac", config_class=SACConfig, on_policy=False, make_trainer=_trainer, make_policy=_policy,
    numpy_unsupported=numpy_unsupported,
    summary="SAC: squashed Gaussian actor, twin soft critics on n-step replay, learned temperature; "
            "agents act in numpy without images")
