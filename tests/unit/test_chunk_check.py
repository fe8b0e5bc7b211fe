import gymnasium as gym
import numpy as np

from surreal_redis.chunk_check import ChunkCheck
from surreal_redis.experience import Chunk


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
