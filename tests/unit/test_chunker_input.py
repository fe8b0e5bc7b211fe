"""ChunkBuffer.add's per-step checks (kept cheap: shapes and extras keys against the first
step's) still name the bad value."""

import numpy as np
import pytest

from surreal_redis.hub.experience.chunker import ChunkBuffer

N = 3


def step(buffer, **changes):
    args = {"obs": np.zeros((N, 2), np.float32), "actions": np.zeros(N, np.int64), "rewards": np.zeros(N, np.float32),
            "terminated": np.zeros(N, bool), "truncated": np.zeros(N, bool), "final_obs": None,
            "extras": {"logp": np.zeros(N, np.float32)}, "policy_version": 1}
    args.update(changes)
    return buffer.add(**args)


def test_each_step_is_checked_against_the_first():
    buffer = ChunkBuffer(0, 4, 4096, 512, 256)
    step(buffer)
    step(buffer, extras={"logp": np.zeros(N, np.float32), "initial_state": {"h": np.zeros((N, 2))}})  # optional
    step(buffer, policy_version=np.full(N, 2))
    with pytest.raises(ValueError, match=r"extras keys \['value'\] differ from the first step's \['logp'\]"):
        step(buffer, extras={"value": np.zeros(N, np.float32)})
    with pytest.raises(ValueError, match=r"extras\['logp'\] has shape \(3, 1\), expected \(3,\)"):
        step(buffer, extras={"logp": np.zeros((N, 1), np.float32)})
    with pytest.raises(ValueError, match=r"actions has shape \(2,\), expected \(3,\)"):
        step(buffer, actions=[0, 1])
    with pytest.raises(ValueError, match=r"policy_version has shape \(2,\), expected \(3,\)"):
        step(buffer, policy_version=np.ones(2, np.int64))
    with pytest.raises(ValueError, match="envs \\[1\\] ended but final_obs is None"):
        step(buffer, terminated=np.array([False, True, False]))
