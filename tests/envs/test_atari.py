"""Atari: the CleanRL/SB3 preprocessing stack (on scripted fake ALE games, exactly, and on real
ALE games, byte for byte against SB3's frames), the hub round trip with frames stored once, PPO
updates and an eval game."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from surreal_redis.algos.ppo.policy import PPOConfig
from surreal_redis.envs import AtariConfig, EnvConfig, EnvError, make_env, step_vector_env
from surreal_redis.envs.atari import EpisodicLife, ResizeFrame, rgb_to_gray, wrap_atari

from .family import loaded_policy, obs_keys, play_eval_episode, play_into_hub, ppo_updates, receive_and_check

needs_cv2 = pytest.mark.skipif(importlib.util.find_spec("cv2") is None, reason="opencv is not installed")
needs_ale = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="the 'atari' extra is not installed")
CLEANRL_PPO = PPOConfig(hidden_sizes=(), learning_rate=2.5e-4, clip_coef=0.1, update_epochs=1, num_minibatches=2,
                        device="cpu")
NO_STICKY = AtariConfig(repeat_action_probability=0.0)


class ScriptedGame(gym.Env):
    """A fake ALE game: 3 lives, a life lost every 8 frames, raw reward 5 per frame; the RGB screen
    shows the frame number of the current game in gray."""

    observation_space = gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self) -> None:
        self.ale = SimpleNamespace(lives=lambda: self.lives)
        self.game_resets = 0
        self.frame = 0
        self.lives = 3
        self.frames_per_game: list[int] = []

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.game_resets += 1
        self.frame, self.lives = 0, 3
        return np.full((210, 160, 3), 0, np.uint8), {}

    def step(self, action):
        self.frame += 1
        if self.frame % 8 == 0:
            self.lives -= 1
        if self.lives == 0:
            self.frames_per_game.append(self.frame)
        return np.full((210, 160, 3), self.frame, np.uint8), 5.0, self.lives == 0, False, {}


def test_lost_life_terminates_without_resetting_the_game_and_episodes_report_raw_whole_games():
    game = ScriptedGame()
    envs = gym.vector.SyncVectorEnv([lambda: wrap_atari(game, AtariConfig(noop_max=0, frame_skip=2))],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    assert game.game_resets == 1
    terminations, learner_rewards, episodes = 0, [], []
    while len(episodes) < 2:
        step = step_vector_env(envs, np.array([3]))
        learner_rewards.append(float(step.rewards[0]))
        terminations += int(step.terminated[0])
        if step.terminated[0] and not step.episodes:  # a lost life: the game goes on
            assert game.game_resets == 1 + len(episodes) and game.lives > 0
        episodes += step.episodes.values()
    assert terminations == 6  # 2 lost lives + 1 game over, twice
    assert game.game_resets == 3
    assert set(learner_rewards) == {1.0}  # clipped for training (raw: 10 per agent step)
    # whole games with raw rewards, FIRE/RIGHT and no-op steps after lost lives included
    assert [e.episode_return for e in episodes] == [5.0 * f for f in game.frames_per_game]
    assert all(e.episode_length >= f // 2 for e, f in zip(episodes, game.frames_per_game))


def test_eval_mode_plays_the_whole_game_with_raw_rewards():
    game = ScriptedGame()
    config = EnvConfig(env_id="pong", atari=AtariConfig(noop_max=0, frame_skip=2)).for_mode("eval")
    env = wrap_atari(game, config.atari)
    assert not any(isinstance(w, EpisodicLife) for w in _wrappers(env))
    env.reset(seed=0)
    total, terminated = 0.0, False
    while not terminated:
        _, reward, terminated, _, _ = env.step(3)
        total += reward
    # the FIRE and RIGHT presses of the reset (2 agent steps of 2 frames) happen inside reset()
    assert game.lives == 0 and total == 5.0 * (game.frames_per_game[0] - 4)


class FlickerGame(gym.Env):
    """A fake ALE game without lives or FIRE whose (84, 84, 3) RGB screens cycle through
    ``screens``: the reset shows ``screens[0]``, the k-th frame after it ``screens[k % len]``."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, screens: np.ndarray) -> None:
        self.observation_space = gym.spaces.Box(0, 255, screens.shape[1:], np.uint8)
        self.ale = SimpleNamespace(lives=lambda: 0)
        self.screens = screens
        self.frame = 0

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "RIGHT"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.frame = 0
        return self.screens[0], {}

    def step(self, action):
        self.frame += 1
        return self.screens[self.frame % len(self.screens)], 0.0, False, False, {}


def _opencv_gray(rgb: np.ndarray) -> np.ndarray:
    """OpenCV's RGB2GRAY for 8-bit images as its source defines it (imgproc's color.hpp, 15-bit
    fixed point), in integers: ``(9798 R + 19235 G + 3735 B + 2**14) >> 15``."""
    r, g, b = np.moveaxis(rgb.astype(np.uint32), -1, 0)
    return ((9798 * r + 19235 * g + 3735 * b + 2**14) >> 15).astype(np.uint8)


def test_gray_frames_are_the_gray_of_the_max_of_the_last_two_rgb_frames():
    rng = np.random.default_rng(0)
    screens = rng.integers(0, 256, (5, 84, 84, 3), dtype=np.uint8)
    screens[3, 0, 0], screens[4, 0, 0] = (255, 0, 0), (0, 255, 0)  # red and green
    # 84x84 screens at screen_size 84: ResizeFrame copies them, so the frames are seen as made
    env = wrap_atari(FlickerGame(screens), AtariConfig(noop_max=0, fire_reset=False))
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, _opencv_gray(screens[0]))
    first, *_ = env.step(0)
    assert first[0, 0] == 226  # max(red, green): yellow, not max(gray 76, gray 150)
    second, *_ = env.step(0)
    for obs, (a, b) in ((first, (3, 4)), (second, (2, 3))):  # frames 1-4, then 5-8 (screens 0-3)
        expected = _opencv_gray(np.maximum(screens[a], screens[b]))
        max_of_grays = np.maximum(_opencv_gray(screens[a]), _opencv_gray(screens[b]))
        assert (expected != max_of_grays).mean() > 0.5  # the two orders disagree on most pixels
        np.testing.assert_array_equal(obs, expected)


def test_gray_needs_rgb_screens():
    with pytest.raises(EnvError, match=r"GrayFrame needs \(H, W, 3\) RGB frames"):
        wrap_atari(FlickerGame(np.zeros((1, 84, 84), np.uint8)), AtariConfig(noop_max=0))


def _every_color() -> np.ndarray:
    """All 2**24 RGB colors as one (4096, 4096, 3) uint8 image."""
    v = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([v >> 16, (v >> 8) & 255, v & 255], axis=-1).astype(np.uint8).reshape(4096, 4096, 3)


def test_gray_is_opencvs_fixed_point_formula_for_every_color():
    """Against the integer formula of OpenCV's source (:func:`_opencv_gray`), so that it runs
    without OpenCV too; the next test checks OpenCV itself where it is installed."""
    colors = _every_color()
    np.testing.assert_array_equal(rgb_to_gray(colors), _opencv_gray(colors))


@needs_cv2
def test_gray_is_the_same_bytes_as_opencv_rgb2gray():
    import cv2

    colors = _every_color()
    np.testing.assert_array_equal(rgb_to_gray(colors), cv2.cvtColor(colors, cv2.COLOR_RGB2GRAY))
    frames = np.random.default_rng(0).integers(0, 256, (20, 210, 160, 3), dtype=np.uint8)
    for frame in frames:
        np.testing.assert_array_equal(rgb_to_gray(frame), cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY))


@needs_ale
@needs_cv2
def test_pong_frames_are_the_bytes_sb3_makes_from_rgb_screens():
    """400 agent steps of Pong against SB3's ``AtariWrapper`` computation, on the same seed and
    actions: ALE RGB screens, the max of the last two of each 4 frames (``MaxAndSkipEnv``), then
    ``cv2.cvtColor`` RGB2GRAY and ``cv2.resize`` INTER_AREA to 84x84 (``WarpFrame``)."""
    import ale_py
    import cv2

    gym.register_envs(ale_py)
    env = make_env(EnvConfig(env_id="pong", atari=NO_STICKY), seed=0)
    ale = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, obs_type="rgb")

    def sb3_step(action: int) -> np.ndarray:
        last_two = [ale.step(action)[0] for _ in range(4)][2:]
        gray = cv2.cvtColor(np.maximum(*last_two), cv2.COLOR_RGB2GRAY)
        return cv2.resize(gray, (84, 84), interpolation=cv2.INTER_AREA)

    obs, _ = env.reset(seed=0)
    ale.reset(seed=0)
    for _ in range(ale.unwrapped.np_random.integers(1, 31)):  # the no-op start, same seeded draw
        ale.step(0)
    sb3_step(1)  # FIRE, then RIGHT, as the reset does
    np.testing.assert_array_equal(obs, sb3_step(2))
    for i, action in enumerate(np.random.default_rng(0).integers(env.action_space.n, size=400)):
        obs, _, terminated, truncated, _ = env.step(action)
        assert not (terminated or truncated)  # a Pong game lasts longer than this
        np.testing.assert_array_equal(obs, sb3_step(action), err_msg=f"agent step {i}")
    env.close()
    ale.close()


def _wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


@needs_ale
@pytest.mark.parametrize("game, config, shape", [
    ("pong", AtariConfig(), (84, 84)),
    ("BreakoutNoFrameskip-v4", AtariConfig(grayscale=False, screen_size=64), (64, 64, 3)),
])
def test_real_games_frames_and_spaces(game, config, shape):
    env = make_env(EnvConfig(env_id=game, atari=config), seed=0)
    assert env.observation_space == gym.spaces.Box(0, 255, shape, np.uint8)
    obs, _ = env.reset()
    assert obs.shape == shape and obs.dtype == np.uint8
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(config.repeat_action_probability)
    env.close()


@needs_ale
def test_breakout_life_loss_keeps_the_game_and_fires():
    env = make_env(EnvConfig(env_id="breakout", atari=NO_STICKY), seed=3)
    ale = env.unwrapped.ale
    env.reset(seed=3)
    frames_before = ale.getEpisodeFrameNumber()
    terminated = False
    while not terminated:
        _, _, terminated, truncated, _ = env.step(0)  # never moves: the ball is missed
        assert not truncated
    assert ale.lives() == 4
    env.reset()  # what the vector env's autoreset does after a lost life
    assert ale.lives() == 4 and ale.getEpisodeFrameNumber() > frames_before  # same game, no restart
    env.close()


@needs_ale
def test_pong_through_the_hub_stores_each_frame_once(fake_redis):
    config = EnvConfig(env_id="pong", frame_stack=4, num_envs=2, atari=NO_STICKY)
    played, _ = play_into_hub(fake_redis, config, steps=24, policy_config=CLEANRL_PPO)
    chunks = receive_and_check(fake_redis, played)
    assert chunks[0].obs[0].shape == (9, 84, 84) and chunks[0].obs[0].dtype == np.uint8
    frames = 2 * (24 + 1 + played.ends)  # one new frame per env step, plus reset frames
    assert obs_keys(fake_redis) <= frames < 4 * obs_keys(fake_redis)  # a stack of 4 would store 4x
    algo = ppo_updates(chunks, played, CLEANRL_PPO)
    policy = loaded_policy(algo, CLEANRL_PPO, played)
    total, length = play_eval_episode(EnvConfig(env_id="pong", frame_stack=4, max_episode_steps=30,
                                                atari=NO_STICKY), policy)
    assert length == 30 - 2 and total <= 0  # the time limit counts the reset's FIRE and RIGHT steps


@needs_cv2
@pytest.mark.parametrize("shape, size", [((210, 160), 84), ((210, 160, 3), 64), ((250, 161), 84), ((84, 84), 84)])
def test_frames_are_resized_to_the_same_bytes_as_opencv_area_interpolation(shape, size):
    import cv2

    resize = ResizeFrame(_Screen(gym.spaces.Box(0, 255, shape, np.uint8)), size)
    rng = np.random.default_rng(0)
    for i in range(50):
        frame = rng.integers(0, 256, shape, dtype=np.uint8)
        if i % 2:  # few distinct values: many sums land exactly on .5 (rounding ties)
            frame = frame // 64 * 64
        expected = cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(resize.observation(frame), expected)
    assert resize.observation_space == gym.spaces.Box(0, 255, (size, size, *shape[2:]), np.uint8)


def test_resize_refuses_to_enlarge_frames_by_name():
    with pytest.raises(EnvError, match="atari.screen_size=168 is larger than the 210x160 screen"):
        ResizeFrame(_Screen(gym.spaces.Box(0, 255, (210, 160), np.uint8)), 168)


class _Screen(gym.Env):
    """An env that only has an observation space (what ResizeFrame reads)."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, space: gym.Space) -> None:
        self.observation_space = space
