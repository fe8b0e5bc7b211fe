"""CrossQ (Bhatt et al., ICLR 2024): SAC without target networks, with batch-normalized critics
evaluated jointly on the current and next state-actions. Declared once: ``config`` (torch-free
section) and ``trainer``; the agents' policies (torch and numpy) are SAC's, whose actor it trains."""

from __future__ import annotations

import gymnasium as gym

from surreal_redis.algos.base import Trainer
from surreal_redis.algos.crossq.config import CrossQConfig
from surreal_redis.algos.sac import SPEC as SAC_SPEC
from surreal_redis.algos.spec import AlgorithmSpec


def _trainer(section: CrossQConfig, obs_space: gym.Space, action_space: gym.Space, seed: int) -> Trainer:
    from surreal_redis.algos.crossq.trainer import CrossQTrainer

    return CrossQTrainer(section, obs_space, action_space, seed=seed)


SPEC = AlgorithmSpec(
    name="crossq", config_class=CrossQConfig, on_policy=False, make_trainer=_trainer,
    make_policy=SAC_SPEC.make_policy, numpy_unsupported=SAC_SPEC.numpy_unsupported,
    summary="CrossQ: SAC without target networks, batch-normalized twin critics on a joint batch of "
            "(s, a) and (s', a'); SAC's actor and agents")
