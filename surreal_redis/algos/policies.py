"""Builds the agent-side policy (agents, evals, ``rollout``) from an algorithm's config section.

Kept apart from :mod:`surreal_redis.algos.registry` (the learner's side) so that an agent acting
with numpy never imports torch: the torch policies are imported only when one is built.
"""

from __future__ import annotations

from typing import Literal

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy
from surreal_redis.algos.ddpg_config import DDPGConfig
from surreal_redis.algos.ppo_config import PPOConfig, numpy_unsupported
from surreal_redis.envs.spaces import image_layout

Inference = Literal["auto", "numpy", "torch"]


def _has_images(space: gym.Space) -> bool:
    leaves = space.spaces.values() if isinstance(space, gym.spaces.Dict) else (space,)
    return any(image_layout(leaf) is not None for leaf in leaves)


def resolved_inference(section: PPOConfig | DDPGConfig, obs_space: gym.Space,
                       inference: Inference = "auto") -> Literal["numpy", "torch"]:
    """Which backend ``inference`` means for this policy: ``auto`` is numpy for a PPO network
    without images or an LSTM, torch otherwise. Raises ValueError when numpy is asked for a
    policy it cannot run (DDPG, LSTM)."""
    if inference not in ("auto", "numpy", "torch"):
        raise ValueError(f"inference must be auto, numpy or torch, got {inference!r}")
    unsupported = numpy_unsupported(section)
    if inference == "numpy" and unsupported:
        raise ValueError(f"numpy inference runs PPO policies without an LSTM, not {unsupported}")
    if inference == "auto":
        return "numpy" if not unsupported and not _has_images(obs_space) else "torch"
    return inference


def make_policy(section: PPOConfig | DDPGConfig, obs_space: gym.Space, action_space: gym.Space, num_envs: int,
                agent_id: int, num_agents: int, seed: int, inference: Inference = "auto") -> AgentPolicy:
    """The agent-side policy on the backend :func:`resolved_inference` picks; agents differ in
    exploration by id (DDPG noise schedule) and seed."""
    backend = resolved_inference(section, obs_space, inference)
    if isinstance(section, PPOConfig) and backend == "numpy":
        from surreal_redis.algos.ppo_numpy_policy import NumpyPPOPolicy

        return NumpyPPOPolicy(section, obs_space, action_space, num_envs=num_envs, seed=seed)
    # torch costs ~1.5 s of CPU to import: only a process that acts with it pays that
    if isinstance(section, PPOConfig):
        from surreal_redis.algos.ppo_policy import PPOPolicy

        return PPOPolicy(section, obs_space, action_space, num_envs=num_envs, seed=seed)
    if isinstance(section, DDPGConfig):
        from surreal_redis.algos.ddpg_policy import DDPGPolicy

        return DDPGPolicy(section, obs_space, action_space, num_envs=num_envs, agent_id=agent_id,
                          num_agents=max(1, num_agents), seed=seed)
    raise TypeError(f"no algorithm has the config section {type(section).__name__} "
                    f"(expected one of PPOConfig, DDPGConfig)")
