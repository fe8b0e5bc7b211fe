import gymnasium as gym
import numpy as np

from surreal_redis.chunks import Chunk
from surreal_redis.learner.chunk_check import ChunkCheck


def chunk(obs, actions, T=4, ended=(), extras=None, final=None):
    terminated = np.zeros(T, bool)
    terminated[list(ended)] = True
    return Chunk(0, 0, obs, actions, np.zeros(T, np.float32), terminated, np.zeros(T, bool),
                 final if final is not None else {t: np.zeros(4, np.float32) for t in ended},
                 np.zeros(T, np.int64), extras or {"logp": np.zeros(T, np.float32)})


def test_good_chunk_passes_and_each_defect_is_named():
    check = ChunkCheck(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ("logp",))
    good = chunk(np.zeros((5, 4), np.float32), np.zeros(4, np.int64), ended=[2])
    assert check.problem(good) is None
    assert "shape (5, 3)" in check.problem(chunk(np.zeros((5, 3), np.float32), np.zeros(4, np.int64)))
    assert "actions" in check.problem(chunk(np.zeros((5, 4), np.float32), np.zeros((4, 2), np.int64)))
    assert "logp" in check.problem(chunk(np.zeros((5, 4), np.float32), np.zeros(4, np.int64), extras={"x": 1}))
    missing_final = chunk(np.zeros((5, 4), np.float32), np.zeros(4, np.int64), ended=[1], final={})
    assert "final_obs" in check.problem(missing_final)


def test_dict_and_frame_tuple_observations():
    space = gym.spaces.Dict({"pixels": gym.spaces.Tuple([gym.spaces.Box(0, 255, (8, 8), np.uint8)] * 2),
                             "state": gym.spaces.Box(-1, 1, (3,))})
    check = ChunkCheck(space, gym.spaces.Box(-1, 1, (2,)))
    obs = {"pixels": (np.zeros((5, 8, 8), np.uint8),) * 2, "state": np.zeros((5, 3), np.float32)}
    assert check.problem(chunk(obs, np.zeros((4, 2), np.float32))) is None
    bad = {"pixels": (np.zeros((5, 8, 8), np.uint8),), "state": np.zeros((5, 3), np.float32)}
    assert "2 items" in check.problem(chunk(bad, np.zeros((4, 2), np.float32)))
    assert "keys" in check.problem(chunk({"state": obs["state"]}, np.zeros((4, 2), np.float32)))


def test_full_shapes_of_extras_are_checked():
    box_actions = gym.spaces.Box(-1, 1, (2,))
    check = ChunkCheck(gym.spaces.Box(-1, 1, (4,)), box_actions, ("logp", "raw_action"))
    obs, actions = np.zeros((5, 4), np.float32), np.zeros((4, 2), np.float32)
    good = {"logp": np.zeros(4, np.float32), "raw_action": np.zeros((4, 2), np.float32)}
    assert check.problem(chunk(obs, actions, extras=good)) is None
    # [T, 1] log-probs would broadcast into [T, T] ratios
    assert "extras['logp'] has shape (4, 1), expected (4,)" in check.problem(
        chunk(obs, actions, extras={**good, "logp": np.zeros((4, 1), np.float32)}))
    assert "extras['raw_action'] has shape (4, 3), expected (4, 2)" in check.problem(
        chunk(obs, actions, extras={**good, "raw_action": np.zeros((4, 3), np.float32)}))
    assert "non-finite" in check.problem(chunk(obs, actions, extras={**good, "logp": np.full(4, np.nan, np.float32)}))


def test_lstm_state_must_be_present_with_its_shape():
    check = ChunkCheck(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ("logp",),
                       initial_state={"lstm_h": (8,), "lstm_c": (8,)})
    obs, actions = np.zeros((5, 4), np.float32), np.zeros(4, np.int64)
    state = {"lstm_h": np.zeros(8, np.float32), "lstm_c": np.zeros(8, np.float32)}
    logp = np.zeros(4, np.float32)
    assert check.problem(chunk(obs, actions, extras={"logp": logp, "initial_state": state})) is None
    assert "initial_state" in check.problem(chunk(obs, actions, extras={"logp": logp}))
    short = {**state, "lstm_c": np.zeros(4, np.float32)}
    assert "['lstm_c'] has shape (4,), expected (8,)" in check.problem(
        chunk(obs, actions, extras={"logp": logp, "initial_state": short}))


def test_actions_dtypes_and_pixels_are_checked():
    space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    check = ChunkCheck(space, gym.spaces.Discrete(3, start=1), ("logp",))
    pixels = np.zeros((5, 8, 8, 3), np.uint8)
    final = {}
    assert check.problem(chunk(pixels, np.ones(4, np.int64), final=final)) is None
    assert "actions outside [1, 4)" in check.problem(chunk(pixels, np.array([1, 2, 3, 4]), final=final))
    assert "actions has dtype float32" in check.problem(chunk(pixels, np.ones(4, np.float32), final=final))
    assert "dtype float32, expected uint8" in check.problem(chunk(pixels.astype(np.float32), np.ones(4, np.int64),
                                                                  final=final))
    assert "shape (5, 8, 8), expected (5, 8, 8, 3)" in check.problem(chunk(pixels[..., 0], np.ones(4, np.int64),
                                                                            final=final))
    bad_rewards = chunk(pixels, np.ones(4, np.int64), final=final)._replace(rewards=np.full(4, np.inf, np.float32))
    assert "rewards has non-finite values" in check.problem(bad_rewards)


def test_for_experiment_asks_what_the_algorithm_reads():
    from surreal_redis.config import ExperimentConfig
    from surreal_redis.configtools import from_dict

    config = from_dict(ExperimentConfig, {"ppo": {"use_lstm": True, "lstm_hidden": 16}})
    check = ChunkCheck.for_experiment(config, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (2,)))
    assert check.extra_shapes == {"logp": (), "raw_action": (2,)}
    assert check.initial_state == {"lstm_h": (16,), "lstm_c": (16,)}
    ddpg = ChunkCheck.for_experiment(from_dict(ExperimentConfig, {"algo": "ddpg"}), gym.spaces.Box(-1, 1, (4,)),
                                     gym.spaces.Box(-1, 1, (2,)))
    assert ddpg.extra_shapes == {} and ddpg.initial_state is None
