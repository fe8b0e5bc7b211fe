"""robosuite tasks (``robosuite/Lift``, ``robosuite/Stack``, ...) behind the gymnasium API.

Unlike robosuite's ``GymWrapper``, which flattens every key, camera images included, into one
vector, this keeps ``state`` and ``pixels`` apart: the CNN sees the image, the z-filter only the
state, and the hub stores every frame once. Episodes end only at the horizon, as a truncation.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.envs.config import EnvError, PixelConfig, RobosuiteConfig

STATE_KEYS = ("robot0_proprio-state", "object-state")
DEFAULT_CAMERA = "agentview"


def robosuite_missing() -> str | None:  # why robosuite cannot be used here, or None
    if importlib.util.find_spec("robosuite") is None:
        return "robosuite is not installed, which the 'robosuite' extra brings: pip install 'surreal-redis[robosuite]'"
    return None


class RobosuiteEnv(gym.Env):
    """One robosuite ``task`` (``Lift``, ``Stack``, ...); observations ``{"state": float32 [D]}``
    (proprio-state, then object state) and, with ``pixels.enabled``, ``"pixels"`` (uint8
    ``(size, size, 3)``, upright). ``kwargs`` go to ``robosuite.make``.
    """

    metadata = {"render_modes": []}

    def __init__(self, task: str, config: RobosuiteConfig, pixels: PixelConfig, **kwargs: Any) -> None:
        problem = robosuite_missing()
        if problem:
            raise EnvError(f"robosuite/{task}: {problem}")
        # headless rendering: EGL unless the user chose a backend (osmesa, glfw)
        os.environ.setdefault("MUJOCO_GL", "egl")
        import robosuite

        self.camera = (pixels.camera or DEFAULT_CAMERA) if pixels.enabled else None
        robots = [r.strip() for r in config.robots.split(",")]
        options: dict[str, Any] = dict(
            robots=robots if len(robots) > 1 else robots[0], has_renderer=False,
            has_offscreen_renderer=self.camera is not None, use_camera_obs=self.camera is not None,
            reward_shaping=config.reward_shaping, control_freq=config.control_freq, horizon=config.horizon,
            ignore_done=False, hard_reset=False)
        if self.camera is not None:
            options.update(camera_names=self.camera, camera_heights=pixels.size, camera_widths=pixels.size)
        if config.controller:
            options["controller_configs"] = robosuite.load_composite_controller_config(
                controller=config.controller, robot=robots[0])
        options.update(kwargs)
        try:
            self._env = robosuite.make(task, **options)
        except Exception as exc:
            raise EnvError(f"robosuite/{task} could not be made: {type(exc).__name__}: {exc}") from exc
        low, high = self._env.action_spec
        self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        first = self._env.reset()
        spaces: dict[str, gym.Space] = {
            "state": gym.spaces.Box(-np.inf, np.inf, self._state(first).shape, np.float32)}
        if self.camera is not None:
            spaces["pixels"] = gym.spaces.Box(0, 255, (pixels.size, pixels.size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self._seeded = False

    def _state(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(raw[k], np.float32).ravel() for k in STATE_KEYS if k in raw])

    def _obs(self, raw: dict[str, np.ndarray]) -> Tree:
        obs = {"state": self._state(raw)}
        if self.camera is not None:
            # robosuite renders with OpenGL's origin at the bottom: flip to the usual top-down image
            obs["pixels"] = np.ascontiguousarray(raw[f"{self.camera}_image"][::-1])
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Tree, dict]:
        super().reset(seed=seed)
        if seed is not None:
            # robosuite draws object placements and robot noise from one generator that its
            # placement samplers share: reseed that object in place
            self._env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        return self._obs(self._env.reset()), {}

    def step(self, action: np.ndarray) -> tuple[Tree, float, bool, bool, dict]:
        raw, reward, done, info = self._env.step(np.asarray(action, np.float64))
        info = dict(info)
        info["success"] = bool(self._env._check_success())
        return self._obs(raw), float(reward), False, bool(done), info

    def close(self) -> None:
        self._env.close()
