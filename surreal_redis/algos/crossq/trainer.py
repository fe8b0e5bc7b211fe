"""CrossQ learner: Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement Learning for
Greater Sample Efficiency and Simplicity", ICLR 2024 (openreview.net/forum?id=PczQtTsTIX;
arXiv:1902.05605v4).

SAC (:mod:`surreal_redis.algos.sac.trainer`, whose actor, temperature and steps it reuses) with
three changes (the paper's section 3, and its Figure 3: SAC's critic with target Q values
against CrossQ's batch-normalized critic and joint forward):

1. no target networks: the bootstrap uses the critic being trained, its Q(s', a') detached;
2. BatchNorm in the critics, on the input and after each hidden activation (before every Linear);
3. one joint forward of the critics, in train mode, over the concatenated batch
   [(s, a); (s', a')], so that each BatchNorm normalizes with the statistics of both
   distributions together; the result is split again. Two separate forwards would normalize
   (s', a'), whose actions come from the current policy instead of the replay, with statistics
   it never saw; a target network's copied statistics have the same trouble (section 3);

with the paper's hyperparameters (its appendix table): Adam beta1 0.5, learning rates 1e-3,
policy delay 3, one update per env step (UTD 1), critics 2048 wide (``crossq.critic_hidden``
defaults to 256 for CPU learners).

One update, top to bottom (R and discount from nstep.py: the n-step reward sum and gamma^m, 0
after a termination so a truncation bootstraps; w: importance weights; eq. numbers are SAC's,
arXiv:1812.05905):

    a' ~ pi(.|s')                                                     (no grad)
    [Q_i(s, a); Q_i(s', a')] = Q_i([s; s'], [a; a'])    critics in train mode, split in two
    y = R + discount * stopgrad(min_i Q_i(s', a') - alpha log pi(a'|s'))        (eq. 3, no target)
    L_Q = mean(w (Q_1(s, a) - y)^2) + mean(w (Q_2(s, a) - y)^2)             (eq. 5, without its 1/2)
    every ``policy_frequency`` updates, once, the critics in eval mode (running statistics):
        a~ = f(eps; s),  L_pi = mean(alpha log pi(a~|s) - min_i Q_i(s, a~))           (eq. 9)
        L_alpha = -mean(log_alpha (log pi(a~'|s) + target_entropy)), a~' from the new actor (eq. 18)

Choices, and why:

- BatchNorm (``torch.nn.BatchNorm1d``, momentum ``crossq.bn_momentum`` 0.01, eps 1e-3) rather
  than the Batch Renormalization of the authors' JAX code and SB3-contrib: the paper's method
  is stated with BatchNorm, torch has it built in, and BatchRenorm behaves as BatchNorm through
  its warm-up (SB3-contrib's: the first 100k updates) anyway.
- The actor is SAC's, without BatchNorm (the reference implementations normalize it too): the
  agents then act with SAC's torch or numpy policy on the same parameters.
- The temperature step takes a fresh sample of the stepped actor, as SAC's here does;
  SB3-contrib's reuses the actor step's sample.
"""

from __future__ import annotations

import functools
import logging

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from surreal_redis.algos.crossq.config import CrossQConfig
from surreal_redis.algos.networks import adam
from surreal_redis.algos.sac.base import SoftActorCritic
from surreal_redis.chunks import TransitionBatch
from surreal_redis.trees import tree_map

logger = logging.getLogger(__name__)

BN_EPS = 1e-3
"""BatchNorm's epsilon, as the authors' code and SB3-contrib's (torch's default is 1e-5)."""
ADAM_BETA2 = 0.999


class CrossQTrainer(SoftActorCritic):
    """Learner-side CrossQ: :class:`~surreal_redis.algos.sac.base.SoftActorCritic` (whose arguments
    it takes) with batch-normalized twin critics and no target critics; the actor's and critics'
    Adam with beta1 ``config.adam_beta1``."""

    config: CrossQConfig

    def __init__(self, config: CrossQConfig, obs_space: gym.Space, action_space: gym.Space,
                 device: str | torch.device | None = None, seed: int = 0) -> None:
        norm = functools.partial(nn.BatchNorm1d, momentum=config.bn_momentum, eps=BN_EPS)
        super().__init__(config, obs_space, action_space, device, seed, critic_norm=norm)
        # the paper's Adam (beta1 0.5), over the same parameters before any step
        betas = (config.adam_beta1, ADAM_BETA2)
        self.actor_optimizer = adam(self.actor.parameters(), lr=config.actor_lr, betas=betas)
        self.critic_optimizer = adam(self.critic.parameters(), lr=config.critic_lr, betas=betas)
        logger.info("CrossQ on %s: actor %d, critics %d parameters, target entropy %g", self.device,
                    sum(p.numel() for p in self.actor.parameters()),
                    sum(p.numel() for p in self.critic.parameters()), self.target_entropy)

    def update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        """One critic step on a batch of B transitions; every ``policy_frequency`` updates, one
        actor (and temperature) step on it. Returns the stats and the float32 ``[B]`` TD errors
        from before the step (the replay's new priorities, as SAC's)."""
        config = self.config
        obs, next_obs, actions, rewards, discounts, weights = self._tensors(batch)
        alpha = self._alpha()

        # a' ~ pi(.|s') from the actor being trained (there is no target actor in SAC either)
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(next_obs, generator=self.generator)
        # the joint forward (section 3, Figure 3): BatchNorm statistics of (s, a) and (s', a') together
        self.critic.train()
        joint_obs = tree_map(lambda now, later: torch.cat([now, later]), obs, next_obs)
        q1_joint, q2_joint = self.critic(joint_obs, torch.cat([actions, next_actions]))
        q1, next_q1 = q1_joint.chunk(2)
        q2, next_q2 = q2_joint.chunk(2)
        # soft target, eq. 3 with the critic itself in place of a target network, detached
        next_value = (torch.min(next_q1, next_q2) - alpha * next_log_prob).detach()
        target_q = rewards + discounts * next_value  # discount 0 after a termination: no bootstrap
        # critics, eq. 5
        stats, td_errors = self._critic_step(q1, q2, target_q, weights)

        self.iteration += 1
        if self.iteration % config.policy_frequency == 0:
            # actor and temperature, eq. 9 and 18: the critic in eval mode (running statistics);
            # its weight gradients of the actor loss are never used, so not computed
            self.critic.eval()
            with self._critic_frozen():
                alpha = self._actor_steps(obs, alpha, stats, 1)
        stats["losses/alpha"] = alpha
        return self._read_stats(stats), td_errors.to(torch.float32).cpu().numpy()
