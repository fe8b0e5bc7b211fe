"""DDPG's networks and agent-side policy (Lillicrap et al. 2016, arXiv:1509.02971).

As in CleanRL's ``ddpg_continuous_action.py``: a deterministic actor
``mu(s) = tanh(f(s)) * action_scale + action_bias`` (scale and bias are buffers, so they travel
with the weights); the critic is a :class:`~surreal_redis.algos.networks.QNetwork`.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy, ParamDict
from surreal_redis.algos.ddpg.config import DDPGConfig
from surreal_redis.algos.ddpg.noise import (
    AdaptiveParamNoise,
    GaussianNoise,
    agent_sigma,
    make_action_noise,
)
from surreal_redis.algos.networks import ObservationEncoder, load_actor_params, mlp, normalized_obs
from surreal_redis.algos.normalizer import ObservationNormalizer
from surreal_redis.codec import Tree
from surreal_redis.envs.spaces import bounded_box


class Actor(nn.Module):
    """``mu(s)``: observation batch (leaves ``[B, ...]``, already normalized) -> actions ``[B, A]``
    inside the action bounds."""

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self, config: DDPGConfig, obs_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        box = bounded_box(action_space, "DDPG")
        self.encoder = ObservationEncoder(obs_space)
        # near-zero final layer, so that initial actions are near the middle of the bounds
        # (Lillicrap et al. 2016, section 7: final layers drawn from U[-3e-3, 3e-3])
        self.mlp = mlp(self.encoder.out_dim, config.actor_hidden, box.shape[0], config.activation, out_std=0.01)
        low, high = torch.as_tensor(box.low, dtype=torch.float32), torch.as_tensor(box.high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs: Tree) -> torch.Tensor:
        return torch.tanh(self.mlp(self.encoder(obs))) * self.action_scale + self.action_bias


class DDPGPolicy(AgentPolicy):
    """The agent side of DDPG for N envs: ``mu(s)`` plus exploration noise, clipped to the bounds.

    Modes: ``training`` adds the action noise (per-env state, reset by :meth:`on_episode_start`;
    sigma from the per-agent schedule, see :func:`~surreal_redis.algos.ddpg.noise.agent_sigma`) and, with
    ``noise.param_noise``, acts with a perturbed copy of the actor; ``eval_stochastic`` adds
    Gaussian noise of std ``noise.eval_sigma``; ``eval_deterministic`` returns ``mu(s)``.
    Runs on the CPU; ``seed`` seeds the noise (None: fresh entropy).
    """

    # with parameter noise only: the actor that acts in training mode, and its noise source
    perturbed_actor: Actor
    generator: torch.Generator

    def __init__(self, config: DDPGConfig, obs_space: gym.Space, action_space: gym.Space, num_envs: int,
                 agent_id: int = 0, num_agents: int = 1, seed: int | None = None) -> None:
        self.config = config
        self.action_space = bounded_box(action_space, "DDPG")
        self.device = torch.device("cpu")
        self.actor = Actor(config, obs_space, action_space)
        self.obs_normalizer = ObservationNormalizer(obs_space, config.obs_clip) if config.normalize_obs else None
        action_dim = self.action_space.shape[0]
        rng = np.random.default_rng(seed)
        sigma = agent_sigma(config.noise, agent_id, num_agents)
        self.noise = make_action_noise(config.noise, num_envs, action_dim, sigma, rng)
        self.eval_noise = GaussianNoise(num_envs, action_dim, config.noise.eval_sigma, rng)
        self.param_noise: AdaptiveParamNoise | None = None
        if config.noise.param_noise:
            self.param_noise = AdaptiveParamNoise(config.noise.param_initial_sigma,
                                                  config.noise.param_target_distance,
                                                  config.noise.param_adapt_coef)
            self.perturbed_actor = copy.deepcopy(self.actor)
            self.generator = torch.Generator().manual_seed(int(rng.integers(2**63)))
            self.param_noise.perturb(self.actor, self.perturbed_actor, self.generator)
        self.training_acts = 0

    def load_params(self, params: ParamDict, version: int) -> None:
        load_actor_params(self.actor, self.obs_normalizer, params)
        if self.param_noise is not None:
            self.param_noise.perturb(self.actor, self.perturbed_actor, self.generator)
        self.version = version

    @torch.no_grad()
    def act(self, obs: Tree, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        """Actions ``[N, A]`` (the action space's dtype) for observation leaves ``[N, ...]``."""
        x = normalized_obs(obs, self.device, self.obs_normalizer)
        scale = self.actor.action_scale.numpy()
        if mode is ActMode.TRAINING:
            actions = self._training_actions(x) + self.noise.sample() * scale
        elif mode is ActMode.EVAL_STOCHASTIC:
            actions = self.actor(x).numpy() + self.eval_noise.sample() * scale
        else:
            actions = self.actor(x).numpy()
        actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return ActionOutput(actions.astype(self.action_space.dtype), {})

    def _training_actions(self, x: Tree) -> np.ndarray:
        """``mu(s)``, or the perturbed actor's actions with parameter noise (adapted every
        ``param_adapt_every`` acts by their distance to ``mu(s)`` on the current observations)."""
        if self.param_noise is None:
            return self.actor(x).numpy()
        actions = self.perturbed_actor(x)
        self.training_acts += 1
        if self.training_acts % self.config.noise.param_adapt_every == 0:
            # distance in units of the action half-range (Plappert et al. 2018, appendix C.1)
            diff = (actions - self.actor(x)) / self.actor.action_scale
            self.param_noise.adapt(float(diff.square().mean().sqrt()))
            self.param_noise.perturb(self.actor, self.perturbed_actor, self.generator)
        return actions.numpy()

    def on_episode_start(self, env_index: int) -> None:
        self.noise.reset(env_index)
