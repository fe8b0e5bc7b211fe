"""APPO, asynchronous PPO (as Sample Factory's and RLlib's), declared once: agents produce without
pause (``learner.on_policy_sync: free``) or one batch ahead on grants (``overlap``, Sample
Factory's double-buffered sampling), and the learner corrects for their lag with V-trace
(:mod:`surreal_redis.algos.appo.trainer`); the network, the policies and the extras are PPO's."""

from __future__ import annotations

import gymnasium as gym

from surreal_redis.algos.appo.config import APPOConfig
from surreal_redis.algos.base import Trainer
from surreal_redis.algos.ppo import SPEC as PPO_SPEC
from surreal_redis.algos.spec import AlgorithmSpec


def _trainer(section: APPOConfig, obs_space: gym.Space, action_space: gym.Space, seed: int) -> Trainer:
    from surreal_redis.algos.appo.trainer import APPOTrainer

    return APPOTrainer(section, obs_space, action_space, seed=seed)


SPEC = AlgorithmSpec(
    name="appo", config_class=APPOConfig, on_policy=True, make_trainer=_trainer,
    make_policy=PPO_SPEC.make_policy, chunk_needs=PPO_SPEC.chunk_needs,
    numpy_unsupported=PPO_SPEC.numpy_unsupported, check=PPO_SPEC.check, for_run=PPO_SPEC.for_run,
    summary="APPO: PPO's clipped surrogate on V-trace advantages, for agents that run ahead of the learner "
            "(learner.on_policy_sync: free or overlap); PPO's network and agents")
