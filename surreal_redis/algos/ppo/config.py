"""PPO's hyperparameters, without torch (configs load without paying for torch's import)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym

from surreal_redis.algos.network_config import ACTIVATION_NAMES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters; names and defaults follow CleanRL's ``ppo.py``."""

    learning_rate: float = 2.5e-4
    """Adam step size (Adam eps = 1e-5, as in CleanRL)."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over ``total_updates`` updates."""
    anneal_clip: bool = False
    """Decay ``clip_coef`` linearly to 0 over ``total_updates`` updates, as SB3's ``clip_range: lin_0.2``."""
    total_updates: int = 0
    """The annealing schedule's length in updates. 0: the run's budget, ``stop.max_env_steps //
    learner.steps_per_update`` (as CleanRL and SB3 anneal over the run's total timesteps; annealing
    then needs ``stop.max_env_steps``). A schedule that ends first stops the run there, since
    nothing more is learned at learning rate or clip range 0 (the learner warns when it starts)."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 4
    """Passes over each batch of chunks."""
    num_minibatches: int = 4
    """Minibatches per epoch: of steps, or of whole chunks when ``use_lstm``."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    mode: Literal["clip", "adapt"] = "clip"
    """``clip``: clipped surrogate (+ value clipping); ``adapt``: adaptive KL penalty
    (Schulman et al. 2017, section 4)."""
    clip_coef: float = 0.2
    """Surrogate clipping range; also the value clipping range."""
    clip_vloss: bool = True
    """Clip the value loss around the values at the start of the update (``clip`` mode only)."""
    kl_target: float = 0.01
    """``adapt``: the KL divergence the penalty coefficient steers to."""
    kl_coef_init: float = 1.0
    """``adapt``: initial penalty coefficient (beta in the paper)."""
    kl_coef_min: float = 1e-3
    kl_coef_max: float = 100.0
    kl_tolerance: float = 1.5
    """``adapt``: beta changes when KL leaves ``[kl_target / tol, kl_target * tol]`` (paper: 1.5)."""
    kl_coef_factor: float = 2.0
    """``adapt``: beta is multiplied or divided by this (paper: 2)."""
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    """Stop the epochs early once the approximate KL of an epoch's last minibatch exceeds this."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: Literal["elu", "relu", "tanh"] = "tanh"
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""
    use_lstm: bool = False
    lstm_hidden: int = 128
    normalize_obs: bool = False
    """Whiten non-image observations with a running z-filter (updated by the learner)."""
    obs_clip: float = 10.0
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (SB3 VecNormalize)."""
    reward_clip: float = 10.0
    device: str = "auto"
    """Learner device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    compile: bool | Literal["auto"] = False
    """Capture the minibatch loss (forward and backward) with ``torch.compile``: on CUDA
    ``mode="reduce-overhead"`` (CUDA graphs), on CPU inductor's default; the same update up to
    float rounding. ``off``/false: eager; ``auto``: on CUDA only (on one CPU thread a minibatch
    step measured 0.8x eager's after ~18 s of compiling at start: docs/benchmarks.md). A compiler
    failure logs one warning and runs eagerly. Off by default: not yet measured on a GPU."""

    def __post_init__(self) -> None:
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile must be true, false or 'auto', got {self.compile!r}")
        if self.mode not in ("clip", "adapt"):
            raise ValueError(f"mode must be 'clip' or 'adapt', got {self.mode!r}")
        if self.activation not in ACTIVATION_NAMES:
            raise ValueError(f"activation must be one of {list(ACTIVATION_NAMES)}, got {self.activation!r}")
        if not (isinstance(self.total_updates, int) and self.total_updates >= 0):
            raise ValueError(f"total_updates must be an int >= 0, got {self.total_updates!r}")
        if self.update_epochs < 1 or self.num_minibatches < 1:
            raise ValueError(f"update_epochs and num_minibatches must be >= 1, got "
                             f"{self.update_epochs} and {self.num_minibatches}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gamma and gae_lambda must be in [0, 1], got {self.gamma} and {self.gae_lambda}")
        if not 0.0 < self.kl_coef_min <= self.kl_coef_init <= self.kl_coef_max:
            raise ValueError(f"need 0 < kl_coef_min <= kl_coef_init <= kl_coef_max, got "
                             f"{self.kl_coef_min}, {self.kl_coef_init}, {self.kl_coef_max}")


def check_annealing(config: Any) -> None:
    """Rules across the experiment config: annealing with ``total_updates: 0`` takes its schedule
    from ``stop.max_env_steps``, which must be set then."""
    section: PPOConfig = config.algo_config
    if (section.anneal_lr or section.anneal_clip) and not section.total_updates and config.stop.max_env_steps is None:
        raise ValueError(f"{config.algo}.anneal_lr and anneal_clip need {config.algo}.total_updates >= 1 or "
                         f"stop.max_env_steps (the schedule then spans the run's budget), got neither")


def annealing_for_run(config: Any) -> PPOConfig:
    """The section with its annealing schedule for this run: ``total_updates: 0`` becomes
    ``stop.max_env_steps // learner.steps_per_update`` (at least 1); a schedule that ends before
    the run's step budget gets a one-line warning (the learner stops at its end)."""
    section: PPOConfig = config.algo_config
    if not (section.anneal_lr or section.anneal_clip):
        return section
    budget, per_update = config.stop.max_env_steps, config.learner.steps_per_update
    if not section.total_updates:
        updates = max(1, budget // per_update)
        log.info("%s anneals over %d updates: stop.max_env_steps %d / learner.steps_per_update %d",
                 config.algo, updates, budget, per_update)
        return dataclasses.replace(section, total_updates=updates)
    if budget is not None and section.total_updates < budget // per_update:
        log.warning("%s.total_updates %d ends the annealing at %d env steps, before stop.max_env_steps %d: the "
                    "run stops at the schedule's end (learning rate and clip range 0 learn nothing); set "
                    "%s.total_updates: 0 to anneal over the whole budget", config.algo, section.total_updates,
                    section.total_updates * per_update, budget, config.algo)
    return section


def ppo_action_space(action_space: gym.Space) -> tuple[bool, int]:
    """``(continuous, action_dim)`` of a space PPO acts in: Discrete (logits) or a 1-d Box
    (Gaussian means); anything else raises a ValueError naming it."""
    if isinstance(action_space, gym.spaces.Discrete):
        return False, int(action_space.n)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return True, int(action_space.shape[0])
    raise ValueError(f"PPO supports Discrete and 1-d Box action spaces, got {action_space}")


def numpy_unsupported(section: PPOConfig) -> str | None:
    """Why agents cannot act with numpy for this section (None: they can): the numpy policy runs
    PPO networks without an LSTM."""
    return "an LSTM policy" if section.use_lstm else None
