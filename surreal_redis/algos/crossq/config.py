"""CrossQ's hyperparameters, without torch: SAC's shared settings with the paper's defaults, plus
its BatchNorm and Adam settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from surreal_redis.algos.sac.config import SoftActorCriticConfig


@dataclass(frozen=True)
class CrossQConfig(SoftActorCriticConfig):
    """CrossQ hyperparameters (Bhatt et al., "CrossQ: Batch Normalization in Deep Reinforcement
    Learning for Greater Sample Efficiency and Simplicity", ICLR 2024): SAC's actor, twin critics
    and temperature, without target networks, the critics batch-normalized. Defaults are the
    paper's (its appendix's hyperparameter table) but for the critics' width, chosen for CPU
    learners. The batch (the paper's 256), n-step returns (1), replay and replay ratio (UTD 1)
    are the shared ``off_policy`` section's."""

    actor_lr: float = 1e-3
    """Adam learning rate of the actor (the paper's 1e-3 for every network)."""
    critic_lr: float = 1e-3
    """Adam learning rate of the twin critics (the paper's 1e-3)."""
    alpha_lr: float = 1e-3
    """Adam learning rate of ``log_alpha`` with ``autotune`` (the paper's 1e-3)."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of each of the two critics. The paper widens its critics to 2048
    (SB3-contrib's default: 1024); 256 costs a CPU learner what SAC's update with its 256-wide
    critics and their targets costs, 512 twice that (docs/benchmarks.md). On a GPU,
    ``[2048, 2048]`` is the paper's."""
    policy_frequency: int = 3
    """Every this many critic updates, one actor (and temperature) step: the paper's policy delay
    3 (TD3's delayed policy update; SB3-contrib's ``policy_delay``). Unlike SAC's setting, the
    skipped actor steps are not made up."""
    bn_momentum: float = 0.01
    """Weight of each training batch in the BatchNorm layers' running statistics, in torch's
    convention ``running <- (1 - m) running + m batch``: the paper's 0.99 (Flax's convention,
    the weight of the old statistics), SB3-contrib's 0.01."""
    adam_beta1: float = 0.5
    """Adam's beta1 for the actor and the critics (the paper's 0.5, beta2 stays 0.999); the
    temperature's Adam keeps 0.9."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.bn_momentum) and 0.0 < self.bn_momentum <= 1.0):
            raise ValueError(f"bn_momentum must be in (0, 1], got {self.bn_momentum}")
        if not (math.isfinite(self.adam_beta1) and 0.0 <= self.adam_beta1 < 1.0):
            raise ValueError(f"adam_beta1 must be in [0, 1), got {self.adam_beta1}")
