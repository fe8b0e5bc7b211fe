"""APPO's hyperparameters, without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from surreal_redis.algos.ppo.config import PPOConfig


@dataclass(frozen=True)
class APPOConfig(PPOConfig):
    """APPO: PPO's settings, with V-trace (Espeholt et al. 2018, arXiv:1802.01561, section 4.1)
    in place of GAE. ``gae_lambda`` is V-trace's lambda (``c_i = lambda * min(c_bar, pi/mu)``);
    ``gamma`` its discount. Without lag (pi = mu) and with both levels >= 1 the value targets are
    GAE's lambda-returns."""

    min_epochs: int | None = None
    """Epochs each update runs at least; past them, up to ``update_epochs``, the learner runs
    another epoch only while the next batch has not arrived, filling the wait with gradient steps
    instead of idling, so agents never wait on its epochs; the epochs an update gets then depend
    on how fast the agents produce (the ``losses/epochs`` metric). None: ``update_epochs`` every
    update, as PPO."""
    clip_against: Literal["behaviour", "proximal"] = "behaviour"
    """What the clipped surrogate's ratio is taken against: ``behaviour``, the agents' mu (Sample
    Factory's APPO), or ``proximal``, the learner's own policy at the start of the update
    (decoupled PPO, Hilton et al. 2021, arXiv:2110.00641), the lag's weight rho being in the
    advantages already, so lagged samples keep their gradient (on HalfCheetah ``behaviour`` learned
    better: docs/benchmarks.md)."""
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
        if self.min_epochs is not None and not (isinstance(self.min_epochs, int) and 1 <= self.min_epochs <= self.update_epochs):
            raise ValueError(f"min_epochs must be an int in 1..update_epochs ({self.update_epochs}) or None, "
                             f"got {self.min_epochs!r}")
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
