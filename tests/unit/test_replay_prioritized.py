"""PrioritizedReplay: sampling frequencies follow priorities, importance weights, beta annealing."""

from __future__ import annotations

import numpy as np
import pytest

from surreal_redis.replay.prioritized import PrioritizedReplay, PrioritizedReplayConfig
from surreal_redis.replay.segment_tree import NUMBA_INSTALLED

CHI2_DF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001
KERNELS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not NUMBA_INSTALLED, reason="no numba"))]


def filled(n: int, **config) -> PrioritizedReplay:
    replay = PrioritizedReplay(PrioritizedReplayConfig(capacity=n, **config))
    ids = np.arange(n)
    obs = np.stack([ids] * 4, axis=1).astype(np.float32)
    replay.insert(obs, ids, np.zeros(n, np.float32), obs, np.ones(n, np.float32))
    return replay


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("kernels", KERNELS)
def test_sample_frequencies_match_priorities(kernels):
    alpha = 0.7
    replay = filled(8, alpha=alpha, eps=1e-6, kernels=kernels)
    td = np.array([0.1, 0.5, 1.0, 2.0, 0.2, 3.0, 0.05, 1.5])
    replay.update_priorities(np.arange(8), -td)  # sign must not matter
    priorities = (td + 1e-6) ** alpha
    probabilities = priorities / priorities.sum()
    rng = np.random.default_rng(1234)
    counts = np.zeros(8)
    for _ in range(300):
        batch = replay.sample(64, rng)
        np.testing.assert_array_equal(batch.actions, batch.indices)  # slots map to their data
        counts += np.bincount(batch.indices, minlength=8)
    assert chi_square(counts, probabilities) < CHI2_DF7_P001
    # the same statistic rejects uniform sampling, so the check above has power
    assert chi_square(counts, np.full(8, 1 / 8)) > 100 * CHI2_DF7_P001


@pytest.mark.parametrize("kernels", KERNELS)
def test_sample_frequencies_match_priorities_in_a_deep_tree(kernels):
    # 5000 slots in 8 priority groups (slot i in group i % 8): every level of the trees is walked
    n, alpha = 5000, 1.0
    replay = filled(n, alpha=alpha, eps=1e-9, kernels=kernels)
    group_td = np.array([0.1, 0.5, 1.0, 2.0, 0.2, 3.0, 0.05, 1.5])
    replay.update_priorities(np.arange(n), group_td[np.arange(n) % 8])
    group_mass = np.bincount(np.arange(n) % 8, weights=group_td[np.arange(n) % 8])
    rng = np.random.default_rng(99)
    counts = np.zeros(8)
    for _ in range(100):
        counts += np.bincount(replay.sample(256, rng).indices % 8, minlength=8)
    assert chi_square(counts, group_mass / group_mass.sum()) < CHI2_DF7_P001
    assert chi_square(counts, np.full(8, 1 / 8)) > 100 * CHI2_DF7_P001


@pytest.mark.parametrize("kernels", KERNELS)
def test_importance_weights_and_beta_annealing(kernels):
    replay = filled(4, alpha=1.0, beta0=0.4, beta_steps=10, eps=1e-9, kernels=kernels)
    priorities = np.array([1.0, 2.0, 4.0, 8.0])
    replay.update_priorities(np.arange(4), priorities)
    rng = np.random.default_rng(0)
    for step in range(12):
        beta = 0.4 + 0.6 * min(1.0, step / 10)
        assert replay.beta == pytest.approx(beta)
        batch = replay.sample(16, rng)
        # (N P_i)^-beta / max_j (N P_j)^-beta, with the max at the smallest priority
        expected = (priorities[batch.indices] / priorities.min()) ** -beta
        np.testing.assert_allclose(batch.weights, expected, rtol=1e-6)
        assert batch.weights.dtype == np.float32 and batch.weights.max() <= 1.0
    assert replay.beta == 1.0


def test_new_transitions_get_the_max_priority():
    replay = PrioritizedReplay(PrioritizedReplayConfig(capacity=4, alpha=1.0, eps=1e-9))
    obs = np.zeros((2, 4), np.float32)
    replay.insert(obs, np.zeros(2), np.zeros(2, np.float32), obs, np.ones(2, np.float32))
    replay.update_priorities(np.array([0, 1]), np.array([1.0, 5.0]))
    new = replay.insert(obs[:1], np.zeros(1), np.zeros(1, np.float32), obs[:1], np.ones(1, np.float32))
    batch = replay.sample(64, np.random.default_rng(0))
    weights = dict(zip(batch.indices.tolist(), batch.weights.tolist()))
    # probabilities 1:5:5, so the new slot's weight equals slot 1's: (5 / 1)^-beta
    assert weights[int(new[0])] == pytest.approx(weights[1])
    assert weights[0] == pytest.approx(1.0)


def test_bad_priority_updates_and_config_are_rejected():
    replay = filled(4)
    with pytest.raises(ValueError, match=r"indices must be in \[0, 4\), got 0..9"):
        replay.update_priorities(np.array([0, 9]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="2 indices but 1 td errors"):
        replay.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        replay.update_priorities(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError, match=r"beta0 must be in \[0, 1\], got 1.5"):
        PrioritizedReplayConfig(beta0=1.5)
    with pytest.raises(ValueError, match="alpha must be >= 0, got -1"):
        PrioritizedReplayConfig(alpha=-1)
    with pytest.raises(ValueError, match="kernels must be one of auto, numba, numpy, got 'cuda'"):
        PrioritizedReplayConfig(kernels="cuda")
