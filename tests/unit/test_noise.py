"""Statistics of the exploration noise processes and the parameter-noise adaptation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from surreal_redis.algos.ddpg.noise import (
    AdaptiveParamNoise,
    GaussianNoise,
    NoiseConfig,
    OrnsteinUhlenbeckNoise,
    agent_sigma,
    make_action_noise,
)


def test_gaussian_noise_has_the_configured_std():
    noise = GaussianNoise(20_000, 2, 0.3, np.random.default_rng(0))
    x = noise.sample()
    assert x.shape == (20_000, 2) and x.dtype == np.float32
    assert abs(x.mean()) < 0.01
    assert x.std() == pytest.approx(0.3, rel=0.02)


def test_ou_noise_reverts_to_zero_at_rate_theta_dt_and_reaches_its_stationary_std():
    theta, dt, sigma = 0.5, 0.1, 0.4
    noise = OrnsteinUhlenbeckNoise(20_000, 1, sigma, np.random.default_rng(0), theta=theta, dt=dt)
    for _ in range(300):  # (1 - theta dt)^300 ~ 2e-7: stationary
        noise.sample()
    x0 = noise.sample()[:, 0].astype(np.float64)
    for _ in range(10):
        x10 = noise.sample()[:, 0].astype(np.float64)
    # E[x_{k+10} | x_k] = (1 - theta dt)^10 x_k: the regression slope is the reversion factor
    slope = np.dot(x0, x10) / np.dot(x0, x0)
    assert slope == pytest.approx((1 - theta * dt) ** 10, abs=0.02)
    assert x10.std() == pytest.approx(sigma * np.sqrt(dt / (1 - (1 - theta * dt) ** 2)), rel=0.03)


def test_ou_reset_clears_one_env_only():
    noise = OrnsteinUhlenbeckNoise(3, 2, 1.0, np.random.default_rng(0))
    noise.sample()
    noise.reset(1)
    assert np.all(noise.state[1] == 0) and np.all(noise.state[[0, 2]] != 0)


def test_make_action_noise_follows_the_config():
    rng = np.random.default_rng(0)
    assert isinstance(make_action_noise(NoiseConfig(kind="ou"), 2, 1, 0.2, rng), OrnsteinUhlenbeckNoise)
    noise = make_action_noise(NoiseConfig(), 2, 1, 0.2, rng)
    assert isinstance(noise, GaussianNoise) and noise.sigma == 0.2


def test_per_agent_sigma_schedules():
    linear = NoiseConfig(sigma=0.4, agent_schedule="linear")
    assert [agent_sigma(linear, k, 4) for k in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert agent_sigma(NoiseConfig(sigma=0.4), 3, 4) == 0.4
    with pytest.raises(ValueError, match="agent_id"):
        agent_sigma(linear, 4, 4)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="sigma"):
        NoiseConfig(sigma=-1.0)
    with pytest.raises(ValueError, match="param_adapt_coef"):
        NoiseConfig(param_adapt_coef=1.0)


def test_param_noise_perturbs_a_copy_with_std_sigma():
    torch.manual_seed(0)
    actor = nn.Linear(200, 200)
    actor.register_buffer("scale", torch.tensor([2.0]))
    perturbed = nn.Linear(200, 200)
    perturbed.register_buffer("scale", torch.tensor([1.0]))
    before = actor.weight.detach().clone()
    noise = AdaptiveParamNoise(initial_sigma=0.05, target_distance=0.1, adapt_coef=1.01)
    noise.perturb(actor, perturbed, torch.Generator().manual_seed(0))
    assert torch.equal(actor.weight, before)
    assert (perturbed.weight - actor.weight).std().item() == pytest.approx(0.05, rel=0.02)
    assert perturbed.scale.item() == 2.0


def test_param_noise_sigma_grows_below_and_shrinks_above_the_target_distance():
    noise = AdaptiveParamNoise(initial_sigma=0.1, target_distance=0.2, adapt_coef=1.5)
    noise.adapt(0.1)
    assert noise.sigma == pytest.approx(0.15)
    noise.adapt(0.3)
    noise.adapt(0.3)
    assert noise.sigma == pytest.approx(0.1 / 1.5)
