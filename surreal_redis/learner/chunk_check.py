"""Checks that a decoded chunk fits the learner's environment and algorithm before it reaches
replay: an agent running another env, or a foreign writer, must not crash the learner or be
broadcast into wrong shapes (a ``[T, 1]`` log-prob against ``[T]`` would silently give ``[T, T]``
ratios). Every observation leaf, action, reward, flag and required extra is checked for its full
shape; the learner sets a chunk that fails aside (dead-letter stream) and goes on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from surreal_redis.chunks import INITIAL_STATE, Chunk

if TYPE_CHECKING:
    from surreal_redis.config import ExperimentConfig


def _template(space: gym.Space) -> Any:
    """The space as a tree of ``(shape, dtype)`` leaves (Dict -> dict, Tuple -> tuple)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _template(sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_template(sub) for sub in space.spaces)
    if isinstance(space, gym.spaces.Box):
        return tuple(int(n) for n in space.shape), np.dtype(space.dtype)
    raise ValueError(f"ChunkCheck supports Box, Tuple and Dict observation spaces, got {space}")


def _leaf_problems(template: Any, value: Any, path: str, time_axis: int | None) -> str | None:
    if isinstance(template, dict):
        if not isinstance(value, dict) or set(value) != set(template):
            return f"obs{path} has keys {sorted(value) if isinstance(value, dict) else type(value).__name__}, " \
                   f"expected {sorted(template)}"
        return next(filter(None, (_leaf_problems(template[key], value[key], f"{path}.{key}", time_axis)
                                  for key in template)), None)
    if isinstance(template, tuple) and not isinstance(template[1], np.dtype):
        if not isinstance(value, (tuple, list)) or len(value) != len(template):
            return f"obs{path} is not a sequence of {len(template)} items"
        return next(filter(None, (_leaf_problems(t, v, f"{path}[{i}]", time_axis)
                                  for i, (t, v) in enumerate(zip(template, value)))), None)
    shape, dtype = template
    expected = shape if time_axis is None else (time_axis, *shape)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        return f"obs{path} is not a numeric array"
    if dtype == np.uint8 and value.dtype != np.uint8:
        return f"obs{path} has dtype {value.dtype}, expected uint8"
    if value.shape != expected:
        return f"obs{path} has shape {value.shape}, expected {expected}"
    return None


def _array_problem(name: str, value: Any, shape: tuple[int, ...], kinds: str) -> str | None:
    if not isinstance(value, np.ndarray):
        return f"{name} is missing or not an array"
    if value.shape != shape:
        return f"{name} has shape {value.shape}, expected {shape}"
    if value.dtype.kind not in kinds:
        return f"{name} has dtype {value.dtype}, expected one of kinds {kinds!r}"
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        return f"{name} has non-finite values"
    return None


class ChunkCheck:
    """``problem(chunk)`` returns None for a usable chunk, else a short reason naming the part.

    Args:
        obs_space: the learner's (single-env) observation space.
        action_space: its action space (Discrete actions must be integers in range).
        required_extras: per-step extras every chunk must carry. ``logp`` and ``value`` must be
            ``[T]``, ``raw_action`` ``[T, *action_shape]``, any other name ``[T, ...]``.
        initial_state: recurrent state every chunk must carry in ``extras["initial_state"]``:
            leaf name -> shape without time axis (PPO with an LSTM: ``lstm_h``, ``lstm_c`` ``[H]``).
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, required_extras: Sequence[str] = (),
                 initial_state: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.template = _template(obs_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Discrete):
            self.action_shape: tuple[int, ...] = ()
            self.action_range = (int(action_space.start), int(action_space.start + action_space.n))
        elif action_space.shape is not None:
            self.action_shape = tuple(action_space.shape)
        else:
            raise ValueError(f"action space {action_space} has no shape: chunks cannot be checked against it")
        self.extra_shapes = {name: {"logp": (), "value": (), "raw_action": self.action_shape}.get(name)
                             for name in required_extras}
        self.initial_state = None if initial_state is None else {k: tuple(v) for k, v in initial_state.items()}

    @classmethod
    def for_experiment(cls, config: ExperimentConfig, obs_space: gym.Space, action_space: gym.Space) -> ChunkCheck:
        """What the experiment's algorithm needs, as its spec declares (``chunk_needs``)."""
        needs = config.algorithm.chunk_needs(config.algo_config, action_space)
        return cls(obs_space, action_space, needs.extras, needs.initial_state)

    def problem(self, chunk: Chunk) -> str | None:
        steps = chunk.num_steps
        if steps < 1:
            return "chunk has no steps"
        problem = (_array_problem("actions", chunk.actions, (steps, *self.action_shape),
                                  "iu" if self.discrete else "f")
                   or _array_problem("rewards", chunk.rewards, (steps,), "f")
                   or _array_problem("terminated", chunk.terminated, (steps,), "b")
                   or _array_problem("truncated", chunk.truncated, (steps,), "b")
                   or _array_problem("policy_version", chunk.policy_version, (steps,), "iu"))
        if problem:
            return problem
        if self.discrete:
            low, high = self.action_range
            if chunk.actions.min() < low or chunk.actions.max() >= high:
                return f"actions outside [{low}, {high})"
        problem = _leaf_problems(self.template, chunk.obs, "", steps + 1)
        if problem:
            return problem
        ended = set(np.flatnonzero(chunk.terminated | chunk.truncated).tolist())
        if set(chunk.final_obs) != ended:
            return f"final_obs given for steps {sorted(chunk.final_obs)}, episodes ended at {sorted(ended)}"
        return (next(filter(None, (_leaf_problems(self.template, obs, f" (final, step {t})", None)
                                   for t, obs in chunk.final_obs.items())), None)
                or self._extras_problem(chunk.extras, steps))

    def _extras_problem(self, extras: dict[str, Any], steps: int) -> str | None:
        for name, shape in self.extra_shapes.items():
            value = extras.get(name)
            if shape is None:
                if not isinstance(value, np.ndarray) or value.shape[:1] != (steps,):
                    return f"extras[{name!r}] is missing or not [{steps}, ...]"
                continue
            problem = _array_problem(f"extras[{name!r}]", value, (steps, *shape), "f")
            if problem:
                return problem
        if self.initial_state is not None:
            state = extras.get(INITIAL_STATE)
            if not isinstance(state, dict) or set(state) != set(self.initial_state):
                found = sorted(state) if isinstance(state, dict) else None
                return f"extras[{INITIAL_STATE!r}] has keys {found}, expected {sorted(self.initial_state)}"
            for key, shape in self.initial_state.items():
                problem = _array_problem(f"extras[{INITIAL_STATE!r}][{key!r}]", state[key], shape, "f")
                if problem:
                    return problem
        return None
