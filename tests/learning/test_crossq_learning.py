"""CrossQ learns Pendulum-v1 in one process, as SAC does in test_sac_learning.py (the same loop,
budget and eval; SAC's numpy policy acting with CrossQ's actor)."""

from __future__ import annotations

import pytest

from surreal_redis.algos.crossq.config import CrossQConfig
from surreal_redis.algos.crossq.trainer import CrossQTrainer
from tests.learning.test_sac_learning import solve_pendulum

# CrossQ's defaults (the paper's: learning rates 1e-3, Adam beta1 0.5, policy delay 3, BatchNorm
# momentum 0.01) with SAC's 128-unit actor there and 256-unit critics. Seed 0 (2026-12-05, 2 cores
# under other jobs' load ~2.7): a deterministic eval mean of -149 after 10k steps, 82 s.
PENDULUM = CrossQConfig(actor_hidden=(128, 128), critic_hidden=(256, 256), device="cpu")


@pytest.mark.slow
def test_crossq_solves_pendulum():
    solve_pendulum(CrossQTrainer, PENDULUM)
