"""A toy environment defined outside the package, to prove that adding one touches no package file:
a corridor of cells, the agent starting at the left end and stepping left or right; reaching the
right end pays 1.0 and ends the episode, every other step pays 0. Every return is 0 or 1, and an
episode lasts at least ``length - 1`` steps, which CartPole's never are and do.

It opens both doors of docs/environments.md:

- ``env.env_id: corridor:Corridor-v0``: gymnasium imports this module (found on ``PYTHONPATH``) in
  every process that makes the env, and the ``gymnasium.register`` call below makes ``Corridor-v0``
  known (5 cells, 20 steps at most). No ``plugins`` entry is needed.
- ``plugins: [corridor]``, ``env.family: corridor``, ``env.env_id: corridor-<cells>``: every
  process imports this module before reading the config, and the ``register_family`` call below
  makes the family known; its builder reads the length from the id and takes
  ``env.max_episode_steps`` as the time limit.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from surreal_redis.envs import EnvConfig, EnvError, register_family


class Corridor(gym.Env):
    """Observation: the one-hot cell, float32 ``[length]``; actions: 0 left, 1 right (walls hold)."""

    def __init__(self, length: int = 5) -> None:
        if length < 2:
            raise ValueError(f"a corridor needs at least 2 cells, got {length}")
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cell = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.cell] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.cell = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.cell = int(np.clip(self.cell + (1 if int(action) == 1 else -1), 0, self.length - 1))
        arrived = self.cell == self.length - 1
        return self._obs(), 1.0 if arrived else 0.0, arrived, False, {}


gym.register(id="Corridor-v0", entry_point=Corridor, max_episode_steps=20, kwargs={"length": 5})


def make_corridor(config: EnvConfig, env_id: str) -> gym.Env:
    """``corridor-<cells>``: a corridor that long, cut at ``max_episode_steps`` (default 4 steps a cell)."""
    cells = env_id.removeprefix("corridor-")
    if not cells.isdigit():
        raise EnvError(f"the corridor family takes ids corridor-<cells>, got {env_id!r}")
    env = Corridor(int(cells), **config.kwargs)
    return gym.wrappers.TimeLimit(env, config.max_episode_steps or 4 * int(cells))


register_family("corridor", make_corridor)
