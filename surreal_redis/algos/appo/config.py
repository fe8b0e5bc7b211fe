"""APPO's hyperparameters, without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from surreal_redis.algos.ppo.config import PPOConfig
from surreal_redis.configtools import ConfigError, build_dataclass

REMOVED_KEYS = {
    "min_epochs": "removed on 2026-12-05: every update runs all update_epochs epochs, so each sample takes "
                  "part in update_epochs gradient passes whatever the agents' speed; delete the key",
}
"""Keys older configs may hold, with why they are gone: loading one is an error that says so."""


@dataclass(frozen=True)
class APPOConfig(PPOConfig):
    """APPO: PPO's settings, with V-trace (Espeholt et al. 2018, arXiv:1802.01561, section 4.1)
    in place of GAE. ``gae_lambda`` is V-trace's lambda (``c_i = lambda * min(c_bar, pi/mu)``);
    ``gamma`` its discount. Without lag (pi = mu) and with both levels >= 1 the value targets are
    GAE's lambda-returns.

    Sample reuse: every update runs all ``update_epochs`` epochs on its batch, so each sample
    takes part in ``update_epochs`` gradient passes whatever the agents' speed (PPO's K epochs,
    Schulman et al. 2017, arXiv:1707.06347, Algorithm 1); the agents' lead is bounded by
    backpressure (``hub.sender.max_lag``) and the FIFO drops data past
    ``replay.fifo.max_policy_lag``, so agents produce what the learner will use. Until 2026-12-05
    ``min_epochs`` let an update stop early once the next batch arrived, so the faster the agents,
    the less each sample was reused (docs/benchmarks.md)."""

    @classmethod
    def config_from_dict(cls, data: dict[str, Any], where: str = "") -> APPOConfig:
        """:func:`~surreal_redis.configtools.build_dataclass`, after a one-line error for a key
        of :data:`REMOVED_KEYS`."""
        for key, why in REMOVED_KEYS.items():
            if key in data:
                name = f"{where}.{key}" if where else key
                raise ConfigError(f"config key {name!r} was {why}")
        return build_dataclass(cls, data, where)
    clip_against: Literal["behaviour", "proximal"] = "behaviour"
    """What the clipped surrogate's ratio is taken against: ``behaviour``, the agents' mu (Sample
    Factory's APPO), or ``proximal``, the learner's own policy at the start of the update
    (decoupled PPO, Hilton et al. 2021, arXiv:2110.00641, eq. 2; IMPACT's clipping against a
    target network, Luo et al. 2020, arXiv:1912.00167, with the target refreshed every update),
    the lag's weight rho being in the advantages already, so lagged samples keep their gradient.
    With every sample in all ``update_epochs`` passes, ``proximal`` learned HalfCheetah far better
    (the shipped configs set it; docs/benchmarks.md, 2026-12-05); with the former adaptive epochs
    ``behaviour`` had."""
    pg_advantage: Literal["one_step", "lambda"] = "lambda"
    """The policy-gradient advantage under the clipped surrogate: ``one_step``, the paper's
    rho_s (r_s + gamma v_{s+1} - V(x_s)) (Espeholt et al. 2018, section 4.2; Sample Factory's and
    RLlib's APPO), which without lag is GAE's advantage with the next step's weighted by 1 instead
    of lambda; or ``lambda``, v_s - V(x_s) = sum_t gamma^{t-s} (prod c_i) rho_t delta_t (eq. 1's
    correction), which without lag is GAE(lambda)'s advantage exactly, so APPO on grants is PPO.
    ``lambda`` is the default: one_step's next-step term weighs the learner's value error at full
    gamma, and on HalfCheetah it learned half as well (docs/benchmarks.md)."""
    vtrace_rho_bar: float = 1.0
    """rho_bar: truncates the importance weight rho_t = min(rho_bar, pi/mu) of each TD error and of
    the policy-gradient advantage; it sets the fixed point the value function learns (larger: nearer
    the value of the learner's policy pi, with more variance; towards 0: the agents' mu). The
    paper's default 1."""
    vtrace_c_bar: float = 1.0
    """c_bar: truncates the trace coefficients c_i = lambda * min(c_bar, pi/mu), which bound how far
    a TD error is carried back (speed of contraction, not the fixed point; the paper's default 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pg_advantage not in ("one_step", "lambda"):
            raise ValueError(f"pg_advantage must be 'one_step' or 'lambda', got {self.pg_advantage!r}")
        if self.clip_against not in ("behaviour", "proximal"):
            raise ValueError(f"clip_against must be 'behaviour' or 'proximal', got {self.clip_against!r}")
        for name in ("vtrace_rho_bar", "vtrace_c_bar"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        # V-trace's operator contracts to its fixed point for c_bar <= rho_bar (Espeholt et al. 2018, Thm. 1)
        if self.vtrace_c_bar > self.vtrace_rho_bar:
            raise ValueError(f"vtrace_c_bar must be <= vtrace_rho_bar, got {self.vtrace_c_bar} > {self.vtrace_rho_bar}")
