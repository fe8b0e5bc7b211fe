"""Building environments: :func:`make_env`, :func:`make_vector_env` and :func:`step_vector_env`.

Every family ends in the same outer stack: ``RecordEpisodeStatistics`` (whole episodes, raw
rewards, lengths in agent steps; Atari places it below episodic life, see
:mod:`surreal_redis.envs.atari`) -> float32 observations -> :class:`FrameTupleStack`
(``frame_stack > 1``) -> the space check.

Vector envs use gymnasium's ``AutoresetMode.SAME_STEP``: the step where an episode ends already
returns the first observation of the next episode, and the true last observation is reported
beside it (:func:`step_vector_env` collects these per env). That is exactly a chunk's layout
(``obs[t+1]`` is the reset observation, ``final_obs[t]`` the true last one), and no step is wasted
on the dummy action NEXT_STEP mode needs.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.envs.atari import atari_env_id, make_atari
from surreal_redis.envs.config import EnvConfig, EnvError, Mode, require_extra
from surreal_redis.envs.robosuite_adapter import RobosuiteEnv
from surreal_redis.envs.wrappers import ActionRepeat, Float32Observations, FrameTupleStack, check_spaces

logger = logging.getLogger(__name__)

SUPPORTED = ("any registered gymnasium id (CartPole-v1, Pendulum-v1, ...); Atari games by name "
             "(pong, Pong, PongNoFrameskip-v4, ALE/Pong-v5; 'atari' extra); MuJoCo ids "
             "(HalfCheetah-v5, ...; 'mujoco' extra); dm_control/<domain>-<task>-v0 ('dmc' extra); "
             "robosuite/<task> ('robosuite' extra)")

Kind = Literal["gym", "atari", "mujoco", "dmc", "robosuite"]


class ResolvedEnvId(NamedTuple):
    gym_id: str
    kind: Kind


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


def _gym_make(config: EnvConfig, gym_id: str, **kwargs: Any) -> gym.Env:
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
    env = _gym_make(config, gym_id, **kwargs)
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


def _make_core(config: EnvConfig) -> tuple[gym.Env, str]:
    """The family's env with its episode statistics recorded."""
    gym_id, kind = resolve_env_id(config.env_id)
    if kind == "atari":
        return make_atari(config, gym_id), gym_id
    if kind == "dmc":
        env = _make_dmc(config, gym_id)
    elif kind == "robosuite":
        env = _make_robosuite(config, gym_id)
    else:
        if kind == "mujoco":
            require_extra(f"{gym_id!r} is a MuJoCo environment", "mujoco", {"mujoco": "mujoco"})
        env = _gym_make(config, gym_id)
    return gym.wrappers.RecordEpisodeStatistics(env), gym_id


def make_env(config: EnvConfig, seed: int, mode: Mode = "train") -> gym.Env:
    """Build, wrap, check and seed one environment.

    Args:
        config: see :class:`EnvConfig`; ``mode``'s overrides are applied first.
        seed: seeds the env (through a first ``reset(seed=seed)``, so later plain ``reset()`` calls
            continue that random stream) and its action space.
        mode: "train" or "eval" (eval plays whole Atari games with raw rewards).

    Raises:
        EnvError: unknown id, missing extra, unsupported action or observation space.
    """
    config = config.for_mode(mode)
    env, gym_id = _make_core(config)
    try:
        if Float32Observations.needed(env.observation_space):
            env = Float32Observations(env)
        if config.frame_stack > 1:
            env = FrameTupleStack(env, config.frame_stack)
        check_spaces(env, gym_id)
        env.reset(seed=seed)
        env.action_space.seed(seed)
    except BaseException:
        env.close()
        raise
    logger.debug("made %s env %s (seed %d): obs %s, actions %s", mode, gym_id, seed,
                 env.observation_space, env.action_space)
    return env


def make_vector_env(config: EnvConfig, num_envs: int | None = None, seed: int = 0,
                    mode: Mode = "train") -> gym.vector.SyncVectorEnv:
    """``num_envs`` (default ``config.num_envs``) envs stepped in lockstep in this process, env i
    seeded with ``seed + i``, reset automatically in the step where an episode ends (SAME_STEP).

    Step it with :func:`step_vector_env`; observations are batched trees with leaves ``[N, ...]``.
    """
    count = config.num_envs if num_envs is None else num_envs
    if count < 1:
        raise ValueError(f"num_envs must be >= 1, got {count}")
    return gym.vector.SyncVectorEnv(
        [functools.partial(make_env, config, seed + i, mode) for i in range(count)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


class EpisodeResult(NamedTuple):
    episode_return: float  # undiscounted sum of the env's raw rewards (Atari: the whole game)
    episode_length: int  # agent steps


class VectorStep(NamedTuple):
    """One step of N envs (from :func:`step_vector_env`).

    ``obs``: tree with leaves ``[N, ...]``, the observation each env shows now (for an env whose
    episode just ended, the first one of its next episode); ``rewards`` float32 ``[N]`` (clipped
    when the env clips them); ``terminated``, ``truncated`` bool ``[N]``; ``final_obs``: env index ->
    true last observation of the episode that ended at this step (no batch axis), for every env
    with terminated or truncated set; ``episodes``: env index -> raw return and length, for every
    env whose whole episode ended (with Atari's episodic life a lost life sets ``terminated`` and
    ``final_obs`` but reports no episode: the game goes on); ``infos``: gymnasium's batched info.
    """

    obs: Tree
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, Tree]
    episodes: dict[int, EpisodeResult]
    infos: dict[str, Any]


def step_vector_env(envs: gym.vector.VectorEnv, actions: np.ndarray) -> VectorStep:
    """Step a SAME_STEP vector env (see :func:`make_vector_env`) with ``actions`` ``[N, ...]``."""
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    ended = np.flatnonzero(np.logical_or(terminated, truncated)).tolist()
    final_obs = {i: infos["final_obs"][i] for i in ended}
    episodes = {}
    final_info = infos.get("final_info", {})
    stats, reported = final_info.get("episode"), final_info.get("_episode")
    if stats is not None:
        for i in ended:
            if reported is None or reported[i]:
                episodes[i] = EpisodeResult(float(stats["r"][i]), int(stats["l"][i]))
    return VectorStep(obs, np.asarray(rewards, dtype=np.float32), np.asarray(terminated, dtype=bool),
                      np.asarray(truncated, dtype=bool), final_obs, episodes, infos)
