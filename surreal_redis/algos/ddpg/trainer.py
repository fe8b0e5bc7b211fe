"""DDPG learner (Lillicrap et al. 2016, arXiv:1509.02971) on n-step transitions from replay.

One update, as in CleanRL's ``ddpg_continuous_action.py``, whose actor and targets move every
``policy_frequency`` (2) critic steps (the delay TD3 introduced; 1 is the paper's DDPG):

    critic:  y = R + discount * Q'(s', mu'(s'))       (R, discount from nstep.py: gamma^m or 0)
             L_Q = mean(w * (y - Q(s, a))^2)            (w: importance weights, ones uniformly)
    actor:   L_mu = -mean(Q(s, mu(s)))                   every ``policy_frequency`` updates
    targets: soft  theta' <- (1 - tau) theta' + tau theta   with each actor step
             hard  theta' <- theta                           every ``hard_update_every`` updates

With ``compile`` the two losses run as compiled functions (:class:`~surreal_redis.algos.capture.Capture`);
gradient clipping, the optimizer steps and the target updates stay eager in both ways.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from surreal_redis.algos.actor_critic import ActorCriticTrainer
from surreal_redis.algos.capture import Capture, capture_wanted
from surreal_redis.algos.ddpg.policy import Actor, DDPGConfig
from surreal_redis.algos.networks import QNetwork, TargetAverager, clip_grad_norm, grad_norm
from surreal_redis.chunks import TransitionBatch
from surreal_redis.codec import Tree
from surreal_redis.envs.spaces import bounded_box

logger = logging.getLogger(__name__)


class DDPGTrainer(ActorCriticTrainer):
    """Learner-side DDPG: the parts of :class:`ActorCriticTrainer` (whose arguments it takes, on a
    bounded 1-d Box action space) and a target copy of the actor. ``compile_backend``:
    torch.compile's backend when ``config.compile`` captures the update (``inductor``; tests check
    the mechanism with ``aot_eager``)."""

    config: DDPGConfig
    actor: Actor
    critic: QNetwork

    def __init__(self, config: DDPGConfig, obs_space: gym.Space, action_space: gym.Space,
                 device: str | torch.device | None = None,
                 compile_backend: str | Callable[..., Any] = "inductor") -> None:
        self.config = config
        action_dim = bounded_box(action_space, "DDPG").shape[0]
        # Adam's weight_decay adds critic_l2 * theta to the gradient: the L2 penalty of the paper
        super().__init__(config, obs_space, Actor(config, obs_space, action_space),
                         QNetwork(obs_space, action_dim, config.critic_hidden, config.activation, out_std=0.01),
                         device, critic_weight_decay=config.critic_l2)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self._average_targets = TargetAverager((self.actor_target, self.actor), (self.critic_target, self.critic))
        self._actor_params: list[torch.Tensor] = list(self.actor.parameters())
        self._capture = (Capture({"critic": self._critic_loss, "actor": self._actor_loss}, self.device, compile_backend)
                         if capture_wanted(config.compile, self.device) else None)
        logger.info("DDPG on %s: actor %d, critic %d parameters", self.device,
                    sum(p.numel() for p in self.actor.parameters()),
                    sum(p.numel() for p in self.critic.parameters()))

    def update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        """One critic gradient step on a batch of B transitions, and an actor step every
        ``policy_frequency`` of them. Returns the stats and the float32 ``[B]`` TD errors
        ``y - Q(s, a)`` from before the step (the replay's new priorities). With ``compile`` the
        losses are the compiled :meth:`_critic_loss` and :meth:`_actor_loss`, else the same
        functions eagerly."""
        obs, next_obs, actions, rewards, discounts, weights = self._tensors(batch)
        critic_loss_of, actor_loss_of = self._critic_loss, self._actor_loss
        if self._capture is not None:
            self._warm_up(obs, next_obs, actions, rewards, discounts, weights)
            self._capture.step_begin()
            critic_loss_of, actor_loss_of = self._capture["critic"], self._capture["actor"]

        critic_loss, q_values, td_errors = critic_loss_of(obs, next_obs, actions, rewards, discounts, weights)
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        critic_grad_norm = _clip_grad(self._critic_params, self.config.critic_max_grad_norm)
        self.critic_optimizer.step()

        self.iteration += 1
        stats: dict[str, torch.Tensor | float] = {}
        if self.iteration % self.config.policy_frequency == 0:
            # actor: follow the critic's action gradient (the critic's own weight gradients unused: not computed)
            with self._critic_frozen():
                actor_loss = actor_loss_of(obs)
                self.actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward()
            stats["losses/actor_grad_norm"] = _clip_grad(self._actor_params, self.config.actor_max_grad_norm)
            self.actor_optimizer.step()
            stats["losses/actor_loss"] = actor_loss
            if self.config.target_update == "soft":
                self._average_targets(self.config.tau)
        if self.config.target_update == "hard" and self.iteration % self.config.hard_update_every == 0:
            self.actor_target.load_state_dict(self.actor.state_dict())
            self.critic_target.load_state_dict(self.critic.state_dict())

        stats.update({
            "losses/critic_loss": critic_loss,
            "losses/q_values": q_values,
            "losses/critic_grad_norm": critic_grad_norm,
        })
        return self._read_stats(stats), td_errors.cpu().numpy()

    def _critic_loss(self, obs: Tree, next_obs: Tree, actions: torch.Tensor, rewards: torch.Tensor,
                     discounts: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critic's loss on a batch (leaves ``[B, ...]``, ``actions`` ``[B, A]``, the rest
        ``[B]``), a pure function for the capture: ``(critic_loss, mean Q(s, a), td_errors [B])``,
        the last two detached."""
        # regress Q(s, a) on the n-step target (discount is 0 after a termination)
        with torch.no_grad():
            next_q = self.critic_target(next_obs, self.actor_target(next_obs))
            target_q = rewards + discounts * next_q
        q = self.critic(obs, actions)
        td_errors = target_q - q
        return (weights * td_errors.square()).mean(), q.detach().mean(), td_errors.detach()

    def _actor_loss(self, obs: Tree) -> torch.Tensor:
        """The actor's loss ``-mean Q(s, mu(s))``, for the capture (called with the critic frozen)."""
        return -self.critic(obs, self.actor(obs)).mean()

    def _warm_up(self, obs: Tree, next_obs: Tree, actions: torch.Tensor, rewards: torch.Tensor,
                 discounts: torch.Tensor, weights: torch.Tensor) -> None:
        """Compiles both losses on the first batch (the gradients dropped, no optimizer step): a
        compiler failure falls back to eager here."""
        assert self._capture is not None
        capture = self._capture

        def run() -> None:
            capture["critic"](obs, next_obs, actions, rewards, discounts, weights)[0].backward()
            with self._critic_frozen():
                capture["actor"](obs).backward()

        def undo() -> None:
            for optimizer in (self.critic_optimizer, self.actor_optimizer):
                optimizer.zero_grad(set_to_none=True)

        capture.warm_up(run, undo)

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), actor_target=self.actor_target.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.actor_target.load_state_dict(state["actor_target"])


def _clip_grad(params: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip the gradients of ``params`` to the global norm ``max_norm`` if set; return their global
    norm before clipping, as a 0-d tensor (no host read). Unset, only the norm is taken (clipping
    at an infinite norm would multiply every gradient by exactly 1)."""
    if max_norm is None:
        return grad_norm(params)
    return clip_grad_norm(params, max_norm)
