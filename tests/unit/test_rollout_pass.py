"""The learner's no-grad pass over a rollout runs the policy head only where something reads it."""

from __future__ import annotations

import pytest
import torch

from surreal_redis.algos.appo.trainer import APPOConfig, APPOTrainer
from surreal_redis.algos.ppo.trainer import PPOConfig, PPOTrainer
from tests.unit.test_appo import cartpole


@pytest.mark.parametrize("cls, config, head_passes", [
    (PPOTrainer, PPOConfig(hidden_sizes=(16, 16), device="cpu"), 0),  # GAE reads values only
    (PPOTrainer, PPOConfig(mode="adapt", hidden_sizes=(16, 16), device="cpu"), 1),  # the KL penalty's reference
    (APPOTrainer, APPOConfig(hidden_sizes=(16, 16), device="cpu"), 1),  # V-trace's pi/mu
])
def test_the_rollout_pass_skips_the_unread_policy_head(monkeypatch, cls, config, head_passes):
    algo, _, collector = cartpole(config, cls)
    chunks = collector.collect(8)
    calls = []
    head = algo.net.policy_head
    monkeypatch.setattr(algo.net, "policy_head", lambda z: calls.append(len(z)) or head(z))
    rollout = algo._rollout(chunks)
    assert len(calls) == head_passes
    assert rollout.ref_head.shape[:2] == rollout.logp.shape and (rollout.ref_head.shape[2] > 0) == bool(head_passes)
    monkeypatch.undo()
    stats = algo.update(chunks)  # the whole update runs with the empty reference head
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
