import random

import numpy as np
import pytest
import torch

from surreal_redis.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager


def make(tmp_path, **kw):
    return CheckpointManager(tmp_path / "checkpoints", CheckpointConfig(min_interval_s=0, **kw))


def test_save_load_round_trip_with_rng_state(tmp_path):
    mgr = make(tmp_path)
    net = torch.nn.Linear(3, 2)
    state = {"model": net.state_dict(), "iteration": 5, "torch_rng": torch.get_rng_state(),
             "numpy_rng": np.random.default_rng(1).bit_generator.state, "py_rng": random.Random(2).getstate()}
    path = mgr.save(state, 5)
    loaded = CheckpointManager.load(path)
    assert loaded["iteration"] == 5
    assert torch.equal(loaded["model"]["weight"], net.weight.detach())
    restored = np.random.default_rng()
    restored.bit_generator.state = loaded["numpy_rng"]
    assert restored.random() == np.random.default_rng(1).random()
    assert not list(mgr.directory.glob("*.tmp"))


def test_keep_last_and_best_queue(tmp_path):
    mgr = make(tmp_path, keep_last=2, keep_best=1)
    for it in (10, 20, 30, 40):
        mgr.save({"i": it}, it)
        if it == 20:
            assert mgr.record_score(20, 100.0)
    assert mgr.iterations() == [20, 30, 40]  # 20 survives as the best
    assert mgr.resolve("best") == mgr.path_for(20)
    assert mgr.resolve("latest") == mgr.path_for(40)
    assert not mgr.record_score(30, 50.0)
    assert mgr.record_score(40, 200.0)
    mgr.save({"i": 50}, 50)
    assert mgr.iterations() == [40, 50]


def test_due_respects_every_and_interval(tmp_path):
    mgr = CheckpointManager(tmp_path, CheckpointConfig(every_updates=10, min_interval_s=3600))
    assert not mgr.due(5) and mgr.due(10)
    mgr.save({}, 10)
    assert not mgr.due(20)  # too soon


def test_errors_name_the_problem(tmp_path):
    mgr = make(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        mgr.resolve("latest")
    with pytest.raises(CheckpointError, match="iteration 7"):
        mgr.resolve(7)
    with pytest.raises(CheckpointError, match="latest, best"):
        mgr.resolve("newest")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.pt"):
        CheckpointManager.load(bad)
    with pytest.raises(ValueError, match="every_updates"):
        CheckpointConfig(every_updates=0)


def test_unsafe_pickle_is_refused(tmp_path):
    import os
    path = tmp_path / "evil.pt"
    torch.save({"x": os.system}, path)  # a callable is outside the weights-only allow-list
    with pytest.raises(CheckpointError):
        CheckpointManager.load(path)
