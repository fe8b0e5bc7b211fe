"""Environment settings: which env agents run and how each family is wrapped (frozen dataclasses,
loaded from the ``env:`` section of an experiment config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["train", "eval"]


class EnvError(ValueError):
    """An environment that cannot be built or is not supported; the message says what is."""


def require_extra(what: str, extra: str, modules: dict[str, str]) -> None:
    """Raise :class:`EnvError` naming ``extra`` when any of ``modules`` (package name -> import
    name) is not installed; ``what`` says which environment needs them."""
    import importlib.util

    missing = [package for package, module in modules.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise EnvError(f"{what}, which needs the {extra!r} extra (missing: {', '.join(missing)}): "
                       f"pip install 'surreal-redis[{extra}]'")


@dataclass(frozen=True)
class AtariConfig:
    """Atari preprocessing as CleanRL's ``ppo_atari.py`` and SB3's ``AtariWrapper`` do it.

    Attributes:
        frame_skip: emulator frames per agent step; the observation is the max of the last two
            (flicker), the reward the sum over all of them.
        screen_size: frames are resized (area interpolation) to ``screen_size x screen_size``.
        grayscale: (H, W) grayscale frames instead of (H, W, 3) RGB.
        noop_max: after each game reset, 1 to ``noop_max`` no-op frames (0: none).
        episodic_life: a lost life ends the episode the learner sees (``terminated``) without
            restarting the game; only a game over resets it. Train mode only.
        fire_reset: press FIRE after every reset (game or life) in games that have it.
        clip_rewards: rewards become their sign for training; episode returns stay raw. Train
            mode only.
        repeat_action_probability: sticky actions: 0.25 is ALE v5's default (Machado et al.
            2018); 0.0 is what ``NoFrameskip-v4`` ids and the CleanRL/SB3 benchmarks use.
        full_action_space: all 18 actions instead of the game's minimal set.
    """

    frame_skip: int = 4
    screen_size: int = 84
    grayscale: bool = True
    noop_max: int = 30
    episodic_life: bool = True
    fire_reset: bool = True
    clip_rewards: bool = True
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
class PixelConfig:
    """Camera observations for dm_control and robosuite (uint8 ``(size, size, 3)`` frames).

    Attributes:
        enabled: observe camera images (key ``pixels``); False: state vectors only.
        size: image height and width in pixels.
        camera: dm_control camera id (``"0"``, ``"1"``, ...) or robosuite camera name
            (``agentview``, ``frontview``, ...); empty: the family's default.
        keep_state: dm_control: keep the state observations beside the image (a Dict of its own
            keys and ``pixels``); False gives pixels only (a Box). robosuite always keeps ``state``.
    """

    enabled: bool = False
    size: int = 84
    camera: str = ""
    keep_state: bool = False

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"pixels.size must be >= 1, got {self.size}")


@dataclass(frozen=True)
class RobosuiteConfig:
    """robosuite settings (``env_id: robosuite/Lift``, ``robosuite/Stack``, ...).

    Attributes:
        robots: robot model(s), comma-separated for two-arm tasks.
        controller: robosuite controller name; empty: the robot's default (OSC pose for Panda).
        control_freq: control steps per simulated second (SURREAL and robosuite use 20).
        horizon: control steps per episode; robosuite ends episodes only at the horizon, which is
            a truncation here.
        reward_shaping: dense staged rewards instead of the sparse success reward.
    """

    robots: str = "Panda"
    controller: str = ""
    control_freq: int = 20
    horizon: int = 500
    reward_shaping: bool = True

    def __post_init__(self) -> None:
        if self.control_freq < 1 or self.horizon < 1:
            raise ValueError(f"robosuite.control_freq and horizon must be >= 1, got {self.control_freq}, {self.horizon}")


@dataclass(frozen=True)
class EnvModeOverrides:
    """Settings that differ in one mode (eval); None keeps the base value.

    Attributes:
        max_episode_steps: replaces the base time limit.
        atari: replaces the base Atari settings (eval still plays whole games with raw rewards).
        kwargs: merged over the base ``gymnasium.make`` keyword arguments.
    """

    max_episode_steps: int | None = None
    atari: AtariConfig | None = None
    kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class EnvConfig:
    """Which environment agents run, and how it is wrapped.

    Attributes:
        env_id: gymnasium id (``CartPole-v1``, MuJoCo ``HalfCheetah-v5``), Atari game name
            (``pong``, ``BreakoutNoFrameskip-v4``, ``ALE/Breakout-v5``), dm_control id
            (``dm_control/cheetah-run-v0``) or robosuite task (``robosuite/Lift``).
        frame_stack: K > 1 keeps the last K frames of each image observation as a tuple.
        action_repeat: each agent action is repeated this many env steps (rewards summed);
            Atari uses ``atari.frame_skip`` instead.
        max_episode_steps: time limit in agent steps (truncation); None keeps the env's own.
        num_envs: envs per agent process (a SyncVectorEnv).
        kwargs: extra keyword arguments for ``gymnasium.make`` (or ``robosuite.make``).
        atari: Atari preprocessing, used only for Atari games.
        pixels: camera observations for dm_control and robosuite.
        robosuite: robosuite settings, used only for robosuite tasks.
        eval: what changes in eval mode.
    """

    env_id: str = "CartPole-v1"
    frame_stack: int = 1
    action_repeat: int = 1
    max_episode_steps: int | None = None
    num_envs: int = 1
    kwargs: dict[str, Any] = field(default_factory=dict)
    atari: AtariConfig = field(default_factory=AtariConfig)
    pixels: PixelConfig = field(default_factory=PixelConfig)
    robosuite: RobosuiteConfig = field(default_factory=RobosuiteConfig)
    eval: EnvModeOverrides = field(default_factory=EnvModeOverrides)

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ValueError("env_id must not be empty")
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
