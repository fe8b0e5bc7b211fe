"""SAC learner (Haarnoja et al. 2018: arXiv:1801.01290; the version with twin Q and a learned
temperature, arXiv:1812.05905) on n-step transitions from replay.

One update, top to bottom as CleanRL's ``sac_continuous_action.py`` (R and discount from
nstep.py: the n-step reward sum and gamma^m, 0 after a termination; w: importance weights, ones
for uniform replay; eq. numbers are arXiv:1812.05905's):

    target:  a' ~ pi(.|s'),  V'(s') = min_i Q'_i(s', a') - alpha log pi(a'|s')       (eq. 3, clipped double Q)
             y = R + discount * V'(s')
    critics: L_Q = mean(w (Q_1(s, a) - y)^2) + mean(w (Q_2(s, a) - y)^2)           (eq. 5, without its 1/2)
    actor:   every ``policy_frequency`` updates, ``policy_frequency`` times:
             a~ = f(eps; s),  L_pi = mean(alpha log pi(a~|s) - min_i Q_i(s, a~))      (eq. 7 with eq. 8, i.e. eq. 9)
    alpha:   after each actor step, with a fresh a~ from the new actor (``autotune``):
             L_alpha = -mean(log_alpha (log pi(a~|s) + target_entropy))            (eq. 18, in log_alpha)
    targets: every ``target_network_frequency`` updates  Q'_i <- (1 - tau) Q'_i + tau Q_i

The temperature loss is SB3's (and softlearning's) form, which differentiates in ``log_alpha``:
its gradient is eq. 18's divided by alpha > 0, so both move alpha the same way and stop at the
same place; CleanRL multiplies by ``log_alpha.exp()`` instead.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from surreal_redis.algos.actor_critic import ActorCriticTrainer
from surreal_redis.algos.networks import TargetAverager, adam
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.algos.sac.policy import Actor, TwinCritic
from surreal_redis.chunks import TransitionBatch
from surreal_redis.codec import Tree
from surreal_redis.envs.spaces import bounded_box

logger = logging.getLogger(__name__)


class SACTrainer(ActorCriticTrainer):
    """Learner-side SAC: the parts of :class:`ActorCriticTrainer` (whose arguments it takes, on a
    bounded 1-d Box action space) with twin critics, plus the temperature ``log_alpha`` and its
    optimizer. ``seed`` seeds the update's own sampling noise (``generator``, on the device)."""

    config: SACConfig
    actor: Actor
    critic: TwinCritic

    def __init__(self, config: SACConfig, obs_space: gym.Space, action_space: gym.Space,
                 device: str | torch.device | None = None, seed: int = 0) -> None:
        self.config = config
        box = bounded_box(action_space, "SAC")
        super().__init__(config, obs_space, Actor(config, obs_space, action_space),
                         TwinCritic(config, obs_space, action_space), device)
        self.target_entropy = (-float(box.shape[0]) if config.target_entropy is None
                               else float(config.target_entropy))
        initial = config.init_alpha if config.autotune else max(config.alpha, 1e-30)
        self.log_alpha = torch.full((1,), math.log(initial), device=self.device, requires_grad=config.autotune)
        self.alpha_optimizer = (adam([self.log_alpha], lr=config.alpha_lr) if config.autotune
                                else None)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._average_targets = TargetAverager((self.critic_target, self.critic))
        logger.info("SAC on %s: actor %d, critics %d parameters, target entropy %g", self.device,
                    sum(p.numel() for p in self.actor.parameters()),
                    sum(p.numel() for p in self.critic.parameters()), self.target_entropy)

    @property
    def alpha(self) -> float:
        """The temperature the next update uses (``config.alpha`` when not ``autotune``)."""
        return float(self.log_alpha.exp().item()) if self.config.autotune else self.config.alpha

    def _alpha(self) -> torch.Tensor | float:
        """:attr:`alpha` without a host read: ``exp(log_alpha)`` as a ``[1]`` tensor (the same
        float32 value) when ``autotune``, else ``config.alpha``."""
        return self.log_alpha.detach().exp() if self.config.autotune else self.config.alpha

    def update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        """One critic step on a batch of B transitions; every ``policy_frequency`` updates,
        ``policy_frequency`` actor (and temperature) steps on it. Returns the stats and the float32
        ``[B]`` TD errors from before the step: the larger of the two critics' ``|y - Q_i(s, a)|``,
        the replay's new priorities. Prioritized replay ranks a transition by the size of its TD
        error (Schaul et al. 2016, arXiv:1511.05952); with twin critics, TD7 (Fujimoto et al. 2023,
        arXiv:2306.02451, ``sfujim/TD7``) takes the larger one. Averaging the signed errors first
        would let opposite signs cancel: a transition both critics get wrong could rank last."""
        config = self.config
        obs, next_obs, actions, rewards, discounts, weights = self._tensors(batch)
        alpha = self._alpha()

        # soft target, eq. 3: the soft value of s' under the current policy, with the smaller target critic
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(next_obs, generator=self.generator)
            next_q1, next_q2 = self.critic_target(next_obs, next_actions)
            next_value = torch.min(next_q1, next_q2) - alpha * next_log_prob
            target_q = rewards + discounts * next_value  # discount 0 after a termination: no bootstrap
        # critics, eq. 5: regress both on the same target, weighted for prioritized replay
        q1, q2 = self.critic(obs, actions)
        td1, td2 = target_q - q1, target_q - q2
        q1_loss = (weights * td1.square()).mean()
        q2_loss = (weights * td2.square()).mean()
        critic_loss = q1_loss + q2_loss
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        self.iteration += 1
        stats: dict[str, torch.Tensor | float] = {}
        if self.iteration % config.policy_frequency == 0:
            # the critics' weight gradients of the actor loss are never used: not computed
            with self._critic_frozen():
                alpha = self._actor_steps(obs, alpha, stats)
        if self.iteration % config.target_network_frequency == 0:
            self._average_targets(config.tau)

        stats.update({
            "losses/qf1_loss": q1_loss,
            "losses/qf2_loss": q2_loss,
            "losses/critic_loss": critic_loss,
            "losses/q_values": (0.5 * (q1 + q2)).mean(),
            "losses/alpha": alpha,
        })
        td_errors = torch.maximum(td1.abs(), td2.abs())
        return self._read_stats(stats), td_errors.detach().to(torch.float32).cpu().numpy()

    def _actor_steps(self, obs: Tree, alpha: torch.Tensor | float,
                     stats: dict[str, torch.Tensor | float]) -> torch.Tensor | float:
        """CleanRL's delayed actor: ``policy_frequency`` actor (and temperature) steps on the
        batch's observations, as many as updates were skipped. Adds their stats (tensors) to
        ``stats``; returns the temperature after them.

        The temperature's fresh sample after an actor step and the next actor step's sample come
        from the same actor on the same observations: one forward serves both (kept with its
        graph for the next step; the temperature's sample reads it detached)."""
        last = self.config.policy_frequency - 1
        heads: tuple[torch.Tensor, torch.Tensor] | None = None
        for step in range(self.config.policy_frequency):
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
