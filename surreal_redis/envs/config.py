"""Environment settings: which env agents run and how each family is wrapped (frozen dataclasses,
loaded from the ``env:`` section of an experiment config), and the table of families that
``env.family`` names.

A family is a name and a builder ``make(config, env_id) -> gymnasium.Env``, as Sample Factory's
``register_env``, found as algorithms are (:mod:`surreal_redis.plugins`):

- Built-ins: :data:`surreal_redis.envs.families.BUILTIN_FAMILIES`, loaded the first time the table
  is read.
- Installed packages: an entry point in the group ``surreal_redis.env_families`` whose name is the
  family's and whose object is its builder, loaded the first time an unknown name is looked up.
- Plug-in modules: the config's ``plugins`` are imported before the config is parsed (by every
  process of the run), and the module calls :func:`register_family` at import.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

from surreal_redis.plugins import Registry

Mode = Literal["train", "eval"]
BUILTIN_FAMILIES_MODULE = "surreal_redis.envs.families"
ENTRY_POINT_GROUP = "surreal_redis.env_families"


class EnvError(ValueError):
    """An environment that cannot be built or is not supported; the message says what is."""


def require_extra(what: str, extra: str, modules: dict[str, str]) -> None:
    """:class:`EnvError` naming ``extra`` when any of ``modules`` (package -> import name) is missing."""
    import importlib.util

    missing = [package for package, module in modules.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise EnvError(f"{what}, which needs the {extra!r} extra (missing: {', '.join(missing)}): "
                       f"pip install 'surreal-redis[{extra}]'")


@dataclass(frozen=True)
class AtariConfig:
    """Atari preprocessing as CleanRL's ``ppo_atari.py`` and SB3's ``AtariWrapper`` do it."""

    frame_skip: int = 4
    """emulator frames per agent step; the observation is the max of the last two (flicker), the reward the
    sum over all of them."""
    screen_size: int = 84
    """frames are resized (area interpolation) to ``screen_size x screen_size``."""
    grayscale: bool = True
    """(H, W) grayscale frames instead of (H, W, 3) RGB."""
    noop_max: int = 30
    """after each game reset, 1 to ``noop_max`` no-op frames (0: none)."""
    episodic_life: bool = True
    """a lost life ends the episode the learner sees (``terminated``) without restarting the game; only a game
    over resets it. Train mode only."""
    fire_reset: bool = True
    """press FIRE after every reset (game or life) in games that have it."""
    clip_rewards: bool = True
    """rewards become their sign for training; episode returns stay raw. Train mode only."""
    repeat_action_probability: float = 0.25
    """sticky actions: 0.25 is ALE v5's default (Machado et al. 2018); 0.0 is what ``NoFrameskip-v4`` ids and
    the CleanRL/SB3 benchmarks use."""
    full_action_space: bool = False
    """all 18 actions instead of the game's minimal set."""

    def __post_init__(self) -> None:
        for name in ("frame_skip", "screen_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"atari.{name} must be >= 1, got {getattr(self, name)}")
        if self.noop_max < 0:
            raise ValueError(f"atari.noop_max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ValueError(f"atari.repeat_action_probability must be in [0, 1], got {self.repeat_action_probability}")


@dataclass(frozen=True)
class PixelConfig:
    """Camera observations for dm_control and robosuite (uint8 ``(size, size, 3)`` frames)."""

    enabled: bool = False
    """observe camera images (key ``pixels``); False: state vectors only."""
    size: int = 84
    """image height and width in pixels."""
    camera: str = ""
    """dm_control camera id (``"0"``, ``"1"``, ...) or robosuite camera name (``agentview``, ``frontview``,
    ...); empty: the family's default."""
    keep_state: bool = False
    """dm_control: keep the state observations beside the image (a Dict of its own keys and ``pixels``); False
    gives pixels only (a Box). robosuite always keeps ``state``."""

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"pixels.size must be >= 1, got {self.size}")


@dataclass(frozen=True)
class RobosuiteConfig:
    """robosuite settings (``env_id: robosuite/Lift``, ``robosuite/Stack``, ...)."""

    robots: str = "Panda"
    """robot model(s), comma-separated for two-arm tasks."""
    controller: str = ""
    """robosuite controller name; empty: the robot's default (OSC pose for Panda)."""
    control_freq: int = 20
    """control steps per simulated second (SURREAL and robosuite use 20)."""
    horizon: int = 500
    """control steps per episode; robosuite ends episodes only at the horizon, which is a truncation here."""
    reward_shaping: bool = True
    """dense staged rewards instead of the sparse success reward."""

    def __post_init__(self) -> None:
        if self.control_freq < 1 or self.horizon < 1:
            raise ValueError(f"robosuite.control_freq and horizon must be >= 1, got {self.control_freq}, {self.horizon}")


@dataclass(frozen=True)
class EnvModeOverrides:
    """Settings that differ in one mode (eval); None keeps the base value."""

    max_episode_steps: int | None = None
    """replaces the base time limit."""
    atari: AtariConfig | None = None
    """replaces the base Atari settings (eval still plays whole games with raw rewards)."""
    kwargs: dict[str, Any] | None = None
    """merged over the base ``gymnasium.make`` keyword arguments."""


@dataclass(frozen=True)
class EnvConfig:
    """Which environment agents run, and how it is wrapped."""

    env_id: str = "CartPole-v1"
    """gymnasium id (``CartPole-v1``, MuJoCo ``HalfCheetah-v5``; ``my_pkg.envs:Corridor-v0`` imports
    ``my_pkg.envs`` first, which registers it), Atari game name (``pong``, ``BreakoutNoFrameskip-v4``,
    ``ALE/Breakout-v5``), dm_control id (``dm_control/cheetah-run-v0``) or robosuite task
    (``robosuite/Lift``); with ``family`` set, whatever that family's builder takes."""
    family: str = ""
    """which family builds ``env_id``: empty picks a built-in one from the id (gym, mujoco, atari, dmc,
    robosuite); another name is one registered with ``surreal_redis.envs.register_family``, by a module in
    ``plugins`` for instance."""
    frame_stack: int = 1
    """K > 1 keeps the last K frames of each image observation as a tuple."""
    action_repeat: int = 1
    """each agent action is repeated this many env steps (rewards summed); Atari uses ``atari.frame_skip``
    instead."""
    max_episode_steps: int | None = None
    """time limit in agent steps (truncation); None keeps the env's own."""
    num_envs: int = 1
    """envs per agent process (a SyncVectorEnv)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """extra keyword arguments for ``gymnasium.make`` (or ``robosuite.make``)."""
    atari: AtariConfig = field(default_factory=AtariConfig)
    """Atari preprocessing, used only for Atari games."""
    pixels: PixelConfig = field(default_factory=PixelConfig)
    """camera observations for dm_control and robosuite."""
    robosuite: RobosuiteConfig = field(default_factory=RobosuiteConfig)
    """robosuite settings, used only for robosuite tasks."""
    eval: EnvModeOverrides = field(default_factory=EnvModeOverrides)
    """what changes in eval mode."""

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ValueError("env_id must not be empty")
        if self.family:
            env_family(self.family)  # an unknown name fails here, at load, naming the known ones
        for name in ("frame_stack", "action_repeat", "num_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for limit in (self.max_episode_steps, self.eval.max_episode_steps):
            if limit is not None and limit < 1:
                raise ValueError(f"max_episode_steps must be >= 1 or None, got {limit}")

    def for_mode(self, mode: Mode) -> EnvConfig:
        """This config with ``mode``'s overrides applied ("train" uses the base settings). Eval
        plays whole Atari games with raw rewards: no episodic life, no reward clipping."""
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        if mode == "train":
            return self
        over = self.eval
        atari = over.atari if over.atari is not None else self.atari
        return dataclasses.replace(
            self,
            max_episode_steps=over.max_episode_steps if over.max_episode_steps is not None else self.max_episode_steps,
            atari=dataclasses.replace(atari, episodic_life=False, clip_rewards=False),
            kwargs={**self.kwargs, **(over.kwargs or {})},
        )


MakeEnv = Callable[[EnvConfig, str], gym.Env]
"""A family's builder: the bare env for ``env_id`` under ``config`` (already in its mode; the builder
applies what it supports of ``kwargs``, ``max_episode_steps`` and ``action_repeat``). :func:`make_env
<surreal_redis.envs.make.make_env>` wraps it in the outer stack every family shares."""

def _qualname(make: MakeEnv) -> str:
    return f"{getattr(make, '__module__', '?')}.{getattr(make, '__qualname__', type(make).__name__)}"


def _builtins() -> list[tuple[str, MakeEnv]]:
    # imported by name: the built-in builders import this module for EnvConfig
    return list(importlib.import_module(BUILTIN_FAMILIES_MODULE).BUILTIN_FAMILIES.items())


FAMILIES: Registry[MakeEnv] = Registry("environment family", ENTRY_POINT_GROUP, _builtins,
                                       (callable, "a callable"), describe=lambda make: f"by {_qualname(make)}")


class UnknownFamily(EnvError):
    """No registered environment family has the name asked for."""


def register_family(name: str, make: MakeEnv) -> MakeEnv:
    """Make ``env.family: <name>`` build its envs with ``make(config, env_id)``; returns ``make``.
    Registering the same builder again is a no-op; another under a taken name raises ValueError."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"an environment family needs a non-empty name without surrounding spaces, got {name!r}")
    if not callable(make):
        raise TypeError(f"register_family({name!r}, make) takes a callable, got {type(make).__name__}")
    return FAMILIES.add(name, make)


def env_family(name: str) -> MakeEnv:
    """The builder registered under ``name``; raises :class:`UnknownFamily` naming the known ones."""
    make = FAMILIES.get(name)
    if make is None:
        raise UnknownFamily(f"family {name!r} is not a registered environment family (known: "
                            f"{', '.join(family_names())}; others come from a module in the config's plugins "
                            "that calls surreal_redis.envs.register_family, or an installed package's "
                            f"{ENTRY_POINT_GROUP} entry point)")
    return make


def family_names() -> tuple[str, ...]:
    """Names of the families registered so far, sorted (built-ins always included)."""
    return FAMILIES.names()
