"""make_env / make_vector_env on gymnasium ids and small synthetic envs (no Atari or MuJoCo needed), and
the table of environment families."""

from __future__ import annotations

import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest

from surreal_redis.algos.networks import is_frame_tuple
from surreal_redis.config import load_config
from surreal_redis.configtools import ConfigError, from_dict
from surreal_redis.envs import (
    AtariConfig,
    EnvConfig,
    EnvError,
    EnvModeOverrides,
    UnknownFamily,
    atari_env_id,
    env_family,
    family_names,
    make_env,
    make_vector_env,
    register_family,
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


# ---------------------------------------------------------------- the table of families

@pytest.fixture
def family_table(monkeypatch):
    """The table as it is now, restored after the test (built-ins loaded, entry points not read)."""
    import surreal_redis.plugins as plugins
    from surreal_redis.envs.config import FAMILIES

    family_names()
    monkeypatch.setattr(FAMILIES, "_items", dict(FAMILIES._items))
    monkeypatch.setattr(FAMILIES, "_entry_points_read", False)
    return plugins


def make_counting(config: EnvConfig, env_id: str) -> gym.Env:
    """A family whose ids are ``count-<length>``."""
    return CountingEnv(int(env_id.removeprefix("count-")), **config.kwargs)


def test_builtin_families_are_in_the_table():
    assert set(family_names()) >= {"gym", "mujoco", "atari", "dmc", "robosuite"}
    env = make_env(EnvConfig(env_id="CartPole-v1", family="gym"), seed=0)
    assert env.spec.id == "CartPole-v1"


def test_a_registered_family_builds_through_the_shared_stack(family_table):
    assert register_family("count", make_counting) is make_counting
    assert env_family("count") is make_counting and "count" in family_names()
    config = EnvConfig(env_id="count-3", family="count", frame_stack=2, num_envs=2)
    envs = make_vector_env(config, seed=0)
    assert is_frame_tuple(envs.single_observation_space)
    envs.reset()
    steps = [step_vector_env(envs, np.zeros(2, np.int64)) for _ in range(3)]
    assert steps[-1].episodes == {0: (3.0, 3), 1: (3.0, 3)}  # the episode recorder on top


def test_a_family_that_records_its_own_episodes_gets_no_second_recorder(family_table):
    register_family("recorded", lambda config, env_id: gym.wrappers.RecordEpisodeStatistics(CountingEnv(2)))
    env = make_env(EnvConfig(env_id="x", family="recorded"), seed=0)
    env.step(0)
    *_, info = env.step(0)
    assert info["episode"]["l"] == 2


def test_registering_twice_is_a_no_op_and_a_taken_name_is_refused(family_table):
    register_family("count", make_counting)
    register_family("count", make_counting)
    with pytest.raises(ValueError, match=r"environment family 'count' is registered already \(by "
                                         rf"{__name__}\.make_counting\)"):
        register_family("count", lambda config, env_id: CountingEnv())
    with pytest.raises(ValueError, match="environment family 'gym' is registered already"):
        register_family("gym", make_counting)
    with pytest.raises(ValueError, match="non-empty name"):
        register_family(" count", make_counting)
    with pytest.raises(TypeError, match="takes a callable, got str"):
        register_family("text", "make")  # type: ignore[arg-type]


def test_an_unknown_family_is_named_with_the_known_ones(family_table):
    with pytest.raises(UnknownFamily, match=r"^family 'nope' is not a registered environment family \(known: "
                                            r"atari, dmc, gym, mujoco, robosuite; others come from a module in "
                                            r"the config's plugins"):
        EnvConfig(family="nope")
    with pytest.raises(ConfigError, match=r"^EnvConfig: family 'nope' is not a registered environment family"):
        from_dict(EnvConfig, {"family": "nope"})


def test_a_family_from_an_entry_point_is_loaded_on_first_lookup(family_table, monkeypatch):
    from importlib.metadata import EntryPoint

    points = [EntryPoint("count", f"{__name__}:make_counting", "surreal_redis.env_families"),
              EntryPoint("broken", "no_such_module_xyz:make", "surreal_redis.env_families")]
    monkeypatch.setattr(family_table, "entry_points",
                        lambda group: [p for p in points if p.group == group])
    assert env_family("count") is make_counting
    with pytest.raises(UnknownFamily, match="known: atari, count, dmc"):
        env_family("broken")


def test_a_plugin_module_registers_a_family_before_the_config_is_read(family_table, tmp_path, monkeypatch, request):
    (tmp_path / "my_families.py").write_text(
        "import gymnasium as gym\n"
        "from surreal_redis.envs import register_family\n"
        "def make(config, env_id):\n"
        "    return gym.make('CartPole-v1', max_episode_steps=int(env_id.removeprefix('pole-')))\n"
        "register_family('pole', make)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop("my_families", None))
    config = load_config(None, ["plugins=[my_families]", "env.family=pole", "env.env_id=pole-7"])
    env = make_env(config.env, seed=0)
    assert env.spec.max_episode_steps == 7 and "pole" in family_names()
    with pytest.raises(ConfigError, match=r"env: family 'poel' is not a registered environment family "
                                          r"\(known: atari, dmc, gym, mujoco, pole, robosuite"):
        load_config(None, ["plugins=[my_families]", "env.family=poel"])
