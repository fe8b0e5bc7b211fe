"""The captured SAC and DDPG updates and PPO minibatch loss (``compile``) against the eager ones,
and the setting. The compiles run in a child process (capture_check.py): torch._dynamo stays out of this
one, except in the fallback test."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.algos.capture import capture_wanted
from surreal_redis.algos.ddpg.config import DDPGConfig
from surreal_redis.algos.ddpg.trainer import DDPGTrainer
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.algos.sac.trainer import SACTrainer
from surreal_redis.chunks import TransitionBatch
from surreal_redis.configtools import ConfigError, from_dict


def check(algo: str, updates: int) -> dict:
    """capture_check.py's report for ``algo`` with backend aot_eager (the capture's graphs without
    inductor's tens of seconds of C++ compiling), in a child process."""
    script = Path(__file__).with_name("capture_check.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                                     os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script), "aot_eager", str(updates), algo], capture_output=True,
                          text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_captured_sac_update_makes_the_eager_updates():
    """Six updates compiled give the eager updates' weights, stats and TD errors, with and without
    a learned temperature, and the compiled functions did run (graphs made, no fallback)."""
    report = check("sac", 6)
    assert report["graphs"] >= 5  # critic, actor and temperature losses; critic and actor without
    for case in ("autotune", "fixed_alpha"):
        result = report[case]
        assert result["active"] and result["same_keys"], result
        assert result["moved"] > 1e-4, result  # the updates did change the weights
        assert result["weights"] <= 1e-6 and result["stats"] <= 1e-6 and result["td"] <= 1e-6, result


@pytest.mark.slow
def test_captured_ddpg_update_makes_the_eager_updates():
    """Six DDPG updates compiled give the eager updates' weights (targets included), stats and TD
    errors: the delayed actor with soft targets, and an actor step each update with clipped
    gradients, critic L2 and hard target copies; the compiled functions did run."""
    report = check("ddpg", 6)
    assert report["graphs"] >= 2, report  # the critic and the actor losses
    for case in ("delayed_soft", "clipped_hard"):
        result = report[case]
        assert result["active"] and result["same_keys"], result
        assert result["moved"] > 1e-4, result
        # aot_eager runs the graphs on the eager kernels: the same bits
        assert result["weights"] == result["stats"] == result["td"] == 0.0, result


@pytest.mark.slow
def test_captured_ppo_minibatch_loss_makes_the_eager_updates():
    """Three PPO updates (2 epochs of 3 minibatches, the clip range annealed) with the minibatch
    loss compiled give the eager weights and stats, discrete (clip) and continuous (adapt: the KL
    coefficient moves): one graph each, the moving coefficients passed as tensors."""
    report = check("ppo", 3)
    assert report["graphs"] == 2, report  # no recompile as the clip range and KL coefficient move
    for case in ("discrete", "continuous_adapt"):
        result = report[case]
        assert result["active"] and result["same_keys"], result
        assert result["moved"] > 1e-4, result
        assert result["weights"] <= 1e-6 and result["stats"] <= 1e-6, result


@pytest.mark.parametrize("config_class", [SACConfig, DDPGConfig])
def test_compile_setting_reads_yaml_off_on_and_auto(config_class):
    """YAML's off/on are booleans: ``compile: off``, ``on`` and ``auto`` all load; anything else is
    refused on one line naming the value; auto captures on CUDA only."""
    assert config_class().compile is False
    for value, expected in ((False, False), (True, True), ("auto", "auto")):
        assert from_dict(config_class, {"compile": value}).compile == expected
    with pytest.raises(ConfigError, match="'sometimes'"):
        from_dict(config_class, {"compile": "sometimes"})
    with pytest.raises(ValueError, match="^compile must be true, false or 'auto', got 'sometimes'$"):
        config_class(compile="sometimes")
    assert capture_wanted("auto", torch.device("cuda")) and not capture_wanted("auto", torch.device("cpu"))
    assert capture_wanted(True, torch.device("cpu")) and not capture_wanted(False, torch.device("cuda"))


def broken_backend(graph, example_inputs):
    raise RuntimeError("no compiler here")


def small_trainer(algo: str, compile_: bool, backend) -> SACTrainer | DDPGTrainer:
    """A SAC or DDPG learner of 8-unit networks on 3-d observations and 2-d actions, from seed 0."""
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    actions = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    torch.manual_seed(0)
    if algo == "sac":
        config = SACConfig(actor_hidden=(8,), critic_hidden=(8,), compile=compile_, device="cpu")
        return SACTrainer(config, space, actions, seed=1, compile_backend=backend)
    ddpg = DDPGConfig(actor_hidden=(8,), critic_hidden=(8,), policy_frequency=1, compile=compile_, device="cpu")
    return DDPGTrainer(ddpg, space, actions, compile_backend=backend)


@pytest.mark.parametrize("algo", ["sac", "ddpg"])
@pytest.mark.parametrize("backend", ["no-such-backend", broken_backend])
def test_a_compiler_failure_falls_back_to_the_eager_update(algo, backend, caplog):
    """An unknown backend, or one that fails on the first call: one warning, and the update is the
    eager one (the warm-up left no gradient and drew no noise). Imports torch._dynamo here."""
    eager, failing = (small_trainer(algo, compile_, backend) for compile_ in (False, True))
    assert failing._capture is not None
    rng = np.random.default_rng(0)
    batch = TransitionBatch(obs=rng.uniform(-1, 1, (8, 3)).astype(np.float32),
                            actions=rng.uniform(-1, 1, (8, 2)).astype(np.float32),
                            rewards=rng.normal(size=8).astype(np.float32),
                            next_obs=rng.uniform(-1, 1, (8, 3)).astype(np.float32),
                            discounts=np.full(8, 0.99, np.float32), weights=np.ones(8, np.float32),
                            indices=np.arange(8))
    with caplog.at_level(logging.WARNING, logger="surreal_redis.algos.capture"):
        for _ in range(2):
            expected, got = eager.update(batch), failing.update(batch)
            assert got[0] == expected[0]
    warnings = [r.message.split(":")[0] for r in caplog.records if r.name == "surreal_redis.algos.capture"]
    assert warnings == ["compiling the update failed, running it eagerly"]
    assert not failing._capture.active
    for a, b in zip([*eager.actor.parameters(), *eager.critic.parameters()],
                    [*failing.actor.parameters(), *failing.critic.parameters()]):
        assert torch.equal(a, b)
