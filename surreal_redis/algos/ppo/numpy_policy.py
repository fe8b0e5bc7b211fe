"""PPO's agent-side policy in numpy: :class:`~surreal_redis.algos.ppo.policy.PPOPolicy` without torch
(the same parameter names, distributions and extras), for feed-forward networks only.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy, ParamDict
from surreal_redis.algos.numpy_nets import MLP, Encoder, Normalizer, take
from surreal_redis.algos.ppo.config import PPOConfig, numpy_unsupported, ppo_action_space
from surreal_redis.codec import Tree

LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


class NumpyPPOPolicy(AgentPolicy):
    """Acts for ``num_envs`` environments like :class:`~surreal_redis.algos.ppo.policy.PPOPolicy`.
    Raises ValueError for an LSTM config or an unsupported space; :meth:`load_params` raises
    :class:`~surreal_redis.algos.numpy_nets.ParamsMismatch` naming a missing or misshapen parameter.
    """

    def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space,
                 num_envs: int = 1, seed: int | None = None) -> None:
        reason = numpy_unsupported(config)
        if reason:
            raise ValueError(f"numpy inference runs PPO policies without an LSTM, not {reason}")
        self.continuous, self.action_dim = ppo_action_space(action_space)
        self.normalizer = Normalizer(obs_space, config.obs_clip) if config.normalize_obs else None
        self.encoder = Encoder(obs_space)
        self.actor = MLP(self.encoder.out_dim, config.hidden_sizes, self.action_dim, config.activation)
        self.critic = MLP(self.encoder.out_dim, config.hidden_sizes, 1, config.activation)
        self.log_std = np.full(self.action_dim, float(config.init_log_std), np.float32)
        self._rng = np.random.default_rng(seed)
        if isinstance(action_space, gym.spaces.Box):  # continuous (ppo_action_space accepted it)
            self._low = np.asarray(action_space.low, np.float32)
            self._high = np.asarray(action_space.high, np.float32)
        elif isinstance(action_space, gym.spaces.Discrete):
            self._start = int(action_space.start)

    def load_params(self, params: ParamDict, version: int) -> None:
        if self.normalizer is not None:
            self.normalizer.load(params, "obs_normalizer.")
        self.encoder.load(params, "encoder.")
        self.actor.load(params, "actor.")
        self.critic.load(params, "critic.")
        if self.continuous:
            self.log_std = take(params, "actor_logstd", (self.action_dim,))
        self.version = version

    def act(self, obs: Tree, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        """Actions for N = ``num_envs`` observations (leaves ``[N, ...]``). CPU only, no I/O."""
        z = self.encoder(self.normalizer(obs) if self.normalizer is not None else obs)
        head = self.actor(z)  # logits (Discrete) or means (Box), [N, A]
        extras: dict[str, np.ndarray] = {}
        if self.continuous:
            std = np.exp(self.log_std)
            if mode == ActMode.EVAL_DETERMINISTIC:
                raw = head
            else:
                raw = head + std * self._rng.standard_normal(head.shape, dtype=np.float32)
            if mode == ActMode.TRAINING:
                # Normal(head, std).log_prob summed over the action dims (torch's Independent(..., 1))
                logp = (-0.5 * np.square((raw - head) / std) - self.log_std - LOG_SQRT_2PI).sum(axis=-1)
                extras["logp"] = logp.astype(np.float32)
                extras["raw_action"] = raw.astype(np.float32)
            actions = np.clip(raw, self._low, self._high).astype(np.float32)
        else:
            shifted = head - head.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            if mode == ActMode.EVAL_DETERMINISTIC:
                raw = head.argmax(axis=-1)
            else:  # inverse CDF: the first action whose cumulative probability passes a uniform draw
                cumulative = np.cumsum(np.exp(log_probs), axis=-1)
                draws = self._rng.random((head.shape[0], 1)) * cumulative[:, -1:]
                raw = np.minimum((cumulative <= draws).sum(axis=-1), self.action_dim - 1)
            if mode == ActMode.TRAINING:  # fancy indexing: np.take_along_axis costs more here
                extras["logp"] = log_probs[np.arange(len(raw)), raw].astype(np.float32)
            actions = raw.astype(np.int64) + self._start
        if mode == ActMode.TRAINING:
            extras["value"] = self.critic(z)[:, 0].astype(np.float32)
        return ActionOutput(actions, extras)
