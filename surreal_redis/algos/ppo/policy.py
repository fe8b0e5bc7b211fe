"""PPO's actor-critic network and torch agent-side policy.

The network is CleanRL's: separate MLPs for the actor and the critic, orthogonal init with gain
0.01 on the policy head and 1 on the value head, a state-independent log-std for continuous
actions. Optional: the z-filter in front, a CNN stem shared by actor and critic (CleanRL's Atari
PPO), and an LSTM shared by both heads (SURREAL's ``ppo_net.py``, CleanRL's ``ppo_atari_lstm.py``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy, ParamDict
from surreal_redis.algos.networks import ObservationEncoder, mlp, obs_to_tensor, params_as_tensors
from surreal_redis.algos.normalizer import ObservationNormalizer
from surreal_redis.algos.ppo.config import PPOConfig, ppo_action_space
from surreal_redis.chunks import INITIAL_STATE
from surreal_redis.codec import Tree

LSTMState = tuple[torch.Tensor, torch.Tensor]


class ActorCritic(nn.Module):
    """Policy and value networks for a Discrete or Box action space, on observation tensors (leaves
    ``[N, ...]``). With ``use_lstm`` the trunk is recurrent (:meth:`core`)."""

    def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        self.continuous, action_dim = ppo_action_space(action_space)
        self.obs_normalizer = ObservationNormalizer(obs_space, config.obs_clip) if config.normalize_obs else None
        self.encoder = ObservationEncoder(obs_space)
        trunk_dim = self.encoder.out_dim
        self.lstm: nn.LSTMCell | None = None
        if config.use_lstm:
            self.lstm = nn.LSTMCell(trunk_dim, config.lstm_hidden)
            # CleanRL ppo_atari_lstm.py: orthogonal weights (gain 1), zero biases
            for name, param in self.lstm.named_parameters():
                if "bias" in name:
                    nn.init.constant_(param, 0.0)
                else:
                    nn.init.orthogonal_(param, 1.0)
            trunk_dim = config.lstm_hidden
        self.actor = mlp(trunk_dim, config.hidden_sizes, action_dim, config.activation, out_std=0.01)
        self.critic = mlp(trunk_dim, config.hidden_sizes, 1, config.activation, out_std=1.0)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.full((action_dim,), float(config.init_log_std)))

    def features(self, obs: Tree) -> torch.Tensor:
        """Z-filter (if any) and encode: observation leaves ``[N, ...]`` -> ``[N, F]``."""
        if self.obs_normalizer is not None:
            obs = self.obs_normalizer(obs)
        return self.encoder(obs)

    def core(self, x: torch.Tensor, state: LSTMState | None = None,
             episode_start: torch.Tensor | None = None) -> tuple[torch.Tensor, LSTMState | None]:
        """The trunk. Without LSTM: returns ``(x, None)``. With LSTM: ``x`` is ``[T*B, F]`` time-major,
        ``state`` the ``(h, c)`` pair ``[B, H]`` before step 0 and ``episode_start`` bool ``[T, B]``
        (state zeroed before that step). Returns the outputs ``[T*B, H]`` and the states after
        every step, ``(h, c)`` each ``[T, B, H]``.
        """
        if self.lstm is None:
            return x, None
        assert state is not None and episode_start is not None, "the LSTM needs a state and episode starts"
        h, c = state
        hs, cs = [], []
        for t, x_t in enumerate(x.reshape(episode_start.shape[0], -1, x.shape[-1])):
            keep = (~episode_start[t]).to(x.dtype).unsqueeze(-1)
            h, c = self.lstm(x_t, (h * keep, c * keep))
            hs.append(h)
            cs.append(c)
        h_all, c_all = torch.stack(hs), torch.stack(cs)
        return h_all.reshape(-1, h_all.shape[-1]), (h_all, c_all)

    def policy_head(self, z: torch.Tensor) -> torch.Tensor:
        """Logits (Discrete) or means (Box), ``[N, A]``."""
        return self.actor(z)

    def distribution(self, head: torch.Tensor, log_std: torch.Tensor | None = None,
                     validate: bool | None = None) -> Distribution:
        """The action distribution of :meth:`policy_head` outputs ``[N, A]`` (``log_std`` ``[A]``
        defaults to the current one). Its ``log_prob`` and ``entropy`` are ``[N]``. ``validate``:
        torch's argument checks (None: torch's default, on), each a host sync on a GPU."""
        if not self.continuous:
            return Categorical(logits=head, validate_args=validate)
        log_std = self.actor_logstd if log_std is None else log_std
        return Independent(Normal(head, log_std.exp().expand_as(head), validate_args=validate), 1,
                           validate_args=validate)

    def log_prob_entropy(self, head: torch.Tensor, actions: torch.Tensor,
                         grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs ``[N]`` of ``actions`` (``[N]`` or ``[N, A]``) under :meth:`distribution`
        of ``head`` ``[N, A]``, and the mean entropy (a 0-d tensor; ``grad`` False: detached,
        for a loss that does not read it). The same values as the distribution's, computed
        without building one (Categorical: ``log_softmax`` then ``gather``)."""
        if self.continuous:
            dist = self.distribution(head, validate=False)
            with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
                entropy = dist.entropy().mean()
            return dist.log_prob(actions), entropy
        logp_all = torch.log_softmax(head, dim=-1)
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        return logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy

    def value(self, z: torch.Tensor) -> torch.Tensor:
        """State values ``[N]``."""
        return self.critic(z).squeeze(-1)

    def zero_state(self, batch: int, device: torch.device | str = "cpu") -> LSTMState:
        assert self.lstm is not None
        zeros = torch.zeros(batch, self.lstm.hidden_size, device=device)
        return zeros, zeros.clone()


class PPOPolicy(AgentPolicy):
    """Agent side of PPO: acts for ``num_envs`` environments with the published parameters (CPU).

    Training mode samples and returns extras ``logp`` ``[N]`` and ``value`` ``[N]`` (float32),
    plus ``raw_action`` ``[N, A]`` for Box spaces: the unclipped Gaussian sample, so that clipping
    ``actions`` to the bounds does not bias the log-prob. ``eval_deterministic`` takes the mode of
    the distribution, ``eval_stochastic`` samples; both return no extras.

    With an LSTM the policy keeps one state per env, zeroed by :meth:`on_episode_start` (before the
    next act), and training mode adds ``extras["initial_state"]`` (``lstm_h``, ``lstm_c``, each
    ``[N, H]``): the state this step started from, whence the learner re-runs the LSTM over a chunk.
    """

    def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space,
                 num_envs: int = 1, seed: int | None = None) -> None:
        self.net = ActorCritic(config, obs_space, action_space).eval()
        if isinstance(action_space, gym.spaces.Box):  # continuous (ppo_action_space accepted it)
            self._low, self._high = action_space.low, action_space.high
        elif isinstance(action_space, gym.spaces.Discrete):
            self._start = int(action_space.start)
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._state = self.net.zero_state(num_envs) if self.net.lstm is not None else None

    def load_params(self, params: ParamDict, version: int) -> None:
        self.net.load_state_dict(params_as_tensors(params))
        self.version = version

    def initial_state(self, num_envs: int) -> dict[str, np.ndarray]:
        if self.net.lstm is None:
            return {}
        h, c = self.net.zero_state(num_envs)
        return {"lstm_h": h.numpy(), "lstm_c": c.numpy()}

    def on_episode_start(self, env_index: int) -> None:
        if self._state is not None:
            self._state[0][env_index] = 0.0
            self._state[1][env_index] = 0.0

    @torch.no_grad()
    def act(self, obs: Tree, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        """Actions ``[N]`` (Discrete, int64) or ``[N, A]`` (Box, float32) for N = ``num_envs``."""
        x = self.net.features(obs_to_tensor(obs, "cpu"))
        episode_start = torch.zeros(1, x.shape[0], dtype=torch.bool)
        start_state = self._state
        z, states = self.net.core(x, start_state, episode_start)
        if states is not None:
            self._state = (states[0][-1], states[1][-1])
        head = self.net.policy_head(z)
        dist = self.net.distribution(head)
        if mode == ActMode.EVAL_DETERMINISTIC:
            raw = head if self.net.continuous else head.argmax(dim=-1)
        elif self.net.continuous:
            raw = head + self.net.actor_logstd.exp() * torch.randn(head.shape, generator=self._generator)
        else:
            assert isinstance(dist, Categorical)
            raw = torch.multinomial(dist.probs, 1, generator=self._generator).squeeze(-1)
        extras: dict[str, Tree] = {}
        if mode == ActMode.TRAINING:
            extras["logp"] = dist.log_prob(raw).numpy().astype(np.float32)
            extras["value"] = self.net.value(z).numpy().astype(np.float32)
            if self.net.continuous:
                extras["raw_action"] = raw.numpy().astype(np.float32)
            if start_state is not None:
                extras[INITIAL_STATE] = {"lstm_h": start_state[0].numpy().copy(),
                                           "lstm_c": start_state[1].numpy().copy()}
        if self.net.continuous:
            actions = np.clip(raw.numpy(), self._low, self._high).astype(np.float32)
        else:
            actions = raw.numpy().astype(np.int64) + self._start
        return ActionOutput(actions, extras)
