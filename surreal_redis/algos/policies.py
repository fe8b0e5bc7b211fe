"""Builds the agent-side policy (agents, evals, ``rollout``) from an algorithm's config section,
through its spec; apart from :mod:`surreal_redis.algos.learning` so that an agent acting with
numpy never imports torch or the replay."""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy
from surreal_redis.algos.registry import spec_of
from surreal_redis.algos.spec import Backend, PolicyRequest
from surreal_redis.envs.spaces import image_layout

Inference = Literal["auto", "numpy", "torch"]


def _has_images(space: gym.Space) -> bool:
    leaves = space.spaces.values() if isinstance(space, gym.spaces.Dict) else (space,)
    return any(image_layout(leaf) is not None for leaf in leaves)


def resolved_inference(section: Any, obs_space: gym.Space, inference: Inference = "auto") -> Backend:
    """Which backend ``inference`` means for this policy: ``auto`` is numpy where the algorithm's
    spec can act in numpy for this section and the observations hold no images, torch otherwise.
    Raises ValueError when numpy is asked for a policy it cannot run."""
    if inference not in ("auto", "numpy", "torch"):
        raise ValueError(f"inference must be auto, numpy or torch, got {inference!r}")
    unsupported = spec_of(section).numpy_unsupported(section)
    if inference == "numpy" and unsupported:
        raise ValueError(f"numpy inference cannot run {unsupported}")
    if inference == "auto":
        return "numpy" if not unsupported and not _has_images(obs_space) else "torch"
    return inference


def make_policy(section: Any, obs_space: gym.Space, action_space: gym.Space, num_envs: int,
                agent_id: int, num_agents: int, seed: int | None, inference: Inference = "auto") -> AgentPolicy:
    """The agent-side policy on the backend :func:`resolved_inference` picks; agents differ in
    exploration by id and seed."""
    request = PolicyRequest(num_envs=num_envs, agent_id=agent_id, num_agents=num_agents, seed=seed,
                            backend=resolved_inference(section, obs_space, inference))
    return spec_of(section).make_policy(section, obs_space, action_space, request)
