"""The vectorized recursions (reward scaling, GAE, V-trace) against the step-by-step loops they
replace, on random data with episode ends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surreal_redis.algos.appo.trainer import vtrace
from surreal_redis.algos.normalizer import RewardScaler, RunningMeanStd
from surreal_redis.algos.ppo.losses import compute_gae
from surreal_redis.algos.recurrences import linear_recurrence, running_moments


def reference_recurrence(decay: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    out, y = [], 0.0
    for a, x in zip(decay, inputs):
        y = a * y + x
        out.append(y)
    return np.array(out)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_linear_recurrence_matches_the_loop(n):
    rng = np.random.default_rng(n)
    decay = 0.99 * (rng.random(n) > 0.05)  # resets at about one step in 20
    inputs = rng.normal(size=n)
    np.testing.assert_allclose(linear_recurrence(decay, inputs), reference_recurrence(decay, inputs), rtol=1e-10,
                               atol=1e-10)


def test_linear_recurrence_names_bad_shapes():
    with pytest.raises(ValueError, match=r"\(3,\) and \(2,\)"):
        linear_recurrence(np.zeros(3), np.zeros(2))


@pytest.mark.parametrize("prior", [0, 5])
def test_running_moments_match_one_sample_updates(prior):
    rng = np.random.default_rng(prior)
    stats = RunningMeanStd(())
    if prior:
        stats.update(rng.normal(3.0, 2.0, size=prior))
    count, mean, var = stats.count.item(), stats.mean.item(), stats.var.item()
    samples = rng.normal(40.0, 5.0, size=300)
    counts, means, variances = running_moments(samples, count, mean, var)
    for k, sample in enumerate(samples):
        stats.update(np.array([sample]))
        assert counts[k] == stats.count.item()
        assert means[k] == pytest.approx(stats.mean.item(), rel=1e-12)
        assert variances[k] == pytest.approx(stats.var.item(), rel=1e-9, abs=1e-12)


def random_chunks(rng: np.random.Generator, num: int, streams: int):
    """Chunks of 1-16 steps over ``streams`` streams (each several times), with episode ends."""
    out = []
    for i in range(num):
        steps = int(rng.integers(1, 17))
        terminated = rng.random(steps) < 0.1
        truncated = ~terminated & (rng.random(steps) < 0.1)
        out.append((rng.normal(1.0, 3.0, size=steps).astype(np.float32), terminated | truncated,
                    (int(rng.integers(streams)), i % 2)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scale_chunks_equals_scale_chunk_by_chunk(seed):
    rng = np.random.default_rng(seed)
    gamma, clip = 0.97, 4.0
    loop, batched = RewardScaler(gamma, clip=clip), RewardScaler(gamma, clip=clip)
    for _ in range(3):  # the second and third batch continue the streams and statistics of the first
        chunks = random_chunks(rng, 40, streams=5)
        expected = [loop.scale(torch.as_tensor(r), torch.as_tensor(d), stream=s).numpy() for r, d, s in chunks]
        got = batched.scale_chunks([r for r, _, _ in chunks], [d for _, d, _ in chunks], [s for _, _, s in chunks])
        assert [g.dtype for g in got] == [np.float32] * len(chunks)
        np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), rtol=1e-6, atol=1e-6)
        for name in ("count", "mean", "var"):
            assert getattr(batched.return_stats, name).item() == pytest.approx(
                getattr(loop.return_stats, name).item(), rel=1e-9)
        assert batched.get_extra_state().keys() == loop.get_extra_state().keys()
        for stream, ret in loop.get_extra_state().items():
            assert batched.get_extra_state()[stream] == pytest.approx(ret, rel=1e-9, abs=1e-12)


def test_scale_chunks_without_steps_changes_nothing():
    scaler = RewardScaler(0.9)
    out = scaler.scale_chunks([np.zeros(0, np.float32)], [np.zeros(0, bool)], [(0, 0)])
    assert [o.shape for o in out] == [(0,)] and scaler.return_stats.count.item() == 0
    with pytest.raises(ValueError, match="1, 1, 2"):
        scaler.scale_chunks([np.zeros(1, np.float32)], [np.zeros(1, bool)], [(0, 0), (1, 0)])


def random_steps(seed: int, steps: int = 50, batch: int = 6):
    """Random ``[T, B]`` rewards, values, next values and log-ratios, with terminated and
    truncated steps apart (never both)."""
    gen = torch.Generator().manual_seed(seed)
    terminated = torch.rand(steps, batch, generator=gen) < 0.08
    truncated = ~terminated & (torch.rand(steps, batch, generator=gen) < 0.08)
    rewards, values, next_values = torch.randn(3, steps, batch, generator=gen)
    log_rhos = 0.3 * torch.randn(steps, batch, generator=gen)
    return rewards, values, next_values, terminated, truncated, log_rhos


def reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - (terminated | truncated).float()
    deltas = rewards + gamma * not_terminated * next_values - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * lam * not_done[t] * last
        advantages[t] = last
    return advantages


def reference_vtrace_correction(rewards, values, next_values, terminated, truncated, log_rhos, gamma, lam):
    """v_s - V(x_s) by the backward loop, rho_bar = c_bar = 1."""
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - (terminated | truncated).float()
    ratios = log_rhos.exp()
    rhos, cs = ratios.clamp(max=1.0), lam * ratios.clamp(max=1.0)
    deltas = rhos * (rewards + gamma * not_terminated * next_values - values)
    out = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * cs[t] * not_done[t] * last
        out[t] = last
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("steps", [1, 50])
def test_gae_and_vtrace_equal_the_plain_backward_loops(seed, steps):
    rewards, values, next_values, terminated, truncated, log_rhos = random_steps(seed, steps)
    gamma, lam = 0.98, 0.92
    advantages, returns = compute_gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    assert torch.equal(advantages, reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam))
    assert torch.equal(returns, advantages + values)
    out = vtrace(rewards, values, next_values, terminated, truncated, log_rhos, gamma, lam)
    expected = reference_vtrace_correction(rewards, values, next_values, terminated, truncated, log_rhos, gamma, lam)
    assert torch.equal(out.vs, values + expected)
    # one column as [T] gives the column of [T, B]
    column = compute_gae(rewards[:, 2], values[:, 2], next_values[:, 2], terminated[:, 2], truncated[:, 2], gamma, lam)
    assert torch.equal(column[0], advantages[:, 2])
