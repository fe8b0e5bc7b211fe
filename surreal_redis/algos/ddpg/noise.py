"""Exploration for deterministic policies: action-space noise (Gaussian, Ornstein-Uhlenbeck) for N
envs at once, a per-agent noise scale, and adaptive parameter-space noise.

Noise is in units of the action half-range: the policy adds ``noise * action_scale`` to its actions
(CleanRL's ``exploration_noise`` convention), so one sigma fits every action bound.
"""

from __future__ import annotations

import abc
import math

import numpy as np
import torch
from torch import nn

from surreal_redis.algos.ddpg.config import NoiseConfig  # torch-free, with DDPGConfig


def agent_sigma(config: NoiseConfig, agent_id: int, num_agents: int) -> float:
    """The action-noise sigma of agent ``agent_id`` out of ``num_agents``: ``linear`` spreads the
    agents over ``(0, sigma]``, so that some explore little and some a lot, and none not at all
    (SURREAL's ``sigma * agent_id / num_agents`` left agent 0 without noise)."""
    if not 0 <= agent_id < num_agents:
        raise ValueError(f"agent_id must be in [0, {num_agents}), got {agent_id}")
    return config.sigma if config.agent_schedule == "constant" else config.sigma * (agent_id + 1) / num_agents


class ActionNoise(abc.ABC):
    """Noise for N envs with A-dimensional actions; ``sample()`` returns float32 ``[N, A]``."""

    def __init__(self, num_envs: int, action_dim: int, sigma: float, rng: np.random.Generator) -> None:
        self.num_envs = num_envs
        self.action_dim = action_dim
        self.sigma = sigma
        self.rng = rng

    @abc.abstractmethod
    def sample(self) -> np.ndarray:
        """Noise for the next step of every env, ``[N, A]``."""

    def reset(self, env_index: int) -> None:  # noqa: B027 - stateless processes need no reset
        """Forget the noise state of one env (call at its episode start)."""


class GaussianNoise(ActionNoise):
    """Independent ``N(0, sigma^2)`` per step, env and action dimension."""

    def sample(self) -> np.ndarray:
        return (self.sigma * self.rng.standard_normal((self.num_envs, self.action_dim))).astype(np.float32)


class OrnsteinUhlenbeckNoise(ActionNoise):
    """Euler-Maruyama steps of ``dx = -theta x dt + sigma dW`` per env (OpenAI baselines' form).

    ``x_{k+1} = x_k - theta x_k dt + sigma sqrt(dt) eps``: it reverts to 0 by a factor
    ``1 - theta dt`` per step, and its stationary std is ``sigma sqrt(dt / (1 - (1 - theta dt)^2))``.
    """

    def __init__(self, num_envs: int, action_dim: int, sigma: float, rng: np.random.Generator,
                 theta: float = 0.15, dt: float = 1e-2) -> None:
        super().__init__(num_envs, action_dim, sigma, rng)
        self.theta = theta
        self.dt = dt
        self.state = np.zeros((num_envs, action_dim), np.float64)

    def sample(self) -> np.ndarray:
        eps = self.rng.standard_normal(self.state.shape)
        self.state = self.state - self.theta * self.state * self.dt + self.sigma * math.sqrt(self.dt) * eps
        return self.state.astype(np.float32)

    def reset(self, env_index: int) -> None:
        self.state[env_index] = 0.0


def make_action_noise(config: NoiseConfig, num_envs: int, action_dim: int, sigma: float,
                      rng: np.random.Generator) -> ActionNoise:
    """The action noise process named by ``config.kind``, with scale ``sigma`` (see agent_sigma)."""
    if config.kind == "ou":
        return OrnsteinUhlenbeckNoise(num_envs, action_dim, sigma, rng, config.ou_theta, config.ou_dt)
    return GaussianNoise(num_envs, action_dim, sigma, rng)


class AdaptiveParamNoise:
    """Parameter-space noise with an adaptive scale: Plappert et al. 2018, "Parameter Space Noise
    for Exploration" (arXiv:1706.01905), section 3 and appendix C.

    The acting network is a copy of the actor with ``N(0, sigma^2)`` added to every weight. The
    scale follows the action-space distance ``d = sqrt(mean((mu(s) - mu~(s))^2))``, one fresh
    measurement on recent states per adaptation: ``sigma /= coef`` when ``d > target_distance``,
    ``sigma *= coef`` otherwise.
    """

    def __init__(self, initial_sigma: float, target_distance: float, adapt_coef: float) -> None:
        self.sigma = initial_sigma
        self.target_distance = target_distance
        self.adapt_coef = adapt_coef

    @torch.no_grad()
    def perturb(self, actor: nn.Module, perturbed: nn.Module, generator: torch.Generator) -> None:
        """Make ``perturbed`` (same architecture) a noisy copy of ``actor``; buffers are copied as is."""
        perturbed.load_state_dict(actor.state_dict())
        for param in perturbed.parameters():
            noise = torch.randn(param.shape, generator=generator, device=param.device, dtype=param.dtype)
            param.add_(self.sigma * noise)

    def adapt(self, distance: float) -> None:
        """Update sigma from one action-space distance measurement."""
        self.sigma = self.sigma / self.adapt_coef if distance > self.target_distance else self.sigma * self.adapt_coef
