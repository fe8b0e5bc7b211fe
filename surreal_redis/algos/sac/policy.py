"""SAC's networks and torch agent-side policy (Haarnoja et al. 2018, arXiv:1801.01290).

As in CleanRL's ``sac_continuous_action.py``: a squashed Gaussian actor (a torso, then a mean
head and a log-std head; ``a = tanh(mean + std * eps) * action_scale + action_bias``, scale and
bias are buffers so they travel with the weights) and twin critics ``Q1, Q2(s, a)`` on the
observation features and the action, all MLPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy, ParamDict
from surreal_redis.algos.networks import (
    ObservationEncoder,
    QNetwork,
    layer_init,
    load_actor_params,
    mlp,
    normalized_obs,
)
from surreal_redis.algos.normalizer import ObservationNormalizer
from surreal_redis.algos.sac.config import SoftActorCriticConfig
from surreal_redis.codec import Tree
from surreal_redis.envs.spaces import bounded_box

LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
TANH_EPS = 1e-6
"""Inside the log of the tanh correction, as CleanRL (keeps it finite where tanh(u) rounds to +-1)."""


class Actor(nn.Module):
    """``pi(a|s)``: observations (leaves ``[B, ...]``, already normalized) -> the Gaussian's mean and
    log-std ``[B, A]`` before squashing; :meth:`sample` draws actions inside the bounds and their
    log-probabilities.

    Parameter names (what agents download under ``actor.``): ``encoder.*``, ``trunk.{0,2,..}.*``,
    ``mean.*``, ``log_std.*``, buffers ``action_scale`` and ``action_bias``.
    """

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self, config: SoftActorCriticConfig, obs_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        box = bounded_box(action_space, "SAC")
        action_dim = box.shape[0]
        self.encoder = ObservationEncoder(obs_space)
        self.trunk = mlp(self.encoder.out_dim, config.actor_hidden, None, config.activation)
        last = config.actor_hidden[-1] if config.actor_hidden else self.encoder.out_dim
        # small heads: initial means near the middle of the bounds, log-stds near the middle of theirs
        self.mean = layer_init(nn.Linear(last, action_dim), std=0.01)
        self.log_std = layer_init(nn.Linear(last, action_dim), std=0.01)
        self.log_std_min, self.log_std_max = config.log_std_min, config.log_std_max
        low, high = torch.as_tensor(box.low, dtype=torch.float32), torch.as_tensor(box.high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(self.encoder(obs))
        # log-std squashed into [log_std_min, log_std_max] (CleanRL, from SpinningUp / Denis Yarats)
        log_std = torch.tanh(self.log_std(h))
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1)
        return self.mean(h), log_std

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        """``tanh(u) * action_scale + action_bias``: a pre-squash sample (or the mean) -> an action."""
        return torch.tanh(u) * self.action_scale + self.action_bias

    def sample(self, obs: Tree, noise: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized actions ``[B, A]`` and their log-probabilities ``[B]``.

        ``noise`` is the standard normal ``eps`` ``[B, A]`` (drawn with ``generator`` when None).
        """
        mean, log_std = self(obs)
        return self.sample_from(mean, log_std, noise, generator)

    def sample_from(self, mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor | None = None,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sample` from the Gaussian ``forward`` returned (``mean``, ``log_std`` ``[B, A]``)."""
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        # reparameterization, u = f(eps; s) = mean + std * eps (arXiv:1801.01290 eq. 11)
        u = mean + log_std.exp() * noise
        y = torch.tanh(u)
        # log pi(a|s) = log N(u; mean, std) - sum_i log(scale_i (1 - tanh(u_i)^2))
        # (arXiv:1801.01290 appendix C eq. 21, with CleanRL's action scale and + 1e-6)
        gaussian = -0.5 * noise.square() - log_std - LOG_SQRT_2PI
        log_prob = (gaussian - torch.log(self.action_scale * (1 - y.square()) + TANH_EPS)).sum(-1)
        return y * self.action_scale + self.action_bias, log_prob


class TwinCritic(nn.Module):
    """Two independent critics ``q1``, ``q2`` (clipped double Q, arXiv:1812.05905 section 5);
    ``norm`` as :func:`~surreal_redis.algos.networks.mlp`'s (CrossQ's BatchNorm)."""

    def __init__(self, config: SoftActorCriticConfig, obs_space: gym.Space, action_space: gym.Space,
                 norm: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        action_dim = bounded_box(action_space, "SAC").shape[0]
        self.q1 = QNetwork(obs_space, action_dim, config.critic_hidden, config.activation, norm=norm)
        self.q2 = QNetwork(obs_space, action_dim, config.critic_hidden, config.activation, norm=norm)

    def forward(self, obs: Tree, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(obs, actions), self.q2(obs, actions)


class SACPolicy(AgentPolicy):
    """The agent side of SAC for N envs, on torch (CPU): ``training`` and ``eval_stochastic`` sample
    ``a = tanh(mean + std * eps) * scale + bias``, ``eval_deterministic`` returns
    ``tanh(mean) * scale + bias``; no extras. ``seed`` seeds the sampling (None: fresh entropy).
    """

    def __init__(self, config: SoftActorCriticConfig, obs_space: gym.Space, action_space: gym.Space, num_envs: int,
                 seed: int | None = None) -> None:
        self.action_space = bounded_box(action_space, "SAC")
        self.device = torch.device("cpu")
        self.actor = Actor(config, obs_space, action_space)
        self.obs_normalizer = ObservationNormalizer(obs_space, config.obs_clip) if config.normalize_obs else None
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def load_params(self, params: ParamDict, version: int) -> None:
        load_actor_params(self.actor, self.obs_normalizer, params)
        self.version = version

    @torch.no_grad()
    def act(self, obs: Tree, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        """Actions ``[N, A]`` (the action space's dtype) for observation leaves ``[N, ...]``."""
        x = normalized_obs(obs, self.device, self.obs_normalizer)
        if mode is ActMode.EVAL_DETERMINISTIC:
            actions = self.actor.squash(self.actor(x)[0])
        else:
            actions, _ = self.actor.sample(x, generator=self.generator)
        actions = np.clip(actions.numpy(), self.action_space.low, self.action_space.high)
        return ActionOutput(actions.astype(self.action_space.dtype), {})
