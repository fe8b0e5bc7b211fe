"""Wrappers every env family shares: frame stacks kept as separate frames, action repeat,
float32 observations, and the check that agents and learner can handle the spaces."""

from __future__ import annotations

import collections
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.envs.config import EnvError
from surreal_redis.envs.spaces import is_frame_tuple, is_image_space


class FrameTupleStack(gym.Wrapper):
    """Keeps the last K frames of each image observation (a Box, or the image entries of a Dict) as
    ``Tuple(K x Box)``; after a reset all K are the first frame. Frames are copied once on arrival
    and never written again, so downstream can deduplicate them by identity or content.
    """

    def __init__(self, env: gym.Env, num_frames: int) -> None:
        super().__init__(env)
        space = env.observation_space
        if is_image_space(space):
            self._keys: tuple[str | None, ...] = (None,)
            self.observation_space = gym.spaces.Tuple([space] * num_frames)
        elif isinstance(space, gym.spaces.Dict) and any(is_image_space(s) for s in space.spaces.values()):
            self._keys = tuple(k for k, s in space.spaces.items() if is_image_space(s))
            self.observation_space = gym.spaces.Dict(
                {k: gym.spaces.Tuple([s] * num_frames) if k in self._keys else s for k, s in space.spaces.items()})
        else:
            raise EnvError(f"frame_stack={num_frames} needs uint8 image observations (Box uint8 of shape "
                           f"(H, W), (H, W, C) or (C, H, W), or a Dict holding some); got {space}")
        self._num_frames = num_frames
        self._frames: dict[str | None, collections.deque[np.ndarray]] = {
            key: collections.deque(maxlen=num_frames) for key in self._keys}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Tree, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        for key, frames in self._frames.items():
            frame = np.array(obs if key is None else obs[key], copy=True)
            frames.extend([frame] * self._num_frames)
        return self._observation(obs), info

    def step(self, action: Any) -> tuple[Tree, SupportsFloat, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        for key, frames in self._frames.items():
            frames.append(np.array(obs if key is None else obs[key], copy=True))
        return self._observation(obs), reward, terminated, truncated, info

    def _observation(self, obs: Tree) -> Tree:
        if self._keys == (None,):
            return tuple(self._frames[None])
        return {k: tuple(self._frames[k]) if k in self._frames else v for k, v in obs.items()}


class ActionRepeat(gym.Wrapper):
    """Repeats each action ``repeat`` times, summing the rewards; stops early at an episode end."""

    def __init__(self, env: gym.Env, repeat: int) -> None:
        super().__init__(env)
        self.repeat = repeat

    def step(self, action: Any) -> tuple[Tree, float, bool, bool, dict]:
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def _float32_space(space: gym.Space) -> gym.Space:
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
        return gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: _float32_space(s) for k, s in space.spaces.items()})
    return space


class Float32Observations(gym.ObservationWrapper):
    """float64 observation leaves (MuJoCo, dm_control, robosuite) as float32: what the networks
    compute in, and half the bytes in the hub."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = _float32_space(env.observation_space)

    def observation(self, observation: Tree) -> Tree:
        if isinstance(observation, dict):
            return {k: self.observation(v) for k, v in observation.items()}
        if isinstance(observation, np.ndarray) and observation.dtype == np.float64:
            return observation.astype(np.float32)
        return observation

    @staticmethod
    def needed(space: gym.Space) -> bool:  # whether ``space`` has a float64 Box leaf (to convert)
        return _float32_space(space) != space


def check_spaces(env: gym.Env, env_id: str) -> None:
    """Raise :class:`EnvError` unless the action space is Box or Discrete and the observation space
    is a Box, a frame tuple, or a Dict of those."""
    action = env.action_space
    if not isinstance(action, (gym.spaces.Box, gym.spaces.Discrete)):
        raise EnvError(f"environment {env_id!r} has action space {action}; supported: Box, Discrete")

    def supported(space: gym.Space) -> bool:
        return isinstance(space, gym.spaces.Box) or is_frame_tuple(space)

    obs = env.observation_space
    leaves = obs.spaces if isinstance(obs, gym.spaces.Dict) else {"": obs}
    bad = next((key for key, space in leaves.items() if not supported(space)), None)
    if bad is not None:
        where = f"observation leaf {bad!r} is {leaves[bad]}" if bad else f"observation space {obs}"
        raise EnvError(f"environment {env_id!r}: {where}; supported: Box, Tuple of identical uint8 frames "
                       "(frame_stack), or a Dict of those")
