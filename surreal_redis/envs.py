"""Environments: :func:`make_env` and :func:`make_vector_env` for gymnasium ids, Atari games (with
the ``atari`` extra) and MuJoCo ids (with the ``mujoco`` extra), plus the wrappers agents rely on.

Wrapper stack, innermost first: the gymnasium env (Atari: ``frameskip=1`` and gymnasium's
``AtariPreprocessing``, which does the frame skip) -> ``TimeLimit`` (``max_episode_steps`` agent
steps) -> :class:`FrameTupleStack` (``frame_stack > 1``) -> ``RecordEpisodeStatistics``.

Frame stacks are kept as a tuple of K separate frames (a ``gymnasium.spaces.Tuple`` of K identical
uint8 Boxes, see :func:`surreal_redis.algos.networks.is_frame_tuple`), so the hub and the replay,
which deduplicate by content, store each frame once instead of K times.

Vector envs use gymnasium's ``AutoresetMode.SAME_STEP``: the step where an episode ends already
returns the first observation of the next episode, and the true last observation is reported
beside it (:func:`step_vector_env` collects these per env). That is exactly a chunk's layout
(``obs[t+1]`` is the reset observation, ``final_obs[t]`` the true last one), and no step is wasted
on the dummy action NEXT_STEP mode needs.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree

logger = logging.getLogger(__name__)

Mode = Literal["train", "eval"]

# ALE ROM names; the gymnasium id is "ALE/" + rom.title() without underscores + "-v5".
ATARI_GAMES = (
    "adventure", "air_raid", "alien", "amidar", "assault", "asterix", "asteroids", "atlantis",
    "atlantis2", "backgammon", "bank_heist", "basic_math", "battle_zone", "beam_rider", "berzerk",
    "blackjack", "bowling", "boxing", "breakout", "carnival", "casino", "centipede",
    "chopper_command", "combat", "crazy_climber", "crossbow", "darkchambers", "defender",
    "demon_attack", "donkey_kong", "double_dunk", "earthworld", "elevator_action", "enduro",
    "entombed", "et", "fishing_derby", "flag_capture", "freeway", "frogger", "frostbite",
    "galaxian", "gopher", "gravitar", "hangman", "haunted_house", "hero", "human_cannonball",
    "ice_hockey", "jamesbond", "journey_escape", "kaboom", "kangaroo", "keystone_kapers",
    "king_kong", "klax", "koolaid", "krull", "kung_fu_master", "laser_gates", "lost_luggage",
    "mario_bros", "miniature_golf", "montezuma_revenge", "mr_do", "ms_pacman", "name_this_game",
    "othello", "pacman", "phoenix", "pitfall", "pitfall2", "pong", "pooyan", "private_eye", "qbert",
    "riverraid", "road_runner", "robotank", "seaquest", "sir_lancelot", "skiing", "solaris",
    "space_invaders", "space_war", "star_gunner", "superman", "surround", "tennis", "tetris",
    "tic_tac_toe_3d", "time_pilot", "trondead", "turmoil", "tutankham", "up_n_down", "venture",
    "video_checkers", "video_chess", "video_cube", "video_pinball", "wizard_of_wor",
    "word_zapper", "yars_revenge", "zaxxon",
)

SUPPORTED = ("any registered gymnasium id (CartPole-v1, Pendulum-v1, ...); Atari games by name "
             "(pong, Pong, PongNoFrameskip-v4, ALE/Pong-v5; 'atari' extra); MuJoCo ids "
             "(HalfCheetah-v5, ...; 'mujoco' extra)")


class EnvError(ValueError):
    """An environment that cannot be built or is not supported; the message says what is."""


@dataclass(frozen=True)
class AtariConfig:
    """Atari settings (gymnasium's ``AtariPreprocessing`` and ALE v5 options).

    Attributes:
        frame_skip: emulator frames per agent step (max-pooled over the last two).
        screen_size: observations are resized to ``screen_size x screen_size``.
        grayscale: (H, W) grayscale frames instead of (H, W, 3) RGB.
        noop_max: at most this many no-op actions after each reset.
        terminal_on_life_loss: end the episode (terminated) when a life is lost.
        repeat_action_probability: sticky actions; 0.25 is ALE v5's default (Machado et al. 2018).
        full_action_space: all 18 actions instead of the game's minimal set.
    """

    frame_skip: int = 4
    screen_size: int = 84
    grayscale: bool = True
    noop_max: int = 30
    terminal_on_life_loss: bool = False
    repeat_action_probability: float = 0.25
    full_action_space: bool = False

    def __post_init__(self) -> None:
        for name in ("frame_skip", "screen_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"atari.{name} must be >= 1, got {getattr(self, name)}")
        if self.noop_max < 0:
            raise ValueError(f"atari.noop_max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ValueError(f"atari.repeat_action_probability must be in [0, 1], got {self.repeat_action_probability}")


@dataclass(frozen=True)
class EnvModeOverrides:
    """Settings that differ in one mode (eval); None keeps the base value.

    Attributes:
        max_episode_steps: replaces the base time limit.
        atari: replaces the base Atari settings.
        kwargs: merged over the base ``gymnasium.make`` keyword arguments.
    """

    max_episode_steps: int | None = None
    atari: AtariConfig | None = None
    kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class EnvConfig:
    """Which environment agents run, and how it is wrapped.

    Attributes:
        env_id: gymnasium id, Atari game name, or MuJoCo id (see ``SUPPORTED``).
        frame_stack: K > 1 keeps the last K frames of each uint8 image observation as a tuple.
        max_episode_steps: time limit in agent steps (truncation); None keeps the env's own.
        num_envs: envs per agent process (a SyncVectorEnv).
        kwargs: extra keyword arguments for ``gymnasium.make``.
        atari: Atari preprocessing, used only for Atari games.
        eval: what changes in eval mode.
    """

    env_id: str = "CartPole-v1"
    frame_stack: int = 1
    max_episode_steps: int | None = None
    num_envs: int = 1
    kwargs: dict[str, Any] = field(default_factory=dict)
    atari: AtariConfig = field(default_factory=AtariConfig)
    eval: EnvModeOverrides = field(default_factory=EnvModeOverrides)

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ValueError("env_id must not be empty")
        if self.frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {self.frame_stack}")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        for limit in (self.max_episode_steps, self.eval.max_episode_steps):
            if limit is not None and limit < 1:
                raise ValueError(f"max_episode_steps must be >= 1 or None, got {limit}")

    def for_mode(self, mode: Mode) -> EnvConfig:
        """This config with ``mode``'s overrides applied ("train" uses the base settings)."""
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        if mode == "train":
            return self
        over = self.eval
        return dataclasses.replace(
            self,
            max_episode_steps=over.max_episode_steps if over.max_episode_steps is not None else self.max_episode_steps,
            atari=over.atari if over.atari is not None else self.atari,
            kwargs={**self.kwargs, **(over.kwargs or {})},
        )


# ---------------------------------------------------------------- ids

def atari_env_id(name: str) -> str | None:
    """The ALE v5 id for an Atari game name, or None if ``name`` names no Atari game.

    Accepts ``pong``, ``Pong``, ``space_invaders``, ``SpaceInvaders``, ``PongNoFrameskip-v4``,
    ``PongDeterministic-v4``, ``Pong-v4``, ``ALE/Pong-v5`` (all -> ``ALE/Pong-v5``; frame skip and
    sticky actions come from :class:`AtariConfig`, not from the name).
    """
    base = re.sub(r"-v\d+$", "", name.removeprefix("ALE/"))
    base = re.sub(r"(NoFrameskip|Deterministic)$", "", base)
    key = base.replace("_", "").lower()
    for rom in ATARI_GAMES:
        if rom.replace("_", "") == key:
            return f"ALE/{rom.title().replace('_', '')}-v5"
    return None


class ResolvedEnvId(NamedTuple):
    gym_id: str
    kind: Literal["gym", "atari", "mujoco"]


def resolve_env_id(env_id: str) -> ResolvedEnvId:
    """Classify ``env_id``; registered non-ALE gymnasium ids win over Atari names (``Blackjack-v1``
    is gymnasium's card game, ``blackjack`` the Atari one)."""
    spec = gym.registry.get(env_id)
    entry_point = str(getattr(spec, "entry_point", ""))
    if spec is not None and "ale_py" not in entry_point:
        return ResolvedEnvId(env_id, "mujoco" if "envs.mujoco" in entry_point else "gym")
    atari = atari_env_id(env_id)
    if atari is not None:
        return ResolvedEnvId(atari, "atari")
    return ResolvedEnvId(env_id, "gym")


# ---------------------------------------------------------------- wrappers

def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)


class FrameTupleStack(gym.Wrapper):
    """Keeps the last K frames of each uint8 image observation as a tuple of K separate arrays.

    Box image observations become ``Tuple(K x Box)``; in a Dict, image entries are stacked and the
    others (low-dim state) passed through. After a reset all K entries are the same first frame.
    Frames are copied once on arrival and never written again, so a frame object shared by K
    consecutive observations can be deduplicated by identity or content downstream.
    """

    def __init__(self, env: gym.Env, num_frames: int) -> None:
        super().__init__(env)
        space = env.observation_space
        if _is_image(space):
            self._keys: tuple[str | None, ...] = (None,)
            self.observation_space = gym.spaces.Tuple([space] * num_frames)
        elif isinstance(space, gym.spaces.Dict) and any(_is_image(s) for s in space.spaces.values()):
            self._keys = tuple(k for k, s in space.spaces.items() if _is_image(s))
            self.observation_space = gym.spaces.Dict(
                {k: gym.spaces.Tuple([s] * num_frames) if k in self._keys else s for k, s in space.spaces.items()})
        else:
            raise EnvError(f"frame_stack={num_frames} needs uint8 image observations (Box uint8 of shape "
                           f"(H, W) or (H, W, C), or a Dict holding some); got {space}")
        self._frames = {key: collections.deque(maxlen=num_frames) for key in self._keys}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Tree, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        for key, frames in self._frames.items():
            frame = np.array(obs if key is None else obs[key], copy=True)
            frames.extend([frame] * frames.maxlen)
        return self._observation(obs), info

    def step(self, action: Any) -> tuple[Tree, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        for key, frames in self._frames.items():
            frames.append(np.array(obs if key is None else obs[key], copy=True))
        return self._observation(obs), reward, terminated, truncated, info

    def _observation(self, obs: Tree) -> Tree:
        if self._keys == (None,):
            return tuple(self._frames[None])
        return {k: tuple(self._frames[k]) if k in self._frames else v for k, v in obs.items()}


def check_spaces(env: gym.Env, env_id: str) -> None:
    """Raise :class:`EnvError` unless the action space is Box or Discrete and the observation space
    is a Box, a frame tuple, or a Dict of those."""
    action = env.action_space
    if not isinstance(action, (gym.spaces.Box, gym.spaces.Discrete)):
        raise EnvError(f"environment {env_id!r} has action space {action}; supported: Box, Discrete")

    def supported(space: gym.Space) -> bool:
        if isinstance(space, gym.spaces.Box):
            return True
        return isinstance(space, gym.spaces.Tuple) and len(space.spaces) > 0 and all(
            _is_image(s) and s == space.spaces[0] for s in space.spaces)

    obs = env.observation_space
    leaves = obs.spaces.values() if isinstance(obs, gym.spaces.Dict) else [obs]
    if not all(supported(s) for s in leaves):
        raise EnvError(f"environment {env_id!r} has observation space {obs}; supported: Box, Tuple of "
                       "identical uint8 frames (frame_stack), or a Dict of those")


# ---------------------------------------------------------------- construction

def _make_base(config: EnvConfig) -> tuple[gym.Env, str]:
    gym_id, kind = resolve_env_id(config.env_id)
    if kind == "atari":
        missing = [name for name, module in (("ale-py", "ale_py"), ("opencv-python", "cv2"))
                   if importlib.util.find_spec(module) is None]
        if missing:
            raise EnvError(f"{config.env_id!r} is the Atari game {gym_id}, which needs the 'atari' extra "
                           f"(missing: {', '.join(missing)}): pip install 'surreal-redis[atari]'")
        import ale_py

        gym.register_envs(ale_py)
        atari = config.atari
        # frameskip=1: AtariPreprocessing skips frames itself (and max-pools the last two)
        env = gym.make(gym_id, frameskip=1, repeat_action_probability=atari.repeat_action_probability,
                       full_action_space=atari.full_action_space, **config.kwargs)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=atari.noop_max, frame_skip=atari.frame_skip, screen_size=atari.screen_size,
            terminal_on_life_loss=atari.terminal_on_life_loss, grayscale_obs=atari.grayscale)
        if config.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, config.max_episode_steps)
        return env, gym_id
    if kind == "mujoco" and importlib.util.find_spec("mujoco") is None:
        raise EnvError(f"{gym_id!r} is a MuJoCo environment, which needs the 'mujoco' extra: "
                       "pip install 'surreal-redis[mujoco]'")
    try:
        return gym.make(gym_id, max_episode_steps=config.max_episode_steps, **config.kwargs), gym_id
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(f"environment {gym_id!r} needs a package that is not installed: {exc}") from exc
    except gym.error.Error as exc:
        raise EnvError(f"unknown environment id {config.env_id!r} ({exc}); supported: {SUPPORTED}") from exc


def make_env(config: EnvConfig, seed: int, mode: Mode = "train") -> gym.Env:
    """Build, wrap, check and seed one environment.

    Args:
        config: see :class:`EnvConfig`; ``mode``'s overrides are applied first.
        seed: seeds the env (through a first ``reset(seed=seed)``, so later plain ``reset()`` calls
            continue that random stream) and its action space.
        mode: "train" or "eval".

    Raises:
        EnvError: unknown id, missing extra, unsupported action or observation space.
    """
    config = config.for_mode(mode)
    env, gym_id = _make_base(config)
    try:
        if config.frame_stack > 1:
            env = FrameTupleStack(env, config.frame_stack)
        check_spaces(env, gym_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
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
    episode_return: float  # undiscounted sum of the env's rewards
    episode_length: int  # agent steps


class VectorStep(NamedTuple):
    """One step of N envs (from :func:`step_vector_env`).

    ``obs``: tree with leaves ``[N, ...]``, the observation each env shows now (for an env whose
    episode just ended, the first one of its next episode); ``rewards`` float32 ``[N]``;
    ``terminated``, ``truncated`` bool ``[N]``; ``final_obs``: env index -> true last observation
    of the episode that ended at this step (no batch axis), for every env with terminated or
    truncated set; ``episodes``: env index -> return and length of that episode; ``infos``:
    gymnasium's batched info dict.
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
    stats = infos.get("final_info", {}).get("episode")
    if stats is not None:
        for i in ended:
            episodes[i] = EpisodeResult(float(stats["r"][i]), int(stats["l"][i]))
    return VectorStep(obs, np.asarray(rewards, dtype=np.float32), np.asarray(terminated, dtype=bool),
                      np.asarray(truncated, dtype=bool), final_obs, episodes, infos)
