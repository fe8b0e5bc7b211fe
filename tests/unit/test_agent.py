"""The agent loop on fakeredis: parameter polling schedule, final-observation rows, episodes."""

import threading
import time

import numpy as np
import pytest

from surreal_redis.agent import Agent, with_final_rows
from surreal_redis.algos.registry import make_algorithm
from surreal_redis.config import load_config
from surreal_redis.envs import make_env
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeReader
from surreal_redis.runtime import StopFlag


def run_agent(fake_redis, overrides, until) -> Agent:
    config = load_config("smoke", ["hub.sender.flush_steps=8", *overrides])
    env = make_env(config.env, 0)
    algo = make_algorithm(config.with_overrides(["ppo.device=cpu"]).algo_config, env.observation_space, env.action_space)
    ParameterPublisher(fake_redis, config.run, config.hub.publisher).publish(algo.actor_params(), 0, force=True)
    stop = StopFlag(install_handlers=False)
    agent = Agent(config, fake_redis, 0, stop)
    polls = []
    fetch = agent.params.fetch

    def counting_fetch(force=False):
        polls.append(agent.num_episodes)
        return fetch(force)

    agent.params.fetch = counting_fetch
    thread = threading.Thread(target=agent.run)
    thread.start()
    deadline = time.monotonic() + 60
    while not until(agent) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set("test")
    thread.join(30)
    assert not thread.is_alive()
    agent.polls = polls
    return agent


def test_polls_by_episode_when_asked(fake_redis):
    agent = run_agent(fake_redis, ["agent.fetch_every_steps=1000000", "agent.fetch_every_episodes=2"],
                      until=lambda a: a.num_episodes >= 8)
    # one poll for the first parameters, then one per two finished episodes
    assert len(agent.polls) >= 1 + 3
    assert agent.policy.version == 1
    records = EpisodeReader(fake_redis, "smoke", start_id="0-0").read_new()
    assert len(records) >= 8 and all(r.mode == "train" and r.length > 0 for r in records)


def test_polls_by_steps_only_by_default(fake_redis):
    agent = run_agent(fake_redis, ["agent.fetch_every_steps=1000000"], until=lambda a: a.num_episodes >= 4)
    assert len(agent.polls) == 1  # the first parameters only


def test_with_final_rows_replaces_only_ended_envs():
    obs = {"x": np.zeros((3, 2)), "frames": (np.zeros((3, 4)), np.ones((3, 4)))}
    final = {1: {"x": np.full(2, 7.0), "frames": (np.full(4, 5.0), np.full(4, 6.0))}}
    out = with_final_rows(obs, final)
    assert out["x"][1].tolist() == [7, 7] and out["x"][0].tolist() == [0, 0]
    assert out["frames"][1][1].tolist() == [6] * 4 and out["frames"][0][2].tolist() == [0] * 4
    assert obs["x"][1].tolist() == [0, 0]  # the input is not modified
    assert with_final_rows(obs, {}) is None


def test_bad_agent_id_is_rejected(fake_redis):
    with pytest.raises(ValueError, match="-1"):
        Agent(load_config("smoke"), fake_redis, -1, StopFlag(install_handlers=False))


def test_an_agent_stopped_before_its_first_step_exits_cleanly(fake_redis, caplog):
    config = load_config("smoke")
    stop = StopFlag(install_handlers=False)
    agent = Agent(config, fake_redis, 0, stop)
    stop.set("test: stopped at once")
    assert agent.run() == 0
    assert agent.steps == 0 and agent.sender.stats().chunks == 0
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_an_agent_waiting_for_its_first_parameters_stops_on_a_stop_request(fake_redis):
    config = load_config("smoke")
    agent = Agent(config, fake_redis, 0, StopFlag(install_handlers=False))
    RunControl(fake_redis, config.run).request_stop("surreal-redis stop")
    assert agent.run() == 0  # no parameters were ever published: it would wait forever otherwise
    assert agent.stop.reason == "run stopping (surreal-redis stop)"
