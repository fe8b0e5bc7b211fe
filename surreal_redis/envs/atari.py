"""Atari as CleanRL's ``ppo_atari.py`` and SB3's ``AtariWrapper`` run it, on ALE v5 ids (see
docs/environments.md).

Wrapper stack, innermost first: the ALE env (``frameskip=1``, sticky actions and action set from
:class:`AtariConfig`, RGB screens) -> :class:`NoopReset` -> :class:`MaxAndSkip` -> :class:`GrayFrame`
(with ``grayscale``) -> ``TimeLimit`` (``max_episode_steps`` agent steps, whole games) ->
``RecordEpisodeStatistics`` (whole games, raw rewards, lengths in agent steps) ->
:class:`EpisodicLife` -> :class:`FireReset` -> :class:`ClipReward` -> :class:`ResizeFrame`.

Gray frames are OpenCV's gray of the max of the last two RGB frames, as in SB3 and CleanRL; the
max of two gray screens (ALE's ``obs_type="grayscale"``) differs from it in many frames.

A lost life sets ``terminated``, and the vector env's autoreset then calls ``reset``, which
:class:`EpisodicLife` turns into one no-op step; only a game over (or a truncation) resets the
game, and only then does ``RecordEpisodeStatistics``, below it, report an episode.
"""

from __future__ import annotations

import math
import re
from typing import Any, Protocol, SupportsFloat, runtime_checkable

import gymnasium as gym
import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.envs.config import AtariConfig, EnvConfig, EnvError, require_extra

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


def atari_env_id(name: str) -> str | None:
    """The ALE v5 id for an Atari game name (``pong``, ``SpaceInvaders``, ``PongNoFrameskip-v4``,
    ``ALE/Pong-v5``, ...), or None. Frame skip and sticky actions come from :class:`AtariConfig`.
    """
    base = re.sub(r"-v\d+$", "", name.removeprefix("ALE/"))
    base = re.sub(r"(NoFrameskip|Deterministic)$", "", base)
    key = base.replace("_", "").lower()
    return next((f"ALE/{rom.title().replace('_', '')}-v5" for rom in ATARI_GAMES if rom.replace("_", "") == key),
                None)


class _Lives(Protocol):
    def lives(self) -> int: ...


@runtime_checkable
class AtariGame(Protocol):
    """What the wrappers use of ale_py's AtariEnv (which a scripted test game provides too)."""

    @property
    def ale(self) -> _Lives: ...

    def get_action_meanings(self) -> list[str]: ...


def ale_env(env: gym.Env) -> AtariGame:  # EnvError if ``env`` wraps no Atari game
    base = env.unwrapped
    if not isinstance(base, AtariGame):
        raise EnvError(f"{env} is not an ALE (Atari) environment: no ale.lives() or get_action_meanings()")
    return base


def _box(space: gym.Space, what: str) -> gym.spaces.Box:
    if not isinstance(space, gym.spaces.Box):
        raise EnvError(f"{what} needs Box image frames, got {space}")
    return space


class NoopReset(gym.Wrapper):
    """After each game reset, 1 to ``noop_max`` no-op frames (random starts)."""

    def __init__(self, env: gym.Env, noop_max: int) -> None:
        super().__init__(env)
        if ale_env(env).get_action_meanings()[0] != "NOOP":
            raise EnvError(f"{env.spec.id if env.spec else env}: action 0 is not NOOP")
        self.noop_max = noop_max

    def reset(self, **kwargs: Any) -> tuple[Tree, dict]:
        obs, info = self.env.reset(**kwargs)
        for _ in range(int(self.unwrapped.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeats the action ``skip`` frames, sums the rewards, shows the max of the last two (flicker)."""

    def __init__(self, env: gym.Env, skip: int) -> None:
        super().__init__(env)
        self.skip = skip

    def step(self, action: Any) -> tuple[Tree, float, bool, bool, dict]:
        total = 0.0
        last_two: list[Tree] = []
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            last_two = [last_two[-1], obs] if last_two else [obs]
            if terminated or truncated:
                break
        frame = np.maximum(*last_two) if len(last_two) == 2 else last_two[0]
        return frame, total, terminated, truncated, info


# OpenCV's RGB -> gray weights for 8-bit images, 0.299 R + 0.587 G + 0.114 B in 15-bit fixed point
# (imgproc's color.hpp: RY15, GY15, BY15, gray_shift = 15); they sum to 2**15.
_GRAY_WEIGHTS = np.array([9798, 19235, 3735], np.float32)


def rgb_to_gray(frame: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB -> (...) uint8 gray: ``(9798 R + 19235 G + 3735 B + 2**14) >> 15``, the
    same bytes as ``cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)``. float32 is exact here (every product
    and partial sum is an integer below 2**24; scaling by 2**-15 is exact) and faster than uint32."""
    gray = frame.astype(np.float32) @ _GRAY_WEIGHTS
    gray += 2**14
    gray *= 2**-15
    return gray.astype(np.uint8)


class GrayFrame(gym.ObservationWrapper):
    """(H, W, 3) uint8 RGB frames -> (H, W) uint8 gray frames (:func:`rgb_to_gray`; numpy, not
    OpenCV, for the reason :class:`ResizeFrame` gives). It sits above :class:`MaxAndSkip` because the
    gray of a max is not the max of the grays: red (gray 76) and green (150) max to yellow (226)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        height, width, *channels = _box(env.observation_space, "GrayFrame").shape
        if channels != [3]:
            raise EnvError(f"GrayFrame needs (H, W, 3) RGB frames, got {env.observation_space}")
        self.observation_space = gym.spaces.Box(0, 255, (height, width), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return rgb_to_gray(observation)


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (``terminated``) but not the game: ``reset`` after a lost
    life is a no-op step; after a game over or a truncation (or with a seed) it resets the game."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Tree, SupportsFloat, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = ale_env(self.env).ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Tree, dict]:
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.game_over = False
        self.lives = ale_env(self.env).ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE (then UP/RIGHT, as baselines does) after each reset, for games that wait for
    it to start (Breakout launches no ball without it)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = ale_env(env).get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise EnvError(f"FireReset needs FIRE as action 1, got actions {meanings}")

    def reset(self, **kwargs: Any) -> tuple[Tree, dict]:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class ClipReward(gym.RewardWrapper):
    """Rewards become -1, 0 or +1 (their sign)."""

    def reward(self, reward: SupportsFloat) -> float:
        return float(np.sign(float(reward)))


def _area_passes(src: int, dst: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Area-interpolation weights along one axis of ``src`` -> ``dst`` pixels, as OpenCV's
    ``computeResizeAreaTab`` makes them, as passes k = 0, 1, ...: (output indices, their k-th input
    index, float32 weight); adding pass by pass sums each output in OpenCV's order."""
    scale = 1.0 / (dst / src)
    terms: list[list[tuple[int, float]]] = []
    for d in range(dst):
        start = d * scale
        end = start + scale
        cell = min(scale, src - start)
        first, last = math.ceil(start), math.floor(end)
        last = min(last, src - 1)
        first = min(first, last)
        row = []
        if first - start > 1e-3:
            row.append((first - 1, (first - start) / cell))
        row += [(i, 1.0 / cell) for i in range(first, last)]
        if end - last > 1e-3:
            row.append((last, min(end - last, 1.0, cell) / cell))
        terms.append(row)
    passes = []
    for k in range(max(map(len, terms))):
        outs = [d for d in range(dst) if len(terms[d]) > k]
        passes.append((np.array(outs), np.array([terms[d][k][0] for d in outs]),
                       np.array([terms[d][k][1] for d in outs], np.float32)))
    return passes


class ResizeFrame(gym.ObservationWrapper):
    """Resizes (H, W) or (H, W, C) uint8 frames to ``size x size`` with area interpolation.

    The same bytes as ``cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)`` (float32
    sums in OpenCV's order, rounded half to even), in numpy: importing OpenCV would cost every agent
    memory for this one call."""

    def __init__(self, env: gym.Env, size: int) -> None:
        super().__init__(env)
        self.size = size
        height, width, *channels = _box(env.observation_space, "ResizeFrame").shape
        if size > min(height, width):  # area interpolation only shrinks (OpenCV enlarges bilinearly)
            raise EnvError(f"atari.screen_size={size} is larger than the {height}x{width} screen")
        self._columns = _area_passes(width, size)
        self._rows = _area_passes(height, size)
        self._channels = (1,) * len(channels)  # weights broadcast over a channel axis
        self.observation_space = gym.spaces.Box(0, 255, (size, size, *channels), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        frame = observation.astype(np.float32)
        (outs, ins, weights), *more = self._columns
        columns = frame[:, ins] * weights.reshape(-1, *self._channels)
        for outs, ins, weights in more:
            columns[:, outs] += frame[:, ins] * weights.reshape(-1, *self._channels)
        (outs, ins, weights), *more = self._rows
        resized = columns[ins] * weights.reshape(-1, 1, *self._channels)
        for outs, ins, weights in more:
            resized[outs] += columns[ins] * weights.reshape(-1, 1, *self._channels)
        return np.rint(resized, out=resized).astype(np.uint8)


def make_atari(config: EnvConfig, gym_id: str) -> gym.Env:
    """The wrapped Atari env for ``config`` (already in its mode)."""
    require_extra(f"{config.env_id!r} is the Atari game {gym_id}", "atari", {"ale-py": "ale_py"})
    if config.action_repeat != 1:
        raise EnvError(f"action_repeat={config.action_repeat} does not apply to Atari games: set atari.frame_skip")
    import ale_py

    gym.register_envs(ale_py)
    atari: AtariConfig = config.atari
    env = gym.make(gym_id, frameskip=1, repeat_action_probability=atari.repeat_action_probability,
                   full_action_space=atari.full_action_space, obs_type="rgb",
                   disable_env_checker=True, **config.kwargs)
    return wrap_atari(env, atari, config.max_episode_steps)


def wrap_atari(env: gym.Env, atari: AtariConfig, max_episode_steps: int | None = None) -> gym.Env:
    """The preprocessing stack around an :class:`AtariGame` with ``frameskip=1`` and (H, W, 3) uint8
    RGB screens."""
    if atari.noop_max > 0:
        env = NoopReset(env, atari.noop_max)
    env = MaxAndSkip(env, atari.frame_skip)
    if atari.grayscale:
        env = GrayFrame(env)
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    if atari.episodic_life:
        env = EpisodicLife(env)
    if atari.fire_reset and "FIRE" in ale_env(env).get_action_meanings():
        env = FireReset(env)
    if atari.clip_rewards:
        env = ClipReward(env)
    return ResizeFrame(env, atari.screen_size)
