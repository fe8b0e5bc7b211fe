"""Building environments: :func:`make_env`, :func:`make_vector_env` and :func:`step_vector_env`.

The family's env (``env.family``, or the one :func:`~surreal_redis.envs.families.resolve_env_id`
picks) gets the same outer stack: ``RecordEpisodeStatistics`` (unless the family's env records
episodes itself, as Atari does) -> float32 observations -> :class:`FrameTupleStack` -> the space check.

Vector envs use gymnasium's ``AutoresetMode.SAME_STEP``: the step where an episode ends already
returns the first observation of the next episode, and the true last one beside it. That is a
chunk's layout (``obs[t+1]`` the reset observation, ``final_obs[t]`` the true last one), and no
step is wasted on the dummy action NEXT_STEP mode needs.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.envs.config import EnvConfig, Mode, env_family
from surreal_redis.envs.families import resolve_env_id
from surreal_redis.envs.wrappers import Float32Observations, FrameTupleStack, check_spaces

logger = logging.getLogger(__name__)


def _records_episodes(env: gym.Env) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.RecordEpisodeStatistics):
            return True
        env = env.env
    return False


def make_env(config: EnvConfig, seed: int, mode: Mode = "train") -> gym.Env:
    """Build, wrap, check and seed one environment, with ``mode``'s overrides applied to ``config``.

    ``seed`` seeds the env (through a first ``reset(seed=seed)``, so later plain ``reset()`` calls
    continue that random stream) and its action space. Raises :class:`EnvError` for an unknown id,
    a missing extra, or an unsupported action or observation space.
    """
    config = config.for_mode(mode)
    gym_id, family = (config.env_id, config.family) if config.family else resolve_env_id(config.env_id)
    env = env_family(family)(config, gym_id)
    # Atari records whole games below its episodic life; a second recorder would meet its stats
    if not _records_episodes(env):
        env = gym.wrappers.RecordEpisodeStatistics(env)
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
    seeded with ``seed + i``, autoreset SAME_STEP; step it with :func:`step_vector_env`."""
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

    ``obs``: leaves ``[N, ...]``, what each env shows now (after an episode end, the next episode's
    first observation); ``rewards`` float32 ``[N]`` (clipped when the env clips them);
    ``terminated``, ``truncated`` bool ``[N]``; ``final_obs``: env index -> true last observation
    (no batch axis) of each episode that ended; ``episodes``: env index -> raw return and length of
    each whole episode that ended (an Atari lost life reports none); ``infos``: gymnasium's.
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
    final_info = infos.get("final_info", {})
    stats, reported = final_info.get("episode"), final_info.get("_episode")
    episodes = {} if stats is None else {i: EpisodeResult(float(stats["r"][i]), int(stats["l"][i]))
                                         for i in ended if reported is None or reported[i]}
    return VectorStep(obs, np.asarray(rewards, dtype=np.float32), np.asarray(terminated, dtype=bool),
                      np.asarray(truncated, dtype=bool), final_obs, episodes, infos)
