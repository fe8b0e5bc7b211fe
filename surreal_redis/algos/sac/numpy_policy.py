"""SAC's agent-side policy in numpy: :class:`~surreal_redis.algos.sac.policy.SACPolicy` without torch
(the same actor's parameter names and squashed Gaussian; :mod:`tests.unit.test_sac` compares them).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy, ParamDict
from surreal_redis.algos.numpy_nets import MLP, Encoder, Linear, Normalizer, take
from surreal_redis.algos.sac.config import SoftActorCriticConfig
from surreal_redis.codec import Tree
from surreal_redis.envs.spaces import bounded_box

LOG_SQRT_2PI = np.float32(math.log(math.sqrt(2 * math.pi)))
TANH_EPS = np.float32(1e-6)  # policy.TANH_EPS (that module imports torch)


class NumpyActor:
    """:class:`~surreal_redis.algos.sac.policy.Actor`'s forward pass and sampling in float32 numpy."""

    def __init__(self, config: SoftActorCriticConfig, obs_space: gym.Space, action_space: gym.Space) -> None:
        box = bounded_box(action_space, "SAC")
        self.action_dim = box.shape[0]
        self.encoder = Encoder(obs_space)
        self.trunk = MLP(self.encoder.out_dim, config.actor_hidden, None, config.activation)
        last = config.actor_hidden[-1] if config.actor_hidden else self.encoder.out_dim
        self.mean = Linear(last, self.action_dim)
        self.log_std = Linear(last, self.action_dim)
        self.log_std_min = np.float32(config.log_std_min)
        self.log_std_max = np.float32(config.log_std_max)
        self.action_scale = ((box.high - box.low) / 2.0).astype(np.float32)
        self.action_bias = ((box.high + box.low) / 2.0).astype(np.float32)

    def load(self, params: ParamDict, prefix: str) -> None:
        self.encoder.load(params, prefix + "encoder.")
        self.trunk.load(params, prefix + "trunk.")
        self.mean.load(params, prefix + "mean.")
        self.log_std.load(params, prefix + "log_std.")
        self.action_scale = take(params, prefix + "action_scale", (self.action_dim,))
        self.action_bias = take(params, prefix + "action_bias", (self.action_dim,))

    def __call__(self, obs: Tree) -> tuple[np.ndarray, np.ndarray]:
        """Mean and log-std ``[B, A]`` of the Gaussian before squashing."""
        h = self.trunk(self.encoder(obs))
        log_std = np.tanh(self.log_std(h))
        log_std = self.log_std_min + np.float32(0.5) * (self.log_std_max - self.log_std_min) * (log_std + 1)
        return self.mean(h), log_std

    def squash(self, u: np.ndarray) -> np.ndarray:
        return np.tanh(u) * self.action_scale + self.action_bias

    def sample(self, obs: Tree, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions ``[B, A]`` for standard normal ``noise`` ``[B, A]`` and their log-probabilities
        ``[B]``, as :meth:`~surreal_redis.algos.sac.policy.Actor.sample`."""
        mean, log_std = self(obs)
        u = mean + np.exp(log_std) * noise
        y = np.tanh(u)
        gaussian = np.float32(-0.5) * np.square(noise) - log_std - LOG_SQRT_2PI
        log_prob = (gaussian - np.log(self.action_scale * (1 - np.square(y)) + TANH_EPS)).sum(axis=-1)
        return y * self.action_scale + self.action_bias, log_prob


class NumpySACPolicy(AgentPolicy):
    """Acts for ``num_envs`` environments like :class:`~surreal_redis.algos.sac.policy.SACPolicy`
    (``seed`` seeds a numpy Generator); :meth:`load_params` raises
    :class:`~surreal_redis.algos.numpy_nets.ParamsMismatch` naming a missing or misshapen parameter.
    """

    def __init__(self, config: SoftActorCriticConfig, obs_space: gym.Space, action_space: gym.Space, num_envs: int = 1,
                 seed: int | None = None) -> None:
        self.action_space = bounded_box(action_space, "SAC")
        self.normalizer = Normalizer(obs_space, config.obs_clip) if config.normalize_obs else None
        self.actor = NumpyActor(config, obs_space, action_space)
        self.rng = np.random.default_rng(seed)

    def load_params(self, params: ParamDict, version: int) -> None:
        if self.normalizer is not None:
            self.normalizer.load(params, "obs_normalizer.")
        self.actor.load(params, "actor.")
        self.version = version

    def act(self, obs: Tree, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        """Actions for N observations (leaves ``[N, ...]``). CPU only, no I/O."""
        x = self.normalizer(obs) if self.normalizer is not None else obs
        if mode == ActMode.EVAL_DETERMINISTIC:
            actions = self.actor.squash(self.actor(x)[0])
        else:
            mean, log_std = self.actor(x)
            noise = self.rng.standard_normal(mean.shape, dtype=np.float32)
            actions = self.actor.squash(mean + np.exp(log_std) * noise)
        actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return ActionOutput(actions.astype(self.action_space.dtype), {})
