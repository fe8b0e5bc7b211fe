"""APPO learner: PPO's update (:class:`~surreal_redis.algos.ppo.trainer.PPOTrainer`) with V-trace
targets (Espeholt et al. 2018, IMPALA, arXiv:1802.01561, section 4.1, eq. (1)) in place of GAE.

The policy-gradient advantage is eq. (1)'s correction v_s - V(x_s) (``pg_advantage: lambda``) or
section 4.2's rho_s (r_s + gamma v_{s+1} - V(x_s)) (``one_step``); the clipped surrogate's ratio
is against the agents' behaviour log-probs or the network at the update's start (``clip_against``;
:class:`~surreal_redis.algos.appo.config.APPOConfig` says more). Episode ends stay apart, as in
PPO's GAE: a terminated step bootstraps from 0, a truncated one from V of its true final
observation, the chunk's last step from V(obs[T]); the trace stops at all three.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch

from surreal_redis.algos.appo.config import APPOConfig
from surreal_redis.algos.ppo.policy import ActorCritic, LSTMState
from surreal_redis.algos.ppo.trainer import PPOTrainer, Targets
from surreal_redis.codec import Tree

__all__ = ["APPOTrainer", "APPOConfig", "VTrace", "as_received", "vtrace"]

# A ratio pi/mu counts as clipped (the rho_clipped_fraction stat) when it exceeds rho_bar by more
# than this fraction: on fresh data pi = mu up to float noise (numpy agents against the torch
# learner), which would put half the ratios a hair above rho_bar = 1. The clipping itself is exact.
# With parameters sent as float16 the stat takes pi as the agents receive it (APPOTrainer.
# _received_logp): the rounding, up to 2**-11 of each weight, moves ratios by far more than this.
RHO_CLIPPED_TOLERANCE = 1e-4


@torch.no_grad()
def as_received(tensor: torch.Tensor, wire_dtype: str) -> torch.Tensor:
    """``tensor`` as an agent loads it after the parameter wire
    (:func:`surreal_redis.hub.params.wire.to_wire`, then back to float32): a float32 tensor
    rounded through ``wire_dtype`` unless that turns a finite value infinite (then sent as it is);
    any other tensor unchanged."""
    if wire_dtype == "float32" or tensor.dtype != torch.float32:
        return tensor
    cast = tensor.to(getattr(torch, wire_dtype))
    if not torch.equal(cast.isinf(), tensor.isinf()):
        return tensor
    return cast.to(torch.float32)


class VTrace(NamedTuple):
    """:func:`vtrace`'s results, ``[T, B]`` each."""

    vs: torch.Tensor  # v_s, the value targets
    pg_advantages: torch.Tensor  # rho_s (r_s + gamma v_{s+1} - V(x_s))
    rhos: torch.Tensor  # rho_s = min(rho_bar, pi/mu)
    rho_clipped: torch.Tensor  # bool: pi/mu > rho_bar (beyond RHO_CLIPPED_TOLERANCE)


@torch.no_grad()
def vtrace(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
           truncated: torch.Tensor, log_rhos: torch.Tensor, gamma: float, lam: float = 1.0,
           rho_bar: float = 1.0, c_bar: float = 1.0) -> VTrace:
    """V-trace targets and advantages over T steps, time-major ``[T, B]`` (or ``[T]``).

    ``values[t]`` is V(x_t); ``next_values[t]`` V of the observation that followed action t (the
    true final observation where an episode ended at t, obs[t+1] otherwise, obs[T] at the chunk's
    end), as for :func:`~surreal_redis.algos.ppo.losses.compute_gae`; ``terminated`` and
    ``truncated`` are bool; ``log_rhos`` is log pi(a_t|x_t) - log mu(a_t|x_t) (target minus
    behaviour). Eq. (1) of Espeholt et al. 2018, with lambda in the traces as section 4.1 allows
    (``c_i = lambda * min(c_bar, pi/mu)``; lambda = 1 is eq. (1) itself)::

        v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V

    computed backwards as ``v_s - V(x_s) = delta_s V + gamma c_s (v_{s+1} - V(x_{s+1}))``, the sum
    ending at each episode end and at the chunk's end (``v_T = V(x_T)``).
    """
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    not_done = 1.0 - (terminated | truncated).to(rewards.dtype)
    ratios = log_rhos.exp()  # pi(a_t|x_t) / mu(a_t|x_t)
    rhos = ratios.clamp(max=rho_bar)  # rho_t = min(rho_bar, pi/mu)
    cs = lam * ratios.clamp(max=c_bar)  # c_i = lambda * min(c_bar, pi/mu)
    # delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)), V(x_{t+1}) = 0 after a termination
    deltas = rhos * (rewards + gamma * not_terminated * next_values - values)
    traces = gamma * cs * not_done  # the trace stops at episode ends
    last = torch.zeros_like(rewards[0])  # v_T - V(x_T) = 0: the chunk's end
    backwards = []
    for delta, trace in zip(deltas.flip(0), traces.flip(0)):
        # v_t - V(x_t) = delta_t V + gamma c_t (v_{t+1} - V(x_{t+1}))
        last = delta + trace * last
        backwards.append(last)
    vs_minus_v = torch.stack(backwards[::-1]) if backwards else torch.zeros_like(rewards)
    vs = values + vs_minus_v  # v_s
    # v_{s+1} inside an episode; at its end the bootstrap: V(true final obs) after a truncation,
    # V(obs[T]) at the chunk's end (after a termination it is multiplied by 0 below)
    next_vs = next_values + not_done * torch.cat([vs_minus_v[1:], torch.zeros_like(vs_minus_v[:1])])
    # section 4.2: the policy gradient's advantage rho_s (r_s + gamma v_{s+1} - V(x_s))
    pg_advantages = rhos * (rewards + gamma * not_terminated * next_vs - values)
    return VTrace(vs, pg_advantages, rhos, ratios > rho_bar * (1.0 + RHO_CLIPPED_TOLERANCE))


class APPOTrainer(PPOTrainer):
    """Learner side of APPO: :class:`PPOTrainer` with :func:`vtrace` targets for the network at the
    start of the update. The update's stats add ``rho_clipped_fraction`` (share of steps whose
    pi/mu exceeded ``vtrace_rho_bar``, pi as the agents receive it: see :meth:`_received_logp`)
    and ``rho_mean`` (mean of the truncated weights rho_t; 1 without lag)."""

    config: APPOConfig
    targets_read_logp = True  # V-trace's pi/mu
    _received_net: ActorCritic | None = None  # the network as agents receive it (wire_dtype float16)

    def _received_logp(self, flat_obs: Tree, state: LSTMState | None, episode_start: torch.Tensor,
                       actions: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
        """With ``wire_dtype`` float16, one more pass (no gradients) through a copy of the network
        whose parameters and statistics are rounded as the agents load them, so that data without
        lag reads pi/mu = 1 up to float noise; with float32, ``target_logp``."""
        if self.wire_dtype == "float32":
            return target_logp
        if self._received_net is None:
            self._received_net = copy.deepcopy(self.net).requires_grad_(False)
        net = self._received_net
        with torch.no_grad():
            for source, copied in zip(self.net.state_dict().values(), net.state_dict().values()):
                copied.copy_(as_received(source, self.wire_dtype))
            z, _ = net.core(self._features_no_grad(flat_obs, net), state, episode_start)
            steps, batch = target_logp.shape
            head = net.policy_head(z).reshape(steps + 1, batch, -1)[:steps]
            logp = net.distribution(head.reshape(steps * batch, -1)).log_prob(actions.reshape(steps * batch, *actions.shape[2:]))
        return logp.reshape(steps, batch)

    def _targets(self, rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
                 terminated: torch.Tensor, truncated: torch.Tensor, behaviour_logp: torch.Tensor,
                 target_logp: torch.Tensor, received_logp: torch.Tensor | None = None) -> Targets:
        cfg = self.config
        out = vtrace(rewards, values, next_values, terminated, truncated, target_logp - behaviour_logp,
                     cfg.gamma, cfg.gae_lambda, cfg.vtrace_rho_bar, cfg.vtrace_c_bar)
        rho_clipped = out.rho_clipped
        if received_logp is not None and received_logp is not target_logp:
            # the stat against pi as the agents receive it: the wire's rounding is no lag
            received_ratio = (received_logp - behaviour_logp).exp()
            rho_clipped = received_ratio > cfg.vtrace_rho_bar * (1.0 + RHO_CLIPPED_TOLERANCE)
        # pg_advantage lambda: v_s - V(x_s), eq. (1)'s correction (GAE(lambda) without lag)
        advantages = out.pg_advantages if cfg.pg_advantage == "one_step" else out.vs - values
        # clip_against proximal: the advantages carry rho_s = min(rho_bar, pi/mu) already, while
        # clipping pi/mu would zero the gradient of every sample lagging past the clip range
        # (decoupled PPO, Hilton et al. 2021, arXiv:2110.00641, eq. 2)
        return Targets(advantages, out.vs, {"rho_clipped_fraction": rho_clipped, "rho_mean": out.rhos},
                       proximal_logp=target_logp if cfg.clip_against == "proximal" else None)
