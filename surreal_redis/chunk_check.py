"""Checks that a decoded chunk fits the learner's environment and algorithm before it reaches
replay: an agent running another env, or a foreign writer, must not crash the learner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from surreal_redis.experience import Chunk


def _leaf_problems(template: Any, value: Any, path: str, time_axis: int | None) -> str | None:
    if isinstance(template, dict):
        if not isinstance(value, dict) or set(value) != set(template):
            return f"obs{path} has keys {sorted(value) if isinstance(value, dict) else type(value).__name__}, " \
                   f"expected {sorted(template)}"
        for key in template:
            problem = _leaf_problems(template[key], value[key], f"{path}.{key}", time_axis)
            if problem:
                return problem
        return None
    if isinstance(template, (tuple, list)):
        if not isinstance(value, (tuple, list)) or len(value) != len(template):
            return f"obs{path} is not a sequence of {len(template)} items"
        for i, (t, v) in enumerate(zip(template, value)):
            problem = _leaf_problems(t, v, f"{path}[{i}]", time_axis)
            if problem:
                return problem
        return None
    expected = np.shape(template)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        return f"obs{path} is not a numeric array"
    if time_axis is None:
        if value.shape != expected:
            return f"obs{path} has shape {value.shape}, expected {expected}"
    elif value.shape[1:] != expected or value.shape[0] != time_axis:
        return f"obs{path} has shape {value.shape}, expected {(time_axis, *expected)}"
    return None


class ChunkCheck:
    """``problem(chunk)`` returns None for a usable chunk, else a short reason."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, required_extras: Sequence[str] = ()) -> None:
        self.template = obs_space.sample()
        self.action_shape = () if isinstance(action_space, gym.spaces.Discrete) else tuple(action_space.shape)
        self.required_extras = tuple(required_extras)

    def problem(self, chunk: Chunk) -> str | None:
        steps = chunk.num_steps
        if steps < 1:
            return "chunk has no steps"
        if chunk.actions.shape != (steps, *self.action_shape):
            return f"actions have shape {chunk.actions.shape}, expected {(steps, *self.action_shape)}"
        for name in ("terminated", "truncated", "policy_version"):
            if getattr(chunk, name).shape != (steps,):
                return f"{name} has shape {getattr(chunk, name).shape}, expected ({steps},)"
        problem = _leaf_problems(self.template, chunk.obs, "", steps + 1)
        if problem:
            return problem
        ended = set(np.flatnonzero(chunk.terminated | chunk.truncated).tolist())
        if set(chunk.final_obs) != ended:
            return f"final_obs given for steps {sorted(chunk.final_obs)}, episodes ended at {sorted(ended)}"
        for t, obs in chunk.final_obs.items():
            problem = _leaf_problems(self.template, obs, f" (final, step {t})", None)
            if problem:
                return problem
        for name in self.required_extras:
            value = chunk.extras.get(name)
            if not isinstance(value, np.ndarray) or value.shape[:1] != (steps,):
                return f"extras[{name!r}] is missing or not [{steps}, ...]"
        return None
