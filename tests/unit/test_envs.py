"""make_env / make_vector_env on gymnasium ids and small synthetic envs (no Atari or MuJoCo needed)."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from surreal_redis.algos.networks import is_frame_tuple
from surreal_redis.configtools import ConfigError, from_dict
from surreal_redis.envs import (
    AtariConfig,
    EnvConfig,
    EnvError,
    EnvModeOverrides,
    atari_env_id,
    make_env,
    make_vector_env,
    resolve_env_id,
    step_vector_env,
)

IMAGE_ID = "SurrealTestImage-v0"


class CountingEnv(gym.Env):
    """Observation t is a uint8 8x8 frame filled with t (or a dict of it and a low-dim state, or text);
    reward 1 per step; terminates after ``length`` steps."""

    def __init__(self, length: int = 5, obs_kind: str = "image", action_kind: str = "discrete"):
        self.length = length
        self.obs_kind = obs_kind
        frame = gym.spaces.Box(0, 255, (8, 8), np.uint8)
        state = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.observation_space = {"image": frame, "dict": gym.spaces.Dict({"pixels": frame, "state": state}),
                                  "text": gym.spaces.Text(5)}[obs_kind]
        self.action_space = gym.spaces.MultiBinary(2) if action_kind == "multibinary" else gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self):
        frame = np.full((8, 8), self.t, np.uint8)
        state = np.full(3, self.t, np.float32)
        return {"image": frame, "dict": {"pixels": frame, "state": state}, "text": "a"}[self.obs_kind]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


@pytest.fixture
def test_envs():
    gym.register(IMAGE_ID, entry_point=CountingEnv)
    yield
    del gym.registry[IMAGE_ID]


def frame_values(obs) -> list[int]:
    return [int(frame[0, 0]) for frame in obs]


@pytest.mark.parametrize("name", ["pong", "Pong", "PongNoFrameskip-v4", "PongDeterministic-v4", "Pong-v4",
                                  "Pong-v5", "ALE/Pong-v5"])
def test_atari_names_map_to_ale_v5(name):
    assert atari_env_id(name) == "ALE/Pong-v5"


def test_atari_name_spellings():
    assert atari_env_id("space_invaders") == atari_env_id("SpaceInvaders") == "ALE/SpaceInvaders-v5"
    assert atari_env_id("MontezumaRevengeNoFrameskip-v4") == "ALE/MontezumaRevenge-v5"
    assert atari_env_id("ms_pacman") == "ALE/MsPacman-v5"
    assert atari_env_id("CartPole-v1") is None
    assert atari_env_id("Pong-ram-v5") is None
    # gymnasium's registered card game keeps its id; the bare name is the Atari game
    assert resolve_env_id("Blackjack-v1").family == "gym"
    assert resolve_env_id("blackjack") == ("ALE/Blackjack-v5", "atari")
    assert resolve_env_id("HalfCheetah-v5").family == "mujoco"


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is not None, reason="ale-py is installed")
def test_atari_without_extra_names_the_extra():
    with pytest.raises(EnvError, match=r"'pong' is the Atari game ALE/Pong-v5, which needs the 'atari' extra "
                                       r"\(missing: ale-py"):
        make_env(EnvConfig(env_id="pong"), seed=0)


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is not None, reason="mujoco is installed")
def test_mujoco_without_extra_names_the_extra():
    with pytest.raises(EnvError, match=r"'HalfCheetah-v5' is a MuJoCo environment.*'mujoco' extra"):
        make_env(EnvConfig(env_id="HalfCheetah-v5"), seed=0)


def test_unknown_id_names_it_and_what_is_supported():
    with pytest.raises(EnvError, match=r"unknown environment id 'NoSuchEnv-v0'.*supported: any registered gymnasium id"):
        make_env(EnvConfig(env_id="NoSuchEnv-v0"), seed=0)


def test_cartpole_time_limit_and_eval_override():
    config = EnvConfig(env_id="CartPole-v1", max_episode_steps=200, eval=EnvModeOverrides(max_episode_steps=3))
    train, evaluation = make_env(config, seed=1), make_env(config, seed=1, mode="eval")
    assert isinstance(train.observation_space, gym.spaces.Box)
    assert isinstance(train.action_space, gym.spaces.Discrete)
    evaluation.reset()
    for _ in range(3):  # a pole never falls within 3 steps
        _, _, terminated, truncated, info = evaluation.step(0)
    assert truncated and not terminated and info["episode"]["l"] == 3
    assert train.spec.max_episode_steps == 200


def test_seed_makes_episodes_reproducible():
    config = EnvConfig(env_id="CartPole-v1")
    a, b = make_env(config, seed=7), make_env(config, seed=7)
    np.testing.assert_array_equal(a.reset()[0], b.reset()[0])
    assert a.action_space.sample() == b.action_space.sample()


def test_frame_stack_keeps_separate_frames(test_envs):
    env = make_env(EnvConfig(env_id=IMAGE_ID, frame_stack=4), seed=0)
    assert is_frame_tuple(env.observation_space) and len(env.observation_space.spaces) == 4
    obs, _ = env.reset()
    assert frame_values(obs) == [0, 0, 0, 0]
    assert all(frame is obs[0] for frame in obs)  # one array object: stored once downstream
    for _ in range(2):
        obs, *_ = env.step(0)
    assert frame_values(obs) == [0, 0, 1, 2]
    previous = obs
    obs, *_ = env.step(0)
    assert frame_values(obs) == [0, 1, 2, 3]
    assert obs[0] is previous[1] and obs[2] is previous[3]  # frames are shared, not copied
    assert env.observation_space.contains(obs)


def test_frame_stack_in_dict_stacks_only_images():
    gym.register(IMAGE_ID, entry_point=CountingEnv, kwargs={"obs_kind": "dict"})
    try:
        env = make_env(EnvConfig(env_id=IMAGE_ID, frame_stack=3), seed=0)
        env.reset()
        obs, *_ = env.step(0)
        assert is_frame_tuple(env.observation_space["pixels"])
        assert frame_values(obs["pixels"]) == [0, 0, 1]
        np.testing.assert_array_equal(obs["state"], [1, 1, 1])
        assert env.observation_space.contains(obs)
    finally:
        del gym.registry[IMAGE_ID]


@pytest.mark.parametrize("kwargs, message", [
    ({"action_kind": "multibinary"}, r"action space MultiBinary\(2\); supported: Box, Discrete"),
    ({"obs_kind": "text"}, r"observation space Text\(.*supported: Box, Tuple of identical uint8 frames"),
])
def test_unsupported_spaces_fail_at_start(kwargs, message):
    gym.register(IMAGE_ID, entry_point=CountingEnv, kwargs=kwargs)
    try:
        with pytest.raises(EnvError, match=message):
            make_env(EnvConfig(env_id=IMAGE_ID), seed=0)
    finally:
        del gym.registry[IMAGE_ID]


def test_frame_stack_of_low_dim_observations_is_an_error():
    with pytest.raises(EnvError, match=r"frame_stack=4 needs uint8 image observations.*got Box\(\[-4.8"):
        make_env(EnvConfig(env_id="CartPole-v1", frame_stack=4), seed=0)


def test_vector_env_reports_true_final_obs_and_episodes(test_envs):
    envs = make_vector_env(EnvConfig(env_id=IMAGE_ID, frame_stack=2, num_envs=2), seed=0)
    obs, _ = envs.reset()
    assert isinstance(obs, tuple) and obs[0].shape == (2, 8, 8)
    for _ in range(4):
        step = step_vector_env(envs, np.zeros(2, np.int64))
        assert not step.terminated.any() and step.final_obs == {}
    step = step_vector_env(envs, np.zeros(2, np.int64))  # 5th step: both episodes end
    assert step.terminated.all() and not step.truncated.any()
    np.testing.assert_array_equal(step.obs[1][:, 0, 0], [0, 0])  # already the next episode's first obs
    assert set(step.final_obs) == {0, 1}
    assert frame_values(step.final_obs[0]) == [4, 5]
    assert step.episodes == {0: (5.0, 5), 1: (5.0, 5)}
    assert step.rewards.dtype == np.float32


def test_config_from_dict_and_validation():
    config = from_dict(EnvConfig, {"env_id": "pong", "frame_stack": 4,
                                   "atari": {"noop_max": 5, "repeat_action_probability": 0.0},
                                   "eval": {"atari": {"noop_max": 0}, "max_episode_steps": 100}})
    train, evaluation = config.for_mode("train"), config.for_mode("eval")
    assert train.atari.noop_max == 5 and evaluation.atari.noop_max == 0
    # training aids only: eval plays whole games with raw rewards
    assert train.atari.episodic_life and train.atari.clip_rewards
    assert not evaluation.atari.episodic_life and not evaluation.atari.clip_rewards
    assert evaluation.max_episode_steps == 100 and train.max_episode_steps is None
    with pytest.raises(ConfigError, match="frame_stack must be >= 1, got 0"):
        from_dict(EnvConfig, {"frame_stack": 0})
    with pytest.raises(ConfigError, match="action_repeat must be >= 1, got 0"):
        from_dict(EnvConfig, {"action_repeat": 0})
    with pytest.raises(ValueError, match=r"repeat_action_probability must be in \[0, 1\], got 2"):
        AtariConfig(repeat_action_probability=2)
    with pytest.raises(ValueError, match="mode must be 'train' or 'eval', got 'test'"):
        EnvConfig().for_mode("test")


class MixedEnv(gym.Env):
    """Dict observation: a float64 vector, a channels-first RGB image and (optionally) a Discrete leaf."""

    def __init__(self, with_discrete: bool = False):
        spaces = {"state": gym.spaces.Box(-1, 1, (3,), np.float64), "camera": gym.spaces.Box(0, 255, (3, 8, 8), np.uint8)}
        if with_discrete:
            spaces["mode"] = gym.spaces.Discrete(3)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, False, {}


def test_float64_leaves_become_float32_and_images_stack_in_any_axis_order():
    gym.register(IMAGE_ID, entry_point=MixedEnv)
    try:
        env = make_env(EnvConfig(env_id=IMAGE_ID, frame_stack=2), seed=0)
        assert env.observation_space["state"].dtype == np.float32
        assert is_frame_tuple(env.observation_space["camera"])
        obs, _ = env.reset()
        assert obs["state"].dtype == np.float32 and obs["camera"][0].shape == (3, 8, 8)
        assert env.observation_space.contains(obs)
    finally:
        del gym.registry[IMAGE_ID]


def test_unsupported_dict_leaf_is_named():
    gym.register(IMAGE_ID, entry_point=MixedEnv, kwargs={"with_discrete": True})
    try:
        with pytest.raises(EnvError, match=r"observation leaf 'mode' is Discrete\(3\)"):
            make_env(EnvConfig(env_id=IMAGE_ID), seed=0)
    finally:
        del gym.registry[IMAGE_ID]


def test_action_repeat_sums_rewards_and_stops_at_the_end(test_envs):
    env = make_env(EnvConfig(env_id=IMAGE_ID, action_repeat=3), seed=0)
    env.reset()
    obs, reward, terminated, _, _ = env.step(0)
    assert reward == 3.0 and int(obs[0, 0]) == 3 and not terminated
    obs, reward, terminated, _, info = env.step(0)  # CountingEnv ends after 5 steps
    assert reward == 2.0 and terminated and info["episode"]["l"] == 2


def test_a_missing_extra_is_named_with_its_missing_packages():
    from surreal_redis.envs.config import require_extra

    require_extra("json", "none", {"json": "json"})  # installed: nothing raised
    with pytest.raises(EnvError, match=r"^'x' is a test env, which needs the 'dmc' extra \(missing: no-such-pkg\): "
                                       r"pip install 'surreal-redis\[dmc\]'$"):
        require_extra("'x' is a test env", "dmc", {"json": "json", "no-such-pkg": "no_such_pkg_xyz"})
