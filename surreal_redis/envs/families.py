"""The built-in environment families (``gym``, ``mujoco``, ``atari``, ``dmc``, ``robosuite``; see
docs/environments.md), and which one an ``env_id`` belongs to (:func:`resolve_env_id`, used when
``env.family`` is empty). :data:`BUILTIN_FAMILIES` is read by the table in
:mod:`surreal_redis.envs.config`.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.envs.atari import atari_env_id, make_atari
from surreal_redis.envs.config import EnvConfig, EnvError, MakeEnv, require_extra
from surreal_redis.envs.robosuite_adapter import RobosuiteEnv
from surreal_redis.envs.wrappers import ActionRepeat

SUPPORTED = ("any registered gymnasium id (CartPole-v1, Pendulum-v1, ...); Atari games by name "
             "(pong, Pong, PongNoFrameskip-v4, ALE/Pong-v5; 'atari' extra); MuJoCo ids "
             "(HalfCheetah-v5, ...; 'mujoco' extra); dm_control/<domain>-<task>-v0 ('dmc' extra); "
             "robosuite/<task> ('robosuite' extra); your own: my_pkg.envs:MyEnv-v0 (gymnasium imports "
             "my_pkg.envs first) or env.family (docs: Environments)")


class ResolvedEnvId(NamedTuple):
    gym_id: str  # the id the family's builder gets (Atari names become their ALE v5 id)
    family: str


def resolve_env_id(env_id: str) -> ResolvedEnvId:
    """Classify ``env_id``; registered non-ALE gymnasium ids win over Atari names (``Blackjack-v1``
    is gymnasium's card game, ``blackjack`` the Atari one)."""
    if env_id.startswith("dm_control/"):
        return ResolvedEnvId(env_id, "dmc")
    if env_id.startswith("robosuite/"):
        return ResolvedEnvId(env_id, "robosuite")
    spec = gym.registry.get(env_id)
    entry_point = str(getattr(spec, "entry_point", ""))
    if spec is not None and "ale_py" not in entry_point:
        return ResolvedEnvId(env_id, "mujoco" if "envs.mujoco" in entry_point else "gym")
    atari = atari_env_id(env_id)
    if atari is not None:
        return ResolvedEnvId(atari, "atari")
    return ResolvedEnvId(env_id, "gym")


def make_gym(config: EnvConfig, gym_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` with the time limit counted in agent steps, then the action repeat."""
    repeat = config.action_repeat
    limit = None if config.max_episode_steps is None else config.max_episode_steps * repeat
    try:
        env = gym.make(gym_id, max_episode_steps=limit, **{**kwargs, **config.kwargs})
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(f"environment {gym_id!r} needs a package that is not installed: {exc}") from exc
    except gym.error.Error as exc:
        raise EnvError(f"unknown environment id {config.env_id!r} ({exc}); supported: {SUPPORTED}") from exc
    return ActionRepeat(env, repeat) if repeat > 1 else env


def _make_mujoco(config: EnvConfig, gym_id: str) -> gym.Env:
    require_extra(f"{gym_id!r} is a MuJoCo environment", "mujoco", {"mujoco": "mujoco"})
    return make_gym(config, gym_id)


def _make_atari(config: EnvConfig, gym_id: str) -> gym.Env:
    # with env.family: atari the id comes as written (pong), not as resolve_env_id's ALE id
    return make_atari(config, atari_env_id(gym_id) or gym_id)


def _make_dmc(config: EnvConfig, gym_id: str) -> gym.Env:
    require_extra(f"{gym_id!r} is a dm_control task", "dmc", {"dm-control": "dm_control", "shimmy": "shimmy"})
    # headless rendering: EGL unless the user chose a backend (glfw needs a display); dm_control
    # reads this when it is first imported
    os.environ.setdefault("MUJOCO_GL", "egl")
    import shimmy

    gym.register_envs(shimmy)
    pixels = config.pixels
    kwargs: dict[str, Any] = {}
    if pixels.enabled:
        camera = int(pixels.camera or 0)
        kwargs = {"render_mode": "rgb_array",
                  "render_kwargs": {"width": pixels.size, "height": pixels.size, "camera_id": camera}}
    env = make_gym(config, gym_id, **kwargs)
    if pixels.enabled:
        # rendered once per agent step (after the action repeat)
        env = gym.wrappers.AddRenderObservation(env, render_only=not pixels.keep_state, render_key="pixels",
                                                obs_key="state")
        # dm_control's renders are flipped views (negative strides), which torch cannot take
        env = gym.wrappers.TransformObservation(env, _contiguous_pixels, env.observation_space)
    return env


def _contiguous_pixels(obs: Tree) -> Tree:
    if isinstance(obs, dict):
        return {**obs, "pixels": np.ascontiguousarray(obs["pixels"])}
    return np.ascontiguousarray(obs)


def _make_robosuite(config: EnvConfig, gym_id: str) -> gym.Env:
    env: gym.Env = RobosuiteEnv(gym_id.removeprefix("robosuite/"), config.robosuite, config.pixels, **config.kwargs)
    if config.action_repeat > 1:
        env = ActionRepeat(env, config.action_repeat)
    if config.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, config.max_episode_steps)
    return env


BUILTIN_FAMILIES: dict[str, MakeEnv] = {
    "gym": make_gym,
    "mujoco": _make_mujoco,
    "atari": _make_atari,
    "dmc": _make_dmc,
    "robosuite": _make_robosuite,
}
