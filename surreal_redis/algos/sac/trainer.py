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
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from surreal_redis.algos.actor_critic import ActorCriticTrainer
from surreal_redis.algos.capture import Capture, capture_wanted
from surreal_redis.algos.networks import TargetAverager
from surreal_redis.algos.sac.base import SoftActorCritic
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.chunks import TransitionBatch
from surreal_redis.codec import Tree

logger = logging.getLogger(__name__)


class SACTrainer(SoftActorCritic, ActorCriticTrainer):
    """Learner-side SAC: :class:`~surreal_redis.algos.sac.base.SoftActorCritic` (whose arguments
    it takes) with the Polyak-averaged targets of its twin critics (:class:`ActorCriticTrainer`'s
    ``critic_target``). ``compile_backend``: torch.compile's
    backend when ``config.compile`` captures the update (``inductor``; tests check the mechanism
    with ``aot_eager``)."""

    config: SACConfig

    def __init__(self, config: SACConfig, obs_space: gym.Space, action_space: gym.Space,
                 device: str | torch.device | None = None, seed: int = 0,
                 compile_backend: str | Callable[..., Any] = "inductor") -> None:
        super().__init__(config, obs_space, action_space, device, seed)
        self._average_targets = TargetAverager((self.critic_target, self.critic))
        self._capture = (Capture({"critic": self._critic_losses, "actor": self._actor_loss,
                                  "alpha": self._alpha_loss}, self.device, compile_backend)
                         if capture_wanted(config.compile, self.device) else None)
        logger.info("SAC on %s: actor %d, critics %d parameters, target entropy %g", self.device,
                    sum(p.numel() for p in self.actor.parameters()),
                    sum(p.numel() for p in self.critic.parameters()), self.target_entropy)

    def update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        """One critic step on a batch of B transitions; every ``policy_frequency`` updates,
        ``policy_frequency`` actor (and temperature) steps on it. Returns the stats and the float32
        ``[B]`` TD errors from before the step (the replay's new priorities: ``_critic_step``)."""
        if self._capture is not None and self._capture.active:
            return self._captured_update(batch)
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
        stats, td_errors = self._critic_step(q1, q2, target_q, weights)

        self.iteration += 1
        if self.iteration % config.policy_frequency == 0:
            # the critics' weight gradients of the actor loss are never used: not computed
            with self._critic_frozen():
                alpha = self._actor_steps(obs, alpha, stats, config.policy_frequency)
        if self.iteration % config.target_network_frequency == 0:
            self._average_targets(config.tau)
        stats["losses/alpha"] = alpha
        return self._read_stats(stats), td_errors.to(torch.float32).cpu().numpy()

    def _noise(self, like: torch.Tensor) -> torch.Tensor:
        """Standard normal noise shaped as ``like`` ``[B, A]`` from :attr:`generator`: the draw
        ``Actor.sample_from`` makes in the eager update, in the same order."""
        return torch.randn(like.shape, generator=self.generator, device=like.device, dtype=like.dtype)

    def _critic_losses(self, obs: Tree, next_obs: Tree, actions: torch.Tensor, rewards: torch.Tensor,
                       discounts: torch.Tensor, weights: torch.Tensor, alpha: torch.Tensor | float,
                       next_noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The critic loss of :meth:`update` (eq. 3 and 5) as a pure function for the capture:
        ``(critic_loss, qf1_loss, qf2_loss, q_values, td_errors [B])``, all but the first detached."""
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(next_obs, noise=next_noise)
            next_q1, next_q2 = self.critic_target(next_obs, next_actions)
            target_q = rewards + discounts * (torch.min(next_q1, next_q2) - alpha * next_log_prob)
        q1, q2 = self.critic(obs, actions)
        td1, td2 = target_q - q1, target_q - q2
        q1_loss = (weights * td1.square()).mean()
        q2_loss = (weights * td2.square()).mean()
        return (q1_loss + q2_loss, q1_loss.detach(), q2_loss.detach(), (0.5 * (q1 + q2)).mean().detach(),
                torch.maximum(td1.abs(), td2.abs()).detach())

    def _actor_loss(self, obs: Tree, alpha: torch.Tensor | float,
                    noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor loss of eq. 9 and the policy's entropy estimate (detached), for the capture."""
        mean, log_std = self.actor(obs)
        pi, log_prob = self.actor.sample_from(mean, log_std, noise)
        q1_pi, q2_pi = self.critic(obs, pi)
        return (alpha * log_prob - torch.min(q1_pi, q2_pi)).mean(), -log_prob.detach().mean()

    def _alpha_loss(self, obs: Tree, noise: torch.Tensor) -> torch.Tensor:
        """The temperature loss of eq. 18 on a fresh sample of the actor, for the capture."""
        with torch.no_grad():
            _, log_prob = self.actor.sample(obs, noise=noise)
        return -(self.log_alpha * (log_prob + self.target_entropy)).mean()

    def _captured_update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        """:meth:`update` through the compiled step functions (``config.compile``): the same noise
        draws in the same order, so the same update up to float rounding; the actor's forward for
        the temperature is not reused by the next actor step (each compiled function is whole)."""
        assert self._capture is not None
        capture, config = self._capture, self.config
        obs, next_obs, actions, rewards, discounts, weights = self._tensors(batch)
        self._warm_up(obs, next_obs, actions, rewards, discounts, weights)
        capture.step_begin()
        alpha = self._alpha()
        critic_loss, q1_loss, q2_loss, q_values, td_errors = capture["critic"](
            obs, next_obs, actions, rewards, discounts, weights, alpha, self._noise(actions))
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        self.iteration += 1
        stats: dict[str, torch.Tensor | float] = {}
        if self.iteration % config.policy_frequency == 0:
            with self._critic_frozen():
                for _ in range(config.policy_frequency):
                    actor_loss, stats["losses/entropy"] = capture["actor"](obs, alpha, self._noise(actions))
                    self.actor_optimizer.zero_grad(set_to_none=True)
                    actor_loss.backward()
                    self.actor_optimizer.step()
                    stats["losses/actor_loss"] = actor_loss.detach()
                    if self.alpha_optimizer is not None:
                        alpha_loss = capture["alpha"](obs, self._noise(actions))
                        self.alpha_optimizer.zero_grad(set_to_none=True)
                        alpha_loss.backward()
                        self.alpha_optimizer.step()
                        alpha, stats["losses/alpha_loss"] = self._alpha(), alpha_loss.detach()
        if self.iteration % config.target_network_frequency == 0:
            self._average_targets(config.tau)
        stats.update({"losses/qf1_loss": q1_loss, "losses/qf2_loss": q2_loss,
                      "losses/critic_loss": critic_loss.detach(), "losses/q_values": q_values,
                      "losses/alpha": alpha})
        return self._read_stats(stats), td_errors.to(torch.float32).cpu().numpy()

    def _warm_up(self, obs: Tree, next_obs: Tree, actions: torch.Tensor, rewards: torch.Tensor,
                 discounts: torch.Tensor, weights: torch.Tensor) -> None:
        """Compiles the step functions on the first batch (zero noise, no generator draw, the
        gradients dropped, no optimizer step): a compiler failure falls back to eager here."""
        assert self._capture is not None
        capture, noise, alpha = self._capture, torch.zeros_like(actions), self._alpha()
        optimizers = [self.critic_optimizer, self.actor_optimizer, self.alpha_optimizer]

        def run() -> None:
            capture["critic"](obs, next_obs, actions, rewards, discounts, weights, alpha, noise)[0].backward()
            with self._critic_frozen():
                capture["actor"](obs, alpha, noise)[0].backward()
                if self.alpha_optimizer is not None:
                    capture["alpha"](obs, noise).backward()

        def undo() -> None:
            for optimizer in optimizers:
                if optimizer is not None:
                    optimizer.zero_grad(set_to_none=True)

        capture.warm_up(run, undo)
