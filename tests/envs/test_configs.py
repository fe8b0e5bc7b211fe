"""Every shipped config loads, and where its env family is installed, its env, algorithm and
chunk check build (a config naming a setting that does not exist fails here, not in a run)."""

from __future__ import annotations

import pytest

from surreal_redis.algos.learning import make_trainer
from surreal_redis.config import load_config
from surreal_redis.envs import EnvError, make_env
from surreal_redis.learner.chunk_check import ChunkCheck
from surreal_redis.resources import resource_dir

CONFIGS = sorted(resource_dir("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds(path):
    config = load_config(path)
    try:
        env = make_env(config.env, seed=0)
    except EnvError as exc:
        if "extra" not in str(exc):
            raise
        pytest.skip(str(exc))
    section = config.with_overrides([f"{config.algo}.device=cpu"]).algo_config
    algo = make_trainer(section, env.observation_space, env.action_space)
    assert algo.iteration == 0
    ChunkCheck.for_experiment(config, env.observation_space, env.action_space)
    env.close()


def test_atari_configs_say_their_budget_unit_and_anneal():
    for name in ("ppo_pong", "ppo_breakout"):
        config = load_config(name)
        text = (resource_dir("configs") / f"{name}.yaml").read_text()
        assert "Budget unit: agent steps" in text and "40M" in text
        assert config.algo_config.anneal_lr and config.algo_config.total_updates * config.learner.steps_per_update >= 9_999_000
        assert config.env.frame_stack == 4 and config.env.atari.repeat_action_probability == 0.0
