"""Agent and learner in-process against real redis-server processes: outages, resume, refill."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from surreal_redis.agent import Agent
from surreal_redis.algos.learning import make_trainer
from surreal_redis.config import load_config
from surreal_redis.connection import RedisSettings, connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server
from surreal_redis.envs import make_env
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.hub.run.control import RunControl
from surreal_redis.keys import RunKeys
from surreal_redis.learner.loop import Learner
from surreal_redis.runtime import StopFlag

pytestmark = pytest.mark.integration


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def run_learner_with_agent(learner: Learner, config, client) -> None:
    """Run ``learner`` to its stop condition with one agent (id 0) stepping in a thread."""
    agent_stop = StopFlag(install_handlers=False)
    agent = Agent(config, client, 0, agent_stop)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        assert learner.run() == 0
    finally:
        agent_stop.set("learner done")
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_agent_rides_out_a_redis_outage(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    port = 20000 + int(time.time() * 1000) % 20000
    server = EmbeddedRedis(port=port).start()
    url = server.url
    config = load_config("smoke", [f"redis.url={url}", "hub.sender.flush_steps=8", "hub.sender.max_wait_s=2",
                                   "agent.heartbeat_every_s=0.2", f"experiment.root={tmp_path}",
                                   "learner.on_policy_sync=free"])  # no learner grants steps here
    client = connect(url, RedisSettings(socket_timeout=1, connect_timeout=1, retries=0))
    env = make_env(config.env, 0)
    algo = make_trainer(config.with_overrides(["ppo.device=cpu"]).algo_config, env.observation_space, env.action_space)
    ParameterPublisher(client, config.run, config.hub.publisher).publish(algo.actor_params(), 0, force=True)
    stop = StopFlag(install_handlers=False)
    agent = Agent(config, client, 0, stop)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            agent.run()
        except BaseException as exc:  # the test fails below if the agent crashed
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    inbox = RunKeys(config.run).shard(0).inbox  # no learner here: the batches stay queued
    try:
        wait_until(lambda: client.llen(inbox) > 5, 30, "experience before the outage")
        server.stop()  # Redis goes away (and with it everything: no persistence)
        steps_at_outage = agent.steps
        time.sleep(3)
        assert thread.is_alive() and not errors, errors
        server = EmbeddedRedis(port=port).start()  # same URL again
        wait_until(lambda: client.llen(inbox) > 3, 60, "experience after Redis came back")
        assert agent.steps > steps_at_outage
    finally:
        stop.set("test over")
        thread.join(timeout=30)
        server.stop()
    assert not errors, errors
    assert not thread.is_alive()
    assert agent.sender.stats().chunks > 0


def test_off_policy_learner_resumes_and_refills_replay(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    with EmbeddedRedis(maxmemory="256mb") as server:
        overrides = [f"redis.url={server.url}", f"experiment.root={tmp_path}", "tracking.enabled=false",
                     "ddpg.device=cpu", "off_policy.learning_starts=200", "stop.max_env_steps=800",
                     "checkpoint.every_updates=50", "checkpoint.min_interval_s=0", "hub.sender.max_lag=0",
                     "experiment.name=ddpg_resume"]
        config = load_config("ddpg_pendulum", overrides)
        client = connect(server.url)
        first = Learner.from_config(config, client, StopFlag(install_handlers=False))
        run_learner_with_agent(first, config, client)
        assert first.env_steps >= 800 and first.algo.iteration > 0
        checkpoints = first.checkpoints.iterations()
        assert checkpoints and checkpoints[-1] == first.algo.iteration

        resumed = Learner.from_config(config, client, StopFlag(install_handlers=False), resume="latest")
        assert resumed.algo.iteration == first.algo.iteration
        assert resumed.env_steps == first.env_steps
        # the hub's retained window is back in replay (n-step tails of unfinished episodes aside)
        assert len(resumed.feed.replay) >= 0.9 * first.feed.transitions
        for name, value in first.algo.actor_params().items():
            assert (resumed.algo.actor_params()[name] == value).all(), name


def test_learner_sets_aside_chunks_from_another_env_and_goes_on(tmp_path):
    """An agent of the wrong env (Pendulum's 3-float observations in a CartPole run) is
    dead-lettered; the learner keeps training on the good agent's data."""
    from surreal_redis.hub.experience.sender import ExperienceSender

    if find_redis_server() is None:
        pytest.skip("no redis-server")
    with EmbeddedRedis(maxmemory="256mb") as server:
        config = load_config("smoke", [f"redis.url={server.url}", f"experiment.root={tmp_path}",
                                       "tracking.enabled=false", "ppo.device=cpu", "stop.max_env_steps=1500"])
        client = connect(server.url)
        learner = Learner.from_config(config, client, StopFlag(install_handlers=False))
        foreign = ExperienceSender(client, config.hub.sender, config.run, 7, config.redis.num_shards)
        for _ in range(config.hub.sender.flush_steps + 1):
            foreign.add(np.zeros((1, 3), np.float32), np.zeros(1, np.int64), np.zeros(1, np.float32),
                        np.zeros(1, bool), np.zeros(1, bool), extras={"logp": np.zeros(1, np.float32)})
        run_learner_with_agent(learner, config, client)
        assert learner.algo.iteration > 0
        assert learner.receiver.stats().dead >= 1
        dead = client.xrange(RunKeys(config.run).shard(0).dead)
        assert dead and dead[0][1][b"reason"] == b"unusable" and b"agent 7" in dead[0][1][b"detail"]


def test_learner_rides_out_a_redis_restart(tmp_path):
    """Redis goes away (and comes back empty): the learner backs off instead of crashing, then
    publishes again and goes on training from the agent's new experience."""
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    port = 20000 + (int(time.time() * 1000) + 7) % 20000
    server = EmbeddedRedis(port=port).start()
    config = load_config("smoke", [f"redis.url={server.url}", f"experiment.root={tmp_path}", "tracking.enabled=false",
                                   "ppo.device=cpu", "stop.max_env_steps=1000000", "learner.steps_per_update=128",
                                   "hub.sender.flush_steps=16", "hub.sender.max_wait_s=2"])
    settings = RedisSettings(socket_timeout=1, connect_timeout=1, retries=0)
    learner_stop, agent_stop = StopFlag(install_handlers=False), StopFlag(install_handlers=False)
    learner = Learner.from_config(config, connect(server.url, settings), learner_stop)
    agent = Agent(config, connect(server.url, settings), 0, agent_stop)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(learner.run()), daemon=True),
               threading.Thread(target=agent.run, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: learner.algo.iteration >= 2, 60, "updates before the outage")
        server.stop()
        time.sleep(3)
        assert threads[0].is_alive(), f"learner exited during the outage: {results}"
        updates_at_restart = learner.algo.iteration
        server = EmbeddedRedis(port=port).start()
        client = connect(server.url)
        wait_until(lambda: learner.algo.iteration >= updates_at_restart + 2, 90, "updates after Redis came back")
        wait_until(lambda: int(client.hget(RunKeys(config.run).params.meta, "version") or 0) > 0, 30,
                   "parameters published again")
    finally:
        agent_stop.set("test over")
        learner_stop.set("test over")
        for thread in threads:
            thread.join(timeout=30)
        server.stop()
    assert results == [0]


@pytest.mark.parametrize("how", ["stop request", "signal"])
def test_agent_waiting_on_backpressure_stops_at_once(tmp_path, real_redis, redis_server, how):
    """No learner reads, so the agent waits on hub.sender.max_lag (with no timeout); a stop request
    (what a DDPG learner writes when it reaches its target) or a signal still ends it at once."""
    config = load_config("smoke", [f"redis.url={redis_server.url}", "hub.sender.flush_steps=8", "hub.sender.max_lag=1",
                                   f"experiment.root={tmp_path}", "learner.on_policy_sync=free"])
    env = make_env(config.env, 0)
    algo = make_trainer(config.with_overrides(["ppo.device=cpu"]).algo_config, env.observation_space, env.action_space)
    ParameterPublisher(real_redis, config.run, config.hub.publisher).publish(algo.actor_params(), 0, force=True)
    stop = StopFlag(install_handlers=False)
    agent = Agent(config, real_redis, 0, stop)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    inbox = RunKeys(config.run).shard(0).inbox
    try:
        wait_until(lambda: real_redis.llen(inbox) >= 1, 60, "the backlog to pass max_lag")  # one flush of 2 envs
        steps = agent.steps
        time.sleep(1.0)
        assert agent.steps <= steps + config.hub.sender.flush_steps * config.env.num_envs  # it is waiting
        if how == "signal":
            stop.set("signal SIGTERM")
        else:
            RunControl(real_redis, config.run).request_stop("reached the target return")
        thread.join(timeout=10)  # without the stop watch it waits as long as the backlog stays
        assert not thread.is_alive(), "the agent did not stop while waiting on backpressure"
    finally:
        stop.set("test over")
        thread.join(timeout=30)
    assert agent.sender.stats().backpressure_wait_s > 0  # the stop ended a backpressure wait
    if how == "stop request":
        assert stop.reason == "run stopping (reached the target return)"


def test_a_killed_owner_leaves_no_embedded_redis_folder(tmp_path):
    """The process that started an embedded Redis is killed: its server stops and its temporary
    folder (socket, log) goes too."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if find_redis_server() is None:
        pytest.skip("no redis-server")
    code = ("import time; from surreal_redis.embedded import EmbeddedRedis;"
            "s = EmbeddedRedis().start(); print(s.dir, flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    folder = Path(owner.stdout.readline().strip())
    assert (folder / "redis.log").exists()
    owner.kill()
    owner.wait()
    wait_until(lambda: not folder.exists(), 10, f"{folder} to be removed")
    assert not os.path.exists(folder)


def test_a_launch_interrupted_while_starting_is_not_a_failure(tmp_path, redis_server):
    from surreal_redis.launcher import Launcher

    config = load_config("smoke", [f"experiment.root={tmp_path}", f"redis.url={redis_server.url}"])
    stop = StopFlag(install_handlers=False)
    stop.set("signal SIGINT")  # Ctrl-C before the learner published anything
    lines: list[str] = []
    launcher = Launcher(config, stop, progress=lines.append)
    assert launcher.run() == 130  # interrupted: neither finished (0) nor failed (1)
    assert lines[-1].startswith("run 'smoke' interrupted (signal SIGINT")
    learner = launcher.children[0].process
    assert learner is not None and learner.poll() is not None  # stopped, not left behind
