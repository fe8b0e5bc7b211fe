"""SAC's hyperparameters, without torch (configs load without paying for torch's import)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from surreal_redis.algos.network_config import ACTIVATION_NAMES


@dataclass(frozen=True)
class SoftActorCriticConfig:
    """The settings of a squashed Gaussian actor, twin critics and a learned temperature that SAC
    and the algorithms built on it (CrossQ) share; see :class:`SACConfig`."""

    gamma: float = 0.99
    """Discount of the soft Bellman target (and of the n-step returns)."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor (CleanRL's ``policy_lr``, SB3's ``learning_rate``)."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics (SB3's ``learning_rate``; CleanRL's ``q_lr`` is 1e-3)."""
    alpha_lr: float = 3e-4
    """Adam learning rate of ``log_alpha`` with ``autotune`` (SB3's ``learning_rate``; CleanRL uses ``q_lr``)."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of the actor's torso (the mean and log-std heads follow it)."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of each of the two critics."""
    activation: Literal["elu", "relu", "tanh"] = "relu"
    """Activation between hidden layers: relu, tanh or elu."""
    policy_frequency: int = 2
    """Every this many critic updates, this many actor (and temperature) steps on the same batch:
    CleanRL's delayed actor update that compensates the delay; 1 steps the actor with every critic
    step, as the paper and SB3 do."""
    autotune: bool = True
    """Learn the temperature alpha toward ``target_entropy`` (arXiv:1812.05905, section 5); false
    keeps ``alpha`` fixed."""
    init_alpha: float = 1.0
    """Initial temperature with ``autotune`` (CleanRL's ``log_alpha = 0``; SB3's ``ent_coef='auto'``)."""
    alpha: float = 0.2
    """The fixed temperature without ``autotune`` (CleanRL's ``alpha``; SB3's numeric ``ent_coef``)."""
    target_entropy: float | None = None
    """Entropy the temperature aims for, in nats of the scaled action; None means ``-|A|``, minus
    the number of action dimensions (CleanRL, SB3)."""
    log_std_min: float = -5.0
    """Lower bound of the policy's log-std: CleanRL's ``LOG_STD_MIN`` (SB3 clamps at -20)."""
    log_std_max: float = 2.0
    """Upper bound of the policy's log-std: CleanRL's ``LOG_STD_MAX`` (SB3's too). The raw head
    output is squashed into the bounds by ``min + (max - min) * (tanh(x) + 1) / 2`` (CleanRL,
    from SpinningUp / Denis Yarats), not clamped."""
    normalize_obs: bool = False
    """Whiten non-image observations with a running z-filter (updated by the learner)."""
    obs_clip: float = 10.0
    """Clip whitened observations to ``[-obs_clip, obs_clip]``."""
    device: str = "auto"
    """Learner device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATION_NAMES:
            raise ValueError(f"activation must be one of {list(ACTIVATION_NAMES)}, got {self.activation!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"need gamma in [0, 1], got {self.gamma}")
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha", "obs_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.policy_frequency < 1:
            raise ValueError(f"policy_frequency must be >= 1, got {self.policy_frequency}")
        for name in ("actor_hidden", "critic_hidden"):
            if any(size < 1 for size in getattr(self, name)):
                raise ValueError(f"{name} sizes must be >= 1, got {list(getattr(self, name))}")
        if self.target_entropy is not None and not math.isfinite(self.target_entropy):
            raise ValueError(f"target_entropy must be finite or null, got {self.target_entropy}")
        if not (math.isfinite(self.log_std_min) and math.isfinite(self.log_std_max)
                and self.log_std_min < self.log_std_max):
            raise ValueError(f"log_std_min must be below log_std_max (both finite), got "
                             f"{self.log_std_min} and {self.log_std_max}")


@dataclass(frozen=True)
class SACConfig(SoftActorCriticConfig):
    """SAC hyperparameters (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905); names and
    defaults follow CleanRL's ``sac_continuous_action.py``, the one learning rate SB3's ``SAC``. The
    batch, n-step returns, replay and replay ratio are the shared ``off_policy`` section's."""

    tau: float = 0.005
    """Polyak factor of the critic targets: ``target <- (1 - tau) target + tau online``."""
    target_network_frequency: int = 1
    """Critic updates between Polyak steps of the target critics (CleanRL; SB3's ``target_update_interval``)."""
    compile: bool | Literal["auto"] = False
    """Capture the update with ``torch.compile``: on CUDA ``mode="reduce-overhead"`` (CUDA graphs),
    on CPU inductor's default; the same update up to float rounding (the same noise draws).
    ``off``/false: eager. ``auto``: on CUDA only (on one CPU thread the compiled update measured
    no faster, and compiling costs tens of seconds of start-up: docs/benchmarks.md). A compiler
    failure logs one warning and runs eagerly. Off by default: not yet measured on a GPU."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile must be true, false or 'auto', got {self.compile!r}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"need tau in (0, 1], got {self.tau}")
        if self.target_network_frequency < 1:
            raise ValueError(f"target_network_frequency must be >= 1, got {self.target_network_frequency}")


def numpy_unsupported(section: SoftActorCriticConfig) -> str | None:
    """None: the numpy actor runs every setting here and every observation the encoders take."""
    return None
