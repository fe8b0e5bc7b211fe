"""PPO (Schulman et al. 2017, arXiv:1707.06347), declared once: ``config`` (torch-free section),
``policy`` (torch networks and agent policy), ``numpy_policy`` (the same network without torch),
``trainer`` (GAE and the clipped or KL-penalized update)."""

from __future__ import annotations

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy, Trainer
from surreal_redis.algos.ppo.config import PPOConfig, annealing_for_run, check_annealing, numpy_unsupported
from surreal_redis.algos.spec import AlgorithmSpec, ChunkNeeds, PolicyRequest


def _trainer(section: PPOConfig, obs_space: gym.Space, action_space: gym.Space, seed: int) -> Trainer:
    from surreal_redis.algos.ppo.trainer import PPOTrainer

    return PPOTrainer(section, obs_space, action_space, seed=seed)


def _policy(section: PPOConfig, obs_space: gym.Space, action_space: gym.Space,
            request: PolicyRequest) -> AgentPolicy:
    if request.backend == "numpy":
        from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy

        return NumpyPPOPolicy(section, obs_space, action_space, num_envs=request.num_envs, seed=request.seed)
    from surreal_redis.algos.ppo.policy import PPOPolicy

    return PPOPolicy(section, obs_space, action_space, num_envs=request.num_envs, seed=request.seed)


def _chunk_needs(section: PPOConfig, action_space: gym.Space) -> ChunkNeeds:
    """The importance ratio needs the behaviour ``logp`` and, for Box actions, the unclipped
    ``raw_action`` it was computed for; an LSTM needs each chunk's initial state."""
    extras = ("logp",) + (("raw_action",) if isinstance(action_space, gym.spaces.Box) else ())
    hidden = (section.lstm_hidden,)
    return ChunkNeeds(extras, {"lstm_h": hidden, "lstm_c": hidden} if section.use_lstm else None)


SPEC = AlgorithmSpec(
    name="ppo", config_class=PPOConfig, on_policy=True, make_trainer=_trainer, make_policy=_policy,
    chunk_needs=_chunk_needs, numpy_unsupported=numpy_unsupported, check=check_annealing, for_run=annealing_for_run,
    summary="PPO: clipped surrogate (or adaptive KL) on GAE advantages; agents act in numpy without images or an LSTM")
