"""PPO's math as pure functions on tensors, as CleanRL's ``ppo.py`` writes it."""

from __future__ import annotations

import math

import numpy as np
import torch


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
                terminated: torch.Tensor, truncated: torch.Tensor, gamma: float,
                gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and lambda-returns over T steps (time-major: ``[T]`` or ``[T, B]``).

    ``values[t]`` is V(obs[t]); ``next_values[t]`` is V of the observation that followed action
    t: the true final observation if the episode ended at t, else obs[t+1] (obs[T] at the
    chunk's end). ``terminated``/``truncated`` are bool. Then::

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},   done = terminated | truncated

    with A_T = 0: the trace stops at episode ends and at the chunk's end, and only a terminated
    step drops the bootstrap. Returns ``(advantages, returns = advantages + values)``.
    """
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    not_done = 1.0 - (terminated | truncated).to(rewards.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values
    traces = (gamma * gae_lambda) * not_done
    last = torch.zeros_like(rewards[0])
    backwards = []
    for delta, trace in zip(deltas.flip(0), traces.flip(0)):  # one [B] step at a time, t = T-1 .. 0
        last = delta + trace * last
        backwards.append(last)
    advantages = torch.stack(backwards[::-1]) if backwards else torch.zeros_like(rewards)
    return advantages, advantages + values


def clipped_surrogate_loss(logratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """``mean(max(-A * r, -A * clip(r, 1 - eps, 1 + eps)))`` with ``r = exp(logratio)`` (PPO-clip)."""
    ratio = logratio.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()


def kl_penalty_loss(logratio: torch.Tensor, advantages: torch.Tensor, kl: torch.Tensor,
                    kl_coef: float) -> torch.Tensor:
    """Negated eq. (8) of Schulman et al. 2017: ``-mean(r * A - beta * KL[pi_old, pi])``."""
    return -(logratio.exp() * advantages).mean() + kl_coef * kl.mean()


def value_loss(values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
               clip_coef: float | None) -> torch.Tensor:
    """``0.5 * mean((V - R)^2)``; with ``clip_coef``, CleanRL's clipped form
    ``0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))``."""
    unclipped = (values - returns).square()
    if clip_coef is None:
        return 0.5 * unclipped.mean()
    clipped = old_values + (values - old_values).clamp(-clip_coef, clip_coef)
    return 0.5 * torch.max(unclipped, (clipped - returns).square()).mean()


def adapt_kl_coef(kl_coef: float, kl: float, kl_target: float, tolerance: float = 1.5,
                  factor: float = 2.0, bounds: tuple[float, float] = (1e-3, 100.0)) -> float:
    """Schulman et al. 2017, section 4: halve beta when KL < target / 1.5, double it when
    KL > target * 1.5; kept within ``bounds``."""
    if kl < kl_target / tolerance:
        kl_coef /= factor
    elif kl > kl_target * tolerance:
        kl_coef *= factor
    return min(max(kl_coef, bounds[0]), bounds[1])


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` (NaN when the returns are constant)."""
    var_returns = returns.var(unbiased=False)
    if var_returns == 0:
        return float("nan")
    return float(1.0 - (returns - values).var(unbiased=False) / var_returns)


def mean_loss_terms(infos: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The mean of each loss term over an epoch's minibatch steps (their scalar tensors read in
    one transfer, one host sync on a GPU), as ``np.mean`` of the floats. Raises FloatingPointError
    on a NaN term (the distributions skip torch's per-step argument checks that caught NaNs)."""
    keys = list(infos[0])
    values = torch.stack([info[key] for info in infos for key in keys]).tolist()
    stats = {key: float(np.mean(values[i::len(keys)])) for i, key in enumerate(keys)}
    if bad := [key for key, value in stats.items() if math.isnan(value)]:
        raise FloatingPointError(f"the update's {', '.join(bad)} is NaN: the network or its inputs hold NaNs")
    return stats
