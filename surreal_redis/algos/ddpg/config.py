"""DDPG's hyperparameters and its exploration settings, without torch (configs load without
paying for torch's import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from surreal_redis.algos.network_config import ACTIVATION_NAMES


@dataclass(frozen=True)
class NoiseConfig:
    kind: Literal["gaussian", "ou"] = "gaussian"
    """Action noise process: independent Gaussian per step, or Ornstein-Uhlenbeck (temporally correlated)."""
    sigma: float = 0.1
    """Noise scale in units of the action half-range (the Gaussian std; the OU diffusion)."""
    ou_theta: float = 0.15
    """OU mean-reversion rate (OpenAI baselines, SURREAL)."""
    ou_dt: float = 1e-2
    """OU time step (OpenAI baselines; SURREAL used 1e-3)."""
    agent_schedule: Literal["constant", "linear"] = "constant"
    """Per-agent sigma: the same for all, or ``sigma * (agent_id + 1) / num_agents`` (see agent_sigma)."""
    eval_sigma: float = 0.05
    """Gaussian std used by the ``eval_stochastic`` mode."""
    param_noise: bool = False
    """Also perturb the actor's weights (Plappert et al. 2018), see AdaptiveParamNoise."""
    param_initial_sigma: float = 0.1
    """Initial std of the weight perturbation (baselines AdaptiveParamNoiseSpec.initial_stddev)."""
    param_target_distance: float = 0.2
    """Wanted RMS distance between perturbed and clean actions, in units of the action half-range."""
    param_adapt_coef: float = 1.01
    """Factor by which the weight std grows or shrinks at each adaptation (baselines: 1.01)."""
    param_adapt_every: int = 50
    """Training acts between adaptations, each followed by a fresh perturbation (baselines: 50)."""

    def __post_init__(self) -> None:
        for name in ("sigma", "eval_sigma", "param_initial_sigma", "param_target_distance"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.ou_theta <= 0 or self.ou_dt <= 0:
            raise ValueError(f"ou_theta and ou_dt must be > 0, got {self.ou_theta}, {self.ou_dt}")
        if self.param_adapt_coef <= 1.0:
            raise ValueError(f"param_adapt_coef must be > 1, got {self.param_adapt_coef}")
        if self.param_adapt_every < 1:
            raise ValueError(f"param_adapt_every must be >= 1, got {self.param_adapt_every}")


@dataclass(frozen=True)
class DDPGConfig:
    """DDPG hyperparameters; names and defaults follow CleanRL's ``ddpg_continuous_action.py``. The
    batch, n-step returns, replay and replay ratio are the shared ``off_policy`` section's."""

    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    """Polyak factor of the soft target update: ``target <- (1 - tau) target + tau online``."""
    target_update: Literal["soft", "hard"] = "soft"
    """``soft``: Polyak averaging after every update; ``hard``: copy every ``hard_update_every``."""
    hard_update_every: int = 500
    """Updates between hard target copies (SURREAL's default interval)."""
    policy_frequency: int = 2
    """Critic updates per actor update (and target update), as CleanRL's ``policy_frequency``."""
    actor_hidden: tuple[int, ...] = (256, 256)
    critic_hidden: tuple[int, ...] = (256, 256)
    activation: Literal["elu", "relu", "tanh"] = "relu"
    actor_max_grad_norm: float | None = None
    """Clip the actor gradient to this global norm (None: no clipping)."""
    critic_max_grad_norm: float | None = None
    """Clip the critic gradient to this global norm (None: no clipping)."""
    critic_l2: float = 0.0
    """L2 weight decay of the critic (Lillicrap et al. used 1e-2)."""
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    normalize_obs: bool = False
    """Whiten non-image observations with a running z-filter (updated by the learner)."""
    obs_clip: float = 10.0
    device: str = "auto"
    """Learner device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    compile: bool | Literal["auto"] = False
    """Capture the critic and actor losses (forward and backward) with ``torch.compile``, as
    ``sac.compile`` does: on CUDA ``mode="reduce-overhead"`` (CUDA graphs), on CPU inductor's
    default; the same update up to float rounding. ``off``/false: eager. ``auto``: on CUDA only. A
    compiler failure logs one warning and runs eagerly. Off by default: on CPU it measured no faster
    (docs/benchmarks.md); on a GPU it has not been measured yet."""

    def __post_init__(self) -> None:
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile must be true, false or 'auto', got {self.compile!r}")
        if self.activation not in ACTIVATION_NAMES:
            raise ValueError(f"activation must be one of {list(ACTIVATION_NAMES)}, got {self.activation!r}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 < self.tau <= 1.0:
            raise ValueError(f"need gamma in [0, 1] and tau in (0, 1], got {self.gamma} and {self.tau}")
        for name in ("hard_update_every", "policy_frequency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("actor_max_grad_norm", "critic_max_grad_norm"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {getattr(self, name)}")
