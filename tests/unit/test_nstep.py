"""n-step transitions against hand-computed numbers (gamma = 0.5 keeps the arithmetic exact)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from surreal_redis.chunks import Chunk
from surreal_redis.replay.nstep import NStepBuilder

G = 0.5


def make_chunk(obs, rewards, terminated=None, truncated=None, final_obs=None, agent_id=0, env_index=0):
    """Scalar observations (so each obs names its step), actions = 10 * obs."""
    obs = np.asarray(obs, np.float32)[:, None]
    steps = len(rewards)
    return Chunk(
        agent_id=agent_id, env_index=env_index, obs=obs,
        actions=10 * obs[:-1], rewards=np.asarray(rewards, np.float32),
        terminated=np.zeros(steps, bool) if terminated is None else np.asarray(terminated),
        truncated=np.zeros(steps, bool) if truncated is None else np.asarray(truncated),
        final_obs={t: np.array([v], np.float32) for t, v in (final_obs or {}).items()},
        policy_version=np.zeros(steps, np.int64), extras={},
    )


def flat(batch):
    return (batch.obs[:, 0].tolist(), batch.rewards.tolist(), batch.next_obs[:, 0].tolist(),
            batch.discounts.tolist())


def test_one_step_is_plain_td():
    builder = NStepBuilder(1, G)
    batch = builder.add(make_chunk([0, 1, 2], [1, 2]))
    assert flat(batch) == ([0, 1], [1, 2], [1, 2], [G, G])
    np.testing.assert_array_equal(batch.actions[:, 0], [0, 10])


def test_full_n_steps_wait_for_the_next_chunk_and_carry_across_it():
    builder = NStepBuilder(3, G)
    first = builder.add(make_chunk([0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5]))
    # steps 3 and 4 need rewards of the next chunk
    assert flat(first) == ([0, 1, 2],
                           [1 + G * 2 + G**2 * 3, 2 + G * 3 + G**2 * 4, 3 + G * 4 + G**2 * 5],
                           [3, 4, 5], [G**3] * 3)
    second = builder.add(make_chunk([5, 6, 7], [6, 7]))
    assert flat(second) == ([3, 4], [4 + G * 5 + G**2 * 6, 5 + G * 6 + G**2 * 7], [6, 7], [G**3] * 2)
    np.testing.assert_array_equal(second.actions[:, 0], [30, 40])


def test_termination_mid_chunk_ends_the_returns_and_never_mixes_episodes():
    builder = NStepBuilder(3, G)
    # episode A: steps 0-2, terminated at 2 (true final obs 3); episode B starts with obs 100
    chunk = make_chunk([0, 1, 2, 100, 101, 102], [1, 2, 4, 8, 16], terminated=[0, 0, 1, 0, 0],
                       final_obs={2: 3})
    batch = builder.add(chunk)
    assert flat(batch) == ([0, 1, 2], [1 + G * 2 + G**2 * 4, 2 + G * 4, 4], [3, 3, 3], [0, 0, 0])
    # episode B's first steps wait, and their returns start from B's own rewards
    second = builder.add(make_chunk([102, 103], [32]))
    assert flat(second) == ([100], [8 + G * 16 + G**2 * 32], [103], [G**3])


def test_truncation_bootstraps_from_the_true_final_observation():
    builder = NStepBuilder(3, G)
    chunk = make_chunk([0, 1, 2, 100, 101], [1, 2, 4, 8], truncated=[0, 0, 1, 0], final_obs={2: 3})
    batch = builder.add(chunk)
    assert flat(batch) == ([0, 1, 2], [1 + G * 2 + G**2 * 4, 2 + G * 4, 4], [3, 3, 3], [G**3, G**2, G])


def test_episode_tail_at_a_chunk_end_is_flushed_at_once():
    builder = NStepBuilder(3, G)
    batch = builder.add(make_chunk([0, 1, 2, 100], [1, 2, 4], terminated=[0, 0, 1], final_obs={2: 3}))
    assert batch.size == 3  # nothing waits: the next chunk starts a new episode
    second = builder.add(make_chunk([100, 101, 102, 103, 104], [1, 1, 1, 1]))
    assert flat(second)[0] == [100, 101]


def test_episode_ending_in_the_next_chunk_finishes_carried_steps():
    builder = NStepBuilder(3, G)
    builder.add(make_chunk([0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5]))
    batch = builder.add(make_chunk([5, 100, 101], [6, 7], truncated=[1, 0], final_obs={0: 6}))
    assert flat(batch) == ([3, 4, 5], [4 + G * 5 + G**2 * 6, 5 + G * 6, 6], [6, 6, 6], [G**3, G**2, G])


def test_streams_are_kept_apart():
    builder = NStepBuilder(2, G)
    assert builder.add(make_chunk([0, 1], [1], env_index=0)) is None
    assert builder.add(make_chunk([50, 51], [100], env_index=1)) is None
    assert builder.add(make_chunk([60, 61], [100], agent_id=1)) is None
    batch = builder.add(make_chunk([1, 2], [2], env_index=0))
    assert flat(batch) == ([0], [1 + G * 2], [2], [G**2])


def test_a_stream_that_does_not_continue_flushes_its_waiting_steps(caplog):
    builder = NStepBuilder(3, G)
    builder.add(make_chunk([0, 1, 2], [1, 2]))
    with caplog.at_level(logging.WARNING, logger="surreal_redis.replay.nstep"):
        batch = builder.add(make_chunk([100, 101], [8]))  # agent restarted: a new episode
    assert "does not continue" in caplog.text
    # steps 0 and 1 truncated at the last observation seen (2); step 100 waits
    assert flat(batch) == ([0, 1], [1 + G * 2, 2], [2, 2], [G**2, G])


def test_dict_observations_and_final_obs():
    builder = NStepBuilder(2, G)
    obs = {"pos": np.arange(4, dtype=np.float32)[:, None], "img": np.arange(4, dtype=np.uint8)[:, None, None]}
    final = {"pos": np.array([9], np.float32), "img": np.array([[9]], np.uint8)}
    chunk = Chunk(0, 0, obs, np.zeros((3, 1), np.float32), np.ones(3, np.float32),
                  np.array([0, 1, 0], bool), np.zeros(3, bool), {1: final}, np.zeros(3, np.int64), {})
    batch = builder.add(chunk)
    assert batch.next_obs["pos"][:, 0].tolist() == [9, 9]
    assert batch.next_obs["img"].shape == (2, 1, 1) and batch.next_obs["img"][:, 0, 0].tolist() == [9, 9]
    assert batch.obs["pos"][:, 0].tolist() == [0, 1]


def reference_transitions(rewards, terminated, truncated, n, gamma):
    """Brute force over a whole recorded stream: (t, return, index of next obs, discount)."""
    out = []
    for t in range(len(rewards)):
        ret = 0.0
        for j in range(t, t + n):
            ret += gamma ** (j - t) * rewards[j]
            if terminated[j] or truncated[j] or j == t + n - 1:
                out.append((t, ret, j, 0.0 if terminated[j] else gamma ** (j - t + 1)))
                break
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_streams_match_brute_force_for_any_chunking(n, seed):
    rng = np.random.default_rng(seed)
    steps = 60
    rewards = rng.integers(-4, 5, steps).astype(np.float32)
    ends = rng.random(steps) < 0.15
    terminated = ends & (rng.random(steps) < 0.5)
    truncated = ends & ~terminated
    terminated[-1], truncated[-1] = True, False  # the stream ends with an episode end
    # obs id of step t is t; after an episode end at t the next obs is a reset (1000 + t),
    # the true final obs is 2000 + t
    obs = [0.0] + [1000.0 + t if ends[t] else t + 1.0 for t in range(steps)]
    expected = reference_transitions(rewards, terminated, truncated, n, 0.9)

    builder = NStepBuilder(n, 0.9)
    cuts = np.sort(rng.choice(np.arange(1, steps), size=6, replace=False))
    got = []
    for lo, hi in zip([0, *cuts], [*cuts, steps]):
        chunk = make_chunk(obs[lo:hi + 1], rewards[lo:hi], terminated[lo:hi], truncated[lo:hi],
                           {t - lo: 2000.0 + t for t in range(lo, hi) if ends[t]})
        batch = builder.add(chunk)
        if batch is not None:
            got += list(zip(batch.obs[:, 0], batch.rewards, batch.next_obs[:, 0], batch.discounts))
    assert len(got) == steps  # every step once: no lost tails
    for (obs_t, ret, next_o, disc), (t, exp_ret, last, exp_disc) in zip(got, expected):  # in step order
        assert obs_t == obs[t]
        assert ret == pytest.approx(exp_ret, rel=1e-5, abs=1e-5)
        assert next_o == (2000.0 + last if ends[last] else last + 1.0)
        assert disc == pytest.approx(exp_disc, rel=1e-6)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n must be"):
        NStepBuilder(0, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        NStepBuilder(3, 1.5)


def scalar_loop(rewards, terminated, truncated, n, gamma):
    """The per-step loop the vectorized builder replaced: (last steps, float64 returns and
    discounts, first pending step)."""
    ends = terminated | truncated
    last_steps, returns, discounts = [], [], []
    first_pending = len(rewards)
    for t in range(len(rewards)):
        ret, last = 0.0, None
        for j in range(t, min(t + n, len(rewards))):
            ret += gamma ** (j - t) * float(rewards[j])
            if ends[j] or j == t + n - 1:
                last = j
                break
        if last is None:
            first_pending = t
            break
        last_steps.append(last)
        returns.append(ret)
        discounts.append(0.0 if terminated[last] else gamma ** (last - t + 1))
    return last_steps, np.asarray(returns, np.float64), np.asarray(discounts, np.float64), first_pending


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])
@pytest.mark.parametrize("seed", range(4))
def test_vectorized_windows_equal_the_scalar_loop_bit_for_bit(n, seed):
    rng = np.random.default_rng(seed)
    for steps in (0, 1, n, 50):
        rewards = rng.standard_normal(steps).astype(np.float32) * 10
        ends = rng.random(steps) < 0.1
        terminated = ends & (rng.random(steps) < 0.5)
        truncated = ends & ~terminated
        builder = NStepBuilder(n, 0.99)
        last_steps, first_pending = builder._last_steps(terminated | truncated)
        expected = scalar_loop(rewards, terminated, truncated, n, 0.99)
        assert (last_steps.tolist(), first_pending) == (expected[0], expected[3])
        returns, discounts = builder._returns(rewards, terminated, last_steps)
        np.testing.assert_array_equal(returns, expected[1])
        np.testing.assert_array_equal(discounts, expected[2])
