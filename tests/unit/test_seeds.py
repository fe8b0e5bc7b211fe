"""Agents' and evaluators' random streams: independent (numpy SeedSequence children), reproducible."""

import numpy as np
import pytest

from surreal_redis import evaluator as evaluator_module
from surreal_redis.agent import Agent
from surreal_redis.config import load_config
from surreal_redis.evaluator import Evaluator
from surreal_redis.runtime import StopFlag
from surreal_redis.seeds import (
    agent_seeds,
    agent_warmup_seed,
    eval_episode_seed,
    evaluator_seeds,
    final_episode_seed,
    stream_seed,
)

AGENTS = 24  # the collision needed 21 or more agents at experiment.seed 0


def config(seed: int = 0):
    return load_config("smoke", [f"experiment.seed={seed}", "agent.inference=numpy", f"agent.num_agents={AGENTS}"])


def first_draws(seed: int) -> np.ndarray:
    """What a numpy generator seeded ``seed`` draws first (gymnasium seeds an env's np_random so)."""
    return np.random.default_rng(seed).random(8)


def env_seeds(agent: Agent) -> list[int]:
    return [agent.seed + i for i in range(agent.num_envs)]


def test_an_agents_policy_draws_apart_from_its_envs_and_reproducibly(fake_redis):
    stop = StopFlag(install_handlers=False)
    agent = Agent(config(), fake_redis, 0, stop)
    again = Agent(config(), fake_redis, 0, stop)
    other = Agent(config(), fake_redis, 1, stop)
    draws = agent.policy._rng.random(8)
    assert not any(np.array_equal(draws, first_draws(seed)) for seed in env_seeds(agent))  # env 0 shared it
    assert np.array_equal(again.policy._rng.random(8), draws) and env_seeds(again) == env_seeds(agent)
    assert not np.array_equal(other.policy._rng.random(8), draws)
    assert not set(env_seeds(other)) & set(env_seeds(agent))
    assert Agent(config(seed=1), fake_redis, 0, stop).seed != agent.seed


def test_eval_episodes_never_replay_an_agents_env_seeds(fake_redis, monkeypatch):
    cfg = config()
    stop = StopFlag(install_handlers=False)
    agents = [Agent(cfg, fake_redis, agent_id, stop) for agent_id in range(AGENTS)]
    played: list[int] = []

    def play(env, policy, mode, seed, stop=None):
        played.append(seed)
        return 0.0, 1

    monkeypatch.setattr(evaluator_module, "play_episode", play)
    evaluator = Evaluator(cfg, fake_redis, stop)
    for version in (1, 2, 3):
        evaluator._evaluate(version)
    assert len(played) == 3 * cfg.eval.episodes == len(set(played))
    taken = {seed for agent in agents for seed in env_seeds(agent)}
    assert not taken & set(played)  # seed 0: agent 20's envs were the eval's episodes
    assert not taken & {evaluator_seeds(0, 0).envs, evaluator_seeds(0, 0).policy}


def test_the_streams_are_seedsequence_children():
    root = np.random.SeedSequence(7)
    agent_3 = root.spawn(1)[0]  # spawn key (0,): the agents' role
    child = agent_3.spawn(4)[3].spawn(2)
    assert agent_seeds(7, 3).envs == int(child[0].generate_state(1, np.uint64)[0] % (2**31 - 2**16))
    assert agent_seeds(7, 3).policy == int(child[1].generate_state(1, np.uint64)[0] % (2**31 - 2**16))
    warmup = np.random.SeedSequence(7).spawn(1)[0].spawn(4)[3].spawn(4)[3]  # spawn key (0, 3, 3)
    assert agent_warmup_seed(7, 3) == int(warmup.generate_state(1, np.uint64)[0] % (2**31 - 2**16))
    seeds = {*agent_seeds(7, 3), agent_warmup_seed(7, 3), *evaluator_seeds(7, 3), eval_episode_seed(7, 3, 0),
             final_episode_seed(7, 0)}
    assert len(seeds) == 7 and all(0 <= s < 2**31 for s in seeds)
    assert stream_seed(-1, 0) == stream_seed(2**64 - 1, 0)  # a negative seed is taken modulo 2**64
    with pytest.raises(ValueError, match="spawn key"):
        stream_seed(0, -1)
