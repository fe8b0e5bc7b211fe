"""The reference updates of ``bench/learner_step.py``: stable-baselines3's own update of each
algorithm on the same observation and action spaces, network sizes, batch, device and torch
threads as ours, fed random data of the right shapes (no env is stepped: an update's cost does not
depend on what the numbers are, only on their shapes, while the weights move as usual).

- SAC: ``SAC.train(gradient_steps=1, batch_size=B)`` on a replay buffer filled with random
  transitions; actor and critics ``net_arch`` = the config's ``actor_hidden`` / ``critic_hidden``,
  ReLU, a learned temperature. SB3 updates its actor every step, ours ``policy_frequency`` times
  every ``policy_frequency`` steps: the same work per step on average, so time several steps.
- DDPG: ``TD3.train(gradient_steps=1, batch_size=B)`` with one critic (``n_critics=1``),
  ``policy_delay`` = our ``policy_frequency`` and no target-policy noise: SB3's DDPG with ours'
  delayed actor (SB3's ``DDPG`` class is this TD3 with ``policy_delay=1``).
- PPO / APPO: ``compute_returns_and_advantage`` then ``PPO.train()`` (``n_epochs`` epochs of
  minibatches of ``batch_size`` rows) on a rollout buffer of random data, the networks
  ``net_arch=dict(pi=hidden, vf=hidden)`` with the config's activation; per minibatch step = the
  whole / (epochs x minibatches), as ours.

Each maker returns a callable doing one such update (the off-policy ones take, and ignore, ours'
batch: theirs comes from their buffer). Their update includes drawing
the batch from their buffer (ours gets a ready batch: the sampling is the replay's, timed in
``bench/replay.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


class SpacesEnv(gym.Env):
    """An env of the given spaces that returns random observations: what SB3's constructors need
    to size their networks and buffers (never stepped by the bench)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


def _quiet(model: Any) -> Any:
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(folder=None, format_strings=[]))
    return model


def _fill_replay(model: Any, size: int, rng: np.random.Generator) -> None:
    buffer = model.replay_buffer
    for name in ("observations", "next_observations", "actions", "rewards"):
        array = getattr(buffer, name)
        array[:size] = rng.uniform(-1, 1, (size, *array.shape[1:])).astype(array.dtype)
    buffer.dones[:size] = 0.0
    buffer.pos = size


def sac_update(section: Any, obs_space: gym.Space, action_space: gym.Space, batch_size: int, device: str,
               seed: int) -> Callable[..., None]:
    """One SB3 SAC gradient step (see the module docstring)."""
    from stable_baselines3 import SAC

    model = _quiet(SAC("MlpPolicy", SpacesEnv(obs_space, action_space), learning_rate=section.critic_lr,
                       buffer_size=8 * batch_size, learning_starts=0, batch_size=batch_size, tau=section.tau,
                       gamma=section.gamma, ent_coef="auto", device=device, seed=seed,
                       policy_kwargs={"net_arch": {"pi": list(section.actor_hidden),
                                                   "qf": list(section.critic_hidden)},
                                      "activation_fn": ACTIVATIONS[section.activation]}))
    _fill_replay(model, 8 * batch_size, np.random.default_rng(seed))
    return lambda _batch=None: model.train(gradient_steps=1, batch_size=batch_size)


def ddpg_update(section: Any, obs_space: gym.Space, action_space: gym.Space, batch_size: int, device: str,
                seed: int) -> Callable[..., None]:
    """One SB3 TD3-as-DDPG gradient step (see the module docstring)."""
    from stable_baselines3 import TD3

    model = _quiet(TD3("MlpPolicy", SpacesEnv(obs_space, action_space), learning_rate=section.critic_lr,
                       buffer_size=8 * batch_size, learning_starts=0, batch_size=batch_size, tau=section.tau,
                       gamma=section.gamma, policy_delay=section.policy_frequency, target_policy_noise=0.0,
                       target_noise_clip=0.0, device=device, seed=seed,
                       policy_kwargs={"net_arch": {"pi": list(section.actor_hidden),
                                                   "qf": list(section.critic_hidden)},
                                      "activation_fn": ACTIVATIONS[section.activation], "n_critics": 1}))
    _fill_replay(model, 8 * batch_size, np.random.default_rng(seed))
    return lambda _batch=None: model.train(gradient_steps=1, batch_size=batch_size)


def ppo_update(section: Any, obs_space: gym.Space, action_space: gym.Space, steps: int, minibatch: int,
               device: str, seed: int) -> Callable[[], None]:
    """One SB3 PPO update of ``steps`` rows (see the module docstring)."""
    from stable_baselines3 import PPO

    policy_kwargs: dict[str, Any] = {"net_arch": {"pi": list(section.hidden_sizes), "vf": list(section.hidden_sizes)},
                                     "activation_fn": ACTIVATIONS[section.activation]}
    if isinstance(action_space, gym.spaces.Box):
        policy_kwargs["log_std_init"] = float(section.init_log_std)
    model = _quiet(PPO("MlpPolicy", SpacesEnv(obs_space, action_space), learning_rate=section.learning_rate,
                       n_steps=steps, batch_size=minibatch, n_epochs=section.update_epochs, gamma=section.gamma,
                       gae_lambda=section.gae_lambda, clip_range=section.clip_coef, ent_coef=section.ent_coef,
                       vf_coef=section.vf_coef, max_grad_norm=section.max_grad_norm, device=device, seed=seed,
                       policy_kwargs=policy_kwargs))
    buffer = model.rollout_buffer
    rng = np.random.default_rng(seed)
    last_values = torch.zeros(1, device=model.device)
    dones = np.zeros(1, dtype=np.float32)

    buffer.reset()
    buffer.observations[:] = rng.uniform(-1, 1, buffer.observations.shape)
    if isinstance(action_space, gym.spaces.Discrete):
        buffer.actions[:] = rng.integers(0, action_space.n, buffer.actions.shape)
    else:
        buffer.actions[:] = rng.uniform(-1, 1, buffer.actions.shape)
    for name in ("rewards", "values", "log_probs"):
        getattr(buffer, name)[:] = rng.normal(size=getattr(buffer, name).shape)
    buffer.log_probs[:] -= 2.0
    filled = {name: getattr(buffer, name) for name in ("observations", "actions", "rewards", "values", "log_probs",
                                                      "episode_starts", "advantages")}

    def update() -> None:
        # train() flattens the buffer's arrays into new ones: put the filled [steps, 1, ...] ones back
        for name, array in filled.items():
            setattr(buffer, name, array)
        buffer.generator_ready, buffer.full = False, True
        buffer.compute_returns_and_advantage(last_values, dones)
        model.train()

    return update
