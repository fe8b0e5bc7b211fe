"""SAC's learner without target critics (Haarnoja et al. 2018, arXiv:1801.01290 and
arXiv:1812.05905; eq. numbers are the latter's): the squashed Gaussian actor, a given pair of
critics, the temperature and the update's noise, with the critic step (eq. 5) and the actor and
temperature steps (eq. 9 and 18) that :class:`~surreal_redis.algos.sac.trainer.SACTrainer` and
CrossQ (:mod:`surreal_redis.algos.crossq.trainer`) both take; each computes its own targets."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from surreal_redis.algos.actor_critic import ActorCriticBase
from surreal_redis.algos.networks import adam
from surreal_redis.algos.sac.config import SoftActorCriticConfig
from surreal_redis.algos.sac.policy import Actor, TwinCritic
from surreal_redis.codec import Tree
from surreal_redis.envs.spaces import bounded_box

Stats = dict[str, torch.Tensor | float]


class SoftActorCritic(ActorCriticBase):
    """:class:`ActorCriticBase` (whose arguments it takes, on a bounded 1-d Box action space) with
    SAC's :class:`~surreal_redis.algos.sac.policy.Actor` and :class:`TwinCritic` (built in that
    order from the torch seed; ``critic_norm`` as its ``norm``), the temperature ``log_alpha`` and
    its optimizer. ``seed`` seeds the update's own sampling noise (``generator``, on the device).
    A subclass that adds a target critic lists
    :class:`~surreal_redis.algos.actor_critic.ActorCriticTrainer` after this class (SAC)."""

    config: SoftActorCriticConfig
    actor: Actor
    critic: TwinCritic

    def __init__(self, config: SoftActorCriticConfig, obs_space: gym.Space, action_space: gym.Space,
                 device: str | torch.device | None = None, seed: int = 0,
                 critic_norm: Callable[[int], nn.Module] | None = None) -> None:
        self.config = config
        box = bounded_box(action_space, "SAC")
        super().__init__(config, obs_space, Actor(config, obs_space, action_space),
                         TwinCritic(config, obs_space, action_space, critic_norm), device)
        self.target_entropy = (-float(box.shape[0]) if config.target_entropy is None
                               else float(config.target_entropy))
        initial = config.init_alpha if config.autotune else max(config.alpha, 1e-30)
        self.log_alpha = torch.full((1,), math.log(initial), device=self.device, requires_grad=config.autotune)
        self.alpha_optimizer = (adam([self.log_alpha], lr=config.alpha_lr) if config.autotune
                                else None)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    @property
    def alpha(self) -> float:
        """The temperature the next update uses (``config.alpha`` when not ``autotune``)."""
        return float(self.log_alpha.exp().item()) if self.config.autotune else self.config.alpha

    def _alpha(self) -> torch.Tensor | float:
        """:attr:`alpha` without a host read: ``exp(log_alpha)`` as a ``[1]`` tensor (the same
        float32 value) when ``autotune``, else ``config.alpha``."""
        return self.log_alpha.detach().exp() if self.config.autotune else self.config.alpha

    def _critic_step(self, q1: torch.Tensor, q2: torch.Tensor, target_q: torch.Tensor,
                     weights: torch.Tensor) -> tuple[Stats, torch.Tensor]:
        """Critics, eq. 5: both regress on the same (detached) target ``y`` ``[B]``, weighted per
        transition for prioritized replay; one optimizer step. Returns the losses (tensors) and
        the ``[B]`` priorities: the larger of ``|y - Q_i(s, a)|``. Prioritized replay ranks a
        transition by the size of its TD error (Schaul et al. 2016, arXiv:1511.05952); with twin
        critics, TD7 (Fujimoto et al. 2023, arXiv:2306.02451, ``sfujim/TD7``) takes the larger
        one. Averaging the signed errors first would let opposite signs cancel: a transition both
        critics get wrong could rank last."""
        td1, td2 = target_q - q1, target_q - q2
        q1_loss = (weights * td1.square()).mean()
        q2_loss = (weights * td2.square()).mean()
        critic_loss = q1_loss + q2_loss
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        stats: Stats = {"losses/qf1_loss": q1_loss, "losses/qf2_loss": q2_loss, "losses/critic_loss": critic_loss,
                        "losses/q_values": (0.5 * (q1 + q2)).mean()}
        return stats, torch.maximum(td1.abs(), td2.abs()).detach()

    def _actor_steps(self, obs: Tree, alpha: torch.Tensor | float, stats: Stats,
                     steps: int) -> torch.Tensor | float:
        """``steps`` actor (and temperature) steps on the batch's observations (SAC: CleanRL's
        delayed actor, as many as updates were skipped). Adds their stats (tensors) to
        ``stats``; returns the temperature after them.

        The temperature's fresh sample after an actor step and the next actor step's sample come
        from the same actor on the same observations: one forward serves both (kept with its
        graph for the next step; the temperature's sample reads it detached)."""
        last = steps - 1
        heads: tuple[torch.Tensor, torch.Tensor] | None = None
        for step in range(steps):
            # actor, eq. 9: reparameterized actions against the smaller (updated) critic
            mean, log_std = heads if heads is not None else self.actor(obs)
            pi, log_prob = self.actor.sample_from(mean, log_std, generator=self.generator)
            q1_pi, q2_pi = self.critic(obs, pi)
            actor_loss = (alpha * log_prob - torch.min(q1_pi, q2_pi)).mean()
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optimizer.step()
            stats["losses/actor_loss"] = actor_loss
            stats["losses/entropy"] = -log_prob.detach().mean()
            heads = None
            if self.alpha_optimizer is not None:
                # temperature, eq. 18: alpha grows while the entropy is below target_entropy
                with torch.set_grad_enabled(step < last):
                    heads = self.actor(obs)
                with torch.no_grad():
                    _, log_prob = self.actor.sample_from(heads[0].detach(), heads[1].detach(),
                                                         generator=self.generator)
                alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).mean()
                self.alpha_optimizer.zero_grad(set_to_none=True)
                alpha_loss.backward()
                self.alpha_optimizer.step()
                alpha = self._alpha()
                stats["losses/alpha_loss"] = alpha_loss
        return alpha

    def state_dict(self) -> dict[str, Any]:
        state = dict(super().state_dict(), log_alpha=self.log_alpha.detach().clone(),
                     generator=self.generator.get_state())
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())
