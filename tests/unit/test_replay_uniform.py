"""UniformReplay: layout, round trips, ring wrap-around, frame sharing and its memory bound."""

from __future__ import annotations

import numpy as np
import pytest

from surreal_redis.replay import ReplayConfig, make_replay
from surreal_redis.replay.prioritized import PrioritizedReplay
from surreal_redis.replay.storage import TransitionStorage
from surreal_redis.replay.uniform import UniformReplay, UniformReplayConfig

K = 4  # frames per stacked observation


def frame_stream(num_transitions: int, size: int = 84, seed: int = 0) -> tuple:
    """One env's frame-stacked stream: transition t sees frames t..t+K-1, then t+1..t+K.

    Each frame's first pixel holds t % 256 and the rest is random, so frames are distinct.
    """
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(num_transitions + K, size, size), dtype=np.uint8)
    obs = tuple(frames[k : k + num_transitions] for k in range(K))
    next_obs = tuple(frames[k + 1 : k + 1 + num_transitions] for k in range(K))
    return frames, obs, next_obs


def low_dim_batch(start: int, batch: int) -> tuple:
    """Transitions whose obs, action, reward all encode their sequence number."""
    ids = np.arange(start, start + batch)
    obs = np.stack([ids, ids, ids, ids], axis=1).astype(np.float32)
    return obs, ids.astype(np.int64), ids.astype(np.float32), obs + 0.5, np.full(batch, 0.99, np.float32)


def test_cartpole_sized_round_trip():
    replay = UniformReplay(UniformReplayConfig(capacity=100))
    slots = replay.insert(*low_dim_batch(0, 10))
    np.testing.assert_array_equal(slots, np.arange(10))
    assert len(replay) == 10 and replay.num_frames == 0  # 16-byte leaves stay dense
    batch = replay.sample(64, np.random.default_rng(0))
    assert batch.obs.shape == (64, 4) and batch.obs.dtype == np.float32
    assert batch.actions.shape == (64,) and batch.rewards.dtype == np.float32
    np.testing.assert_array_equal(batch.obs[:, 0], batch.actions)
    np.testing.assert_array_equal(batch.next_obs[:, 0], batch.actions + 0.5)
    np.testing.assert_array_equal(batch.rewards, batch.indices)
    np.testing.assert_array_equal(batch.weights, np.ones(64, np.float32))
    assert set(batch.indices.tolist()) <= set(range(10))


def test_ring_overwrites_oldest():
    replay = UniformReplay(UniformReplayConfig(capacity=5))
    replay.insert(*low_dim_batch(0, 3))
    slots = replay.insert(*low_dim_batch(3, 4))  # wraps: ids 5, 6 overwrite ids 0, 1
    np.testing.assert_array_equal(slots, [3, 4, 0, 1])
    assert len(replay) == 5
    batch = replay.sample(500, np.random.default_rng(1))
    assert set(batch.actions.tolist()) == {2, 3, 4, 5, 6}


def test_frame_tuples_are_stored_once_and_rebuilt_exactly():
    frames, obs, next_obs = frame_stream(50)
    replay = UniformReplay(UniformReplayConfig(capacity=1000))
    actions = np.arange(50)
    replay.insert(obs, actions, np.zeros(50, np.float32), next_obs, np.ones(50, np.float32))
    assert replay.num_frames == 50 + K  # every frame once, obs and next_obs share them
    batch = replay.sample(32, np.random.default_rng(2))
    assert isinstance(batch.obs, tuple) and len(batch.obs) == K
    for k in range(K):
        np.testing.assert_array_equal(batch.obs[k], frames[batch.actions + k])
        np.testing.assert_array_equal(batch.next_obs[k], frames[batch.actions + k + 1])


def test_wrap_around_releases_frames():
    frames, obs, next_obs = frame_stream(300, size=32)
    replay = UniformReplay(UniformReplayConfig(capacity=64))
    for start in range(0, 300, 20):  # 20-transition chunks, ring wraps several times
        part = slice(start, start + 20)
        replay.insert(tuple(o[part] for o in obs), np.arange(300)[part], np.zeros(20, np.float32),
                      tuple(o[part] for o in next_obs), np.ones(20, np.float32))
    assert len(replay) == 64
    assert replay.num_frames == 64 + K  # the last 64 transitions' frames, nothing leaked
    batch = replay.sample(256, np.random.default_rng(3))
    assert batch.actions.min() >= 300 - 64
    for k in range(K):
        np.testing.assert_array_equal(batch.obs[k], frames[batch.actions + k])


def test_stacked_atari_stream_costs_about_one_frame_per_transition():
    capacity = 2000
    _, obs, next_obs = frame_stream(capacity * 2, size=84)
    replay = UniformReplay(UniformReplayConfig(capacity=capacity))
    for start in range(0, capacity * 2, 500):
        part = slice(start, start + 500)
        replay.insert(tuple(o[part] for o in obs), np.zeros(500, np.int64), np.zeros(500, np.float32),
                      tuple(o[part] for o in next_obs), np.ones(500, np.float32))
    frame_bytes = 84 * 84
    assert replay.num_frames <= capacity + K
    # pool (capacity + 64 slots) + 2*K int64 slot indices + scalars, vs 8 frames per transition in SB3
    assert replay.nbytes / capacity < 1.1 * frame_bytes


def test_dict_obs_with_pixels_and_low_dim():
    rng = np.random.default_rng(4)
    pixels = rng.integers(0, 256, size=(11, 24, 24, 3), dtype=np.uint8)  # 1728 bytes: pooled
    state = rng.normal(size=(11, 3)).astype(np.float32)
    obs = {"pixels": pixels[:-1], "state": state[:-1]}
    next_obs = {"pixels": pixels[1:], "state": state[1:]}
    replay = UniformReplay(UniformReplayConfig(capacity=32))
    replay.insert(obs, np.arange(10), np.zeros(10, np.float32), next_obs, np.ones(10, np.float32))
    assert replay.num_frames == 11
    batch = replay.sample(16, np.random.default_rng(5))
    assert set(batch.obs) == {"pixels", "state"}
    np.testing.assert_array_equal(batch.obs["pixels"], pixels[batch.actions])
    np.testing.assert_array_equal(batch.next_obs["pixels"], pixels[batch.actions + 1])
    np.testing.assert_array_equal(batch.next_obs["state"], state[batch.actions + 1])


def test_bad_inserts_and_samples_are_rejected():
    replay = UniformReplay(UniformReplayConfig(capacity=4))
    with pytest.raises(ValueError, match="empty replay"):
        replay.sample(1, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"B <= capacity \(4\)"):
        replay.insert(*low_dim_batch(0, 5))
    replay.insert(*low_dim_batch(0, 2))
    obs, actions, rewards, next_obs, discounts = low_dim_batch(0, 2)
    with pytest.raises(ValueError, match=r"obs leaf '' has shape \(2, 3\), expected \(2, 4\)"):
        replay.insert(obs[:, :3], actions, rewards, next_obs, discounts)
    with pytest.raises(ValueError, match="next_obs leaves"):
        replay.insert(obs, actions, rewards, {"x": next_obs}, discounts)
    with pytest.raises(ValueError, match="rewards and discounts"):
        replay.insert(obs, actions, rewards, next_obs, discounts[:1])
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        UniformReplayConfig(capacity=0)


def test_pool_grows_when_frames_are_not_shared():
    rng = np.random.default_rng(6)
    replay = UniformReplay(UniformReplayConfig(capacity=16))
    for _ in range(3):  # unrelated frames: 2K new frames per transition, past the initial 16 + 64 slots
        obs = tuple(rng.integers(0, 256, size=(16, 32, 32), dtype=np.uint8) for _ in range(K))
        next_obs = tuple(rng.integers(0, 256, size=(16, 32, 32), dtype=np.uint8) for _ in range(K))
        replay.insert(obs, np.arange(16), np.zeros(16, np.float32), next_obs, np.ones(16, np.float32))
    assert replay.num_frames == 16 * 2 * K
    batch = replay.sample(16, np.random.default_rng(7))
    for k in range(K):
        np.testing.assert_array_equal(batch.obs[k], obs[k][batch.actions])
        np.testing.assert_array_equal(batch.next_obs[k], next_obs[k][batch.actions])


def test_make_replay_builds_the_selected_replay_and_uniform_ignores_priorities():
    assert isinstance(make_replay(ReplayConfig(capacity=8, selector="prioritized")), PrioritizedReplay)
    replay = make_replay(ReplayConfig(capacity=8))
    assert isinstance(replay, UniformReplay)
    obs = np.arange(8, dtype=np.float32).reshape(8, 1)
    slots = replay.insert(obs, np.zeros(8, np.int64), np.zeros(8, np.float32), obs, np.ones(8, np.float32))
    replay.update_priorities(slots, np.full(8, 1e6))  # nothing changes: the feed calls it for every replay
    batch = replay.sample(4096, np.random.default_rng(0))
    assert (batch.weights == 1.0).all() and np.bincount(batch.indices, minlength=8).min() > 400


def test_gather_equals_plain_indexing_of_every_ring_dense_and_pooled():
    """The storage's row copies (np.take) against ring[indices], for dense and pooled leaves."""
    rng = np.random.default_rng(3)
    storage = TransitionStorage(capacity=50, dedup_min_bytes=64)
    for _ in range(3):  # wraps the ring
        batch = 20
        obs = {"vec": rng.standard_normal((batch, 3)).astype(np.float32),
               "img": rng.integers(0, 255, (batch, 4, 4, 4), dtype=np.uint8)}
        next_obs = {key: value[::-1].copy() for key, value in obs.items()}
        storage.insert(obs, rng.standard_normal((batch, 2)), rng.standard_normal(batch).astype(np.float32),
                       next_obs, rng.random(batch).astype(np.float32))
    indices = rng.integers(0, len(storage), 64)
    got = storage.gather(indices, np.ones(64, np.float32))
    for name, ring in (("obs", storage._obs), ("next_obs", storage._next_obs)):
        np.testing.assert_array_equal(getattr(got, name)["vec"], ring[("vec",)][indices])
        pool = storage._pools[(np.dtype(np.uint8).str, (4, 4, 4))]
        np.testing.assert_array_equal(getattr(got, name)["img"], pool.frames[ring[("img",)][indices]])
    np.testing.assert_array_equal(got.actions, storage._actions[indices])
    np.testing.assert_array_equal(got.rewards, storage._rewards[indices])
    np.testing.assert_array_equal(got.discounts, storage._discounts[indices])
    with pytest.raises(IndexError):
        storage.gather(np.array([50]), np.ones(1, np.float32))
