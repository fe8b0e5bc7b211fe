"""The agent loop on fakeredis: parameter polling schedule (free production), claims (lockstep
production), final-observation rows, episodes, idle time."""

import threading
import time

import numpy as np
import pytest
import redis

from surreal_redis.agent import Agent, with_final_rows
from surreal_redis.agent import loop as agent_module
from surreal_redis.algos.learning import make_trainer
from surreal_redis.config import load_config
from surreal_redis.envs import make_env
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import (
    STOP_RETRY_S,
    ExperienceSender,
    HubUnavailableError,
    SenderConfig,
)
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeReader
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.keys import ParamKeys
from surreal_redis.runtime import StopFlag


def run_agent(fake_redis, overrides, until) -> Agent:
    config = load_config("smoke", ["hub.sender.flush_steps=8", "learner.on_policy_sync=free", *overrides])
    env = make_env(config.env, 0)
    algo = make_trainer(config.with_overrides(["ppo.device=cpu"]).algo_config, env.observation_space, env.action_space)
    ParameterPublisher(fake_redis, config.run, config.hub.publisher).publish(algo.actor_params(), 0, force=True)
    stop = StopFlag(install_handlers=False)
    agent = Agent(config, fake_redis, 0, stop)
    polls = []
    fetch = agent.params.fetch

    def counting_fetch(force=False, at_least=0):
        polls.append(agent.num_episodes)
        return fetch(force, at_least)

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


# ---------------------------------------------------------------- lockstep

FLUSH = 8 * 2  # env steps per claim: flush_steps x the smoke config's 2 envs


class LockstepRun:
    """A lockstep agent (the default for PPO) in a thread, and the learner's side of the hub:
    a publisher of a real PPO's parameters and the quota."""

    def __init__(self, client, *overrides: str) -> None:
        self.client = client
        self.config = load_config("smoke", ["hub.sender.flush_steps=8", "agent.heartbeat_every_s=0.2", *overrides])
        env = make_env(self.config.env, 0)
        self.algo = make_trainer(self.config.with_overrides(["ppo.device=cpu"]).algo_config, env.observation_space,
                                   env.action_space)
        self.publisher = ParameterPublisher(client, self.config.run, self.config.hub.publisher)
        self.quota = ProductionQuota(client, self.config.run)
        self.receiver = ExperienceReceiver(client, ReceiverConfig(), self.config.run, 1)
        self.stop = StopFlag(install_handlers=False)
        self.agent = Agent(self.config, client, 0, self.stop)
        self.thread = threading.Thread(target=self.agent.run)

    def publish(self) -> int:
        return self.publisher.publish(self.algo.actor_params(), 0, force=True)

    def wait_for(self, predicate, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            assert self.thread.is_alive(), "the agent exited"
            time.sleep(0.01)

    def chunks(self) -> list:
        return [item.chunk for item in self.receiver.receive(1000, block_ms=0)]

    def finish(self) -> None:
        self.stop.set("test over")  # a waiting agent looks every CLAIM_WAIT_SLICE_S (whatever CLAIM_RECHECK_S is)
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_a_lockstep_agent_produces_what_was_granted_sends_it_at_once_then_waits_idle(fake_redis):
    run = LockstepRun(fake_redis)
    assert run.config.lockstep
    run.publish()
    run.quota.grant(1, 2 * FLUSH + 1)  # two claims and a step: a third claim goes through
    run.thread.start()
    try:
        run.wait_for(lambda: run.agent.steps == 3 * FLUSH, "three claims produced")
        time.sleep(0.5)
        assert run.agent.steps == 3 * FLUSH  # and no more: it waits
        assert run.quota.left() == (1, 1 - FLUSH) and run.agent.claimer.claimed == 0  # all it claimed went out
        first = run.chunks()  # every claimed step is in the hub, none waits in the agent's buffer
        assert len(first) == 6 and all(c.num_steps == 8 and set(c.policy_version) == {1} for c in first)
        assert sum(c.num_steps for c in first) == 3 * FLUSH

        assert run.publish() == 2  # claims of v1 are stale now; the agent must load v2 first
        run.quota.grant(2, FLUSH)
        run.wait_for(lambda: run.agent.steps == 4 * FLUSH, "the v2 claim produced")
        second = run.chunks()
        assert len(second) == 2 and all(set(c.policy_version) == {2} for c in second)
        assert run.agent.policy.version == 2
        # each chunk goes on from where the previous one of its env ended
        for env in range(2):
            ours = [c for c in first + second if c.env_index == env]
            for before, after in zip(ours, ours[1:]):
                assert np.array_equal(before.obs[-1], after.obs[0])
        run.wait_for(lambda: run.agent.idle_seconds() > 0.5, "idle time to add up")
        run.wait_for(lambda: read_agents(fake_redis, run.config.run, ttl_s=30)[0].idle_s > 0.4, "a heartbeat with idle time")
        beat = read_agents(fake_redis, run.config.run, ttl_s=30)[0]
        assert 0 < beat.idle_s <= beat.running_s and beat.idle_fraction > 0.2
    finally:
        run.finish()


def test_a_lockstep_agent_waiting_for_a_grant_stops_on_a_stop_request(fake_redis):
    run = LockstepRun(fake_redis)
    run.publish()  # nothing granted: the agent waits from its first claim on
    run.thread.start()
    run.wait_for(lambda: run.agent.idle_seconds() > 0.3, "the agent to wait")
    assert run.agent.claimer.wait_s == 0  # the wait under way counts as idle before it ends
    asked = time.monotonic()
    RunControl(fake_redis, run.config.run).request_stop("reached the target return")
    run.thread.join(10)
    assert not run.thread.is_alive() and time.monotonic() - asked < 2.0
    assert run.agent.steps == 0 and run.stop.reason == "run stopping (reached the target return)"


def test_a_waiting_lockstep_agent_wakes_on_the_grant_message_not_its_recheck(fake_redis, monkeypatch):
    """The notify channel wakes a waiting agent at once; the periodic re-claim is only a safety net."""
    monkeypatch.setattr("surreal_redis.agent.claims.CLAIM_RECHECK_S", 30.0)
    run = LockstepRun(fake_redis)
    run.publish()
    run.thread.start()
    try:
        run.wait_for(lambda: run.agent.running_seconds() > 0.3, "the agent to wait")
        run.quota.grant(1, FLUSH)
        run.wait_for(lambda: run.agent.steps == FLUSH, "the granted claim", timeout=15)
    finally:
        run.finish()


def test_a_stale_agent_downloads_only_a_version_it_may_produce_for(fake_redis):
    """A waiting agent told STALE loads the live version only once that version's grant has steps
    left: versions whose grant other agents used up (or that have none yet) are never downloaded."""
    run = LockstepRun(fake_redis)
    run.publish()
    run.quota.grant(1, FLUSH)
    run.thread.start()
    try:
        run.wait_for(lambda: run.agent.steps == FLUSH, "the v1 claim produced")
        assert run.publish() == 2  # no grant for v2 yet (then used up by others)
        run.quota.grant(2, 0)
        assert run.publish() == 3
        time.sleep(0.5)
        assert run.agent.policy.version == 1 and run.agent.params.primary_downloads == 1
        run.quota.grant(3, FLUSH)
        run.wait_for(lambda: run.agent.steps == 2 * FLUSH, "the v3 claim produced")
        assert run.agent.policy.version == 3 and run.agent.params.primary_downloads == 2
        assert all(set(c.policy_version) == {3} for c in run.chunks()[2:])
    finally:
        run.finish()


def test_a_live_version_below_the_one_held_is_neither_claimed_nor_loaded(fake_redis):
    """A learner that started over publishes from v1 again: the agent claims none of its steps
    (it cannot act with that version) and counts the refused download, which makes the learner
    republish above."""
    run = LockstepRun(fake_redis)
    for _ in range(3):
        run.publish()
    run.quota.grant(3, FLUSH)
    run.thread.start()
    try:
        run.wait_for(lambda: run.agent.steps == FLUSH, "the v3 claim produced")
        fake_redis.hset(ParamKeys(run.config.run).meta, "version", 1)
        run.quota.grant(1, FLUSH)
        run.wait_for(lambda: run.agent.params.rejections >= 1, "the lower version refused")
        assert run.agent.steps == FLUSH and run.agent.policy.version == 3
        assert run.quota.left() == (1, FLUSH)  # nothing claimed
    finally:
        run.finish()


def test_free_agents_claim_nothing(fake_redis):
    agent = run_agent(fake_redis, [], until=lambda a: a.steps >= 64)
    assert not agent.lockstep and agent.claimer.wait_s == 0
    assert ProductionQuota(fake_redis, "smoke").left() is None


# ---------------------------------------------------------------- seams: lives, a full Redis, counters

def test_every_env_that_ended_starts_again_lost_lives_too(fake_redis, monkeypatch):
    """With episodic life (Atari) an env's final_obs marks a lost life while no episode is reported:
    the policy's per-env state (LSTM state, DDPG noise) must reset as the learner's targets do."""
    real_step = agent_module.step_vector_env
    ended = []

    def lives_only(envs, actions):  # every end is a lost life: no episode is reported
        step = real_step(envs, actions)
        ended.extend(step.final_obs)
        return step._replace(episodes={})

    monkeypatch.setattr(agent_module, "step_vector_env", lives_only)
    started = []
    original = Agent.__init__

    def spying_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        start = self.policy.on_episode_start
        self.policy.on_episode_start = lambda i: (started.append(i), start(i))

    monkeypatch.setattr(Agent, "__init__", spying_init)
    run_agent(fake_redis, [], until=lambda a: len(ended) >= 6)
    assert len(ended) >= 6 and started[:2] == [0, 1]  # the reset
    assert sorted(started[2:]) == sorted(ended)


def test_a_sender_flushed_before_its_first_step_sends_nothing(fake_redis):
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=4), "r", 0, 1)
    assert sender.flush(None) == 0 and sender.stats().steps_dropped == 0
    zeros = np.zeros(2, bool)
    for k in range(5):  # and it works normally afterwards
        sender.add({"x": np.full((2, 3), k, np.float32)}, np.zeros(2), np.ones(2), zeros, zeros)
    assert sender.stats().chunks == 2


def test_heartbeats_and_episode_records_ride_out_a_full_redis(fake_redis, monkeypatch):
    """OOM on the heartbeat and on episode records: the agent goes on stepping, skips heartbeats,
    keeps its records and sends them once Redis takes writes again; its heartbeat carries the
    parameter rejections and the chunks its sender dropped."""
    full = threading.Event()
    full.set()
    original = Agent.__init__

    def refusing_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        beat, record_some = self.heartbeat.beat, self.episodes.record_some
        self.params._rejections = 3
        self.sender._counts["chunks_dropped"] = 2

        def oom(real):
            def call(*a, **k):
                if full.is_set():
                    raise redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
                return real(*a, **k)
            return call

        self.heartbeat.beat, self.episodes.record_some = oom(beat), oom(record_some)

    monkeypatch.setattr(Agent, "__init__", refusing_init)
    overrides = ["agent.heartbeat_every_s=0.1", "agent.fetch_every_steps=1000000"]
    seen = {}

    def until(agent):
        if full.is_set() and agent.num_episodes >= 5:
            seen["episodes_while_full"] = agent.num_episodes
            assert not read_agents(fake_redis, "smoke", ttl_s=30)
            assert len(agent._unsent_episodes) == agent.num_episodes
            full.clear()
        if full.is_set() or agent._unsent_episodes:
            return False
        beats = read_agents(fake_redis, "smoke", ttl_s=30)
        if beats:
            seen["beat"] = beats[0]
        return bool(beats)

    agent = run_agent(fake_redis, overrides, until=until)
    assert seen["episodes_while_full"] >= 5 and not agent._unsent_episodes and agent.episodes_lost == 0
    records = EpisodeReader(fake_redis, "smoke", start_id="0-0").read_new()
    assert len(records) == agent.num_episodes  # each one once, those kept while full included
    assert seen["beat"].param_rejections == 3 and seen["beat"].chunks_dropped == 2


def test_a_stop_during_an_outage_ends_the_senders_retries(tmp_path, monkeypatch):
    """Redis unreachable, sender.max_wait_s of 10 minutes: a stop ends the retrying within
    STOP_RETRY_S (the launcher kills a stopping agent after 30 s), the chunks counted as dropped."""
    assert STOP_RETRY_S < 30
    monkeypatch.setattr("surreal_redis.hub.experience.sender.STOP_RETRY_S", 1.0)
    stop = threading.Event()
    client = redis.Redis(unix_socket_path=str(tmp_path / "nobody.sock"))
    sender = ExperienceSender(client, SenderConfig(flush_steps=2, max_wait_s=600, retry_cap_s=0.2), "r", 0, 1, stop=stop)
    zeros = np.zeros(2, bool)
    errors = []

    def step():
        try:
            for k in range(3):
                sender.add({"x": np.full((2, 3), k, np.float32)}, np.zeros(2), np.ones(2), zeros, zeros)
        except HubUnavailableError as exc:
            errors.append(exc)

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # retrying through the outage
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and len(errors) == 1 and "stopping" in str(errors[0])
    assert sender.stats().chunks_dropped == 2 and sender.stats().steps_dropped == 4


def test_an_agent_waiting_for_its_first_parameters_looks_at_least_every_tenth_of_a_second(fake_redis, monkeypatch):
    """The run's first update waits for the agents to see the learner's first parameters: a
    backoff growing to seconds made that wait up to a second longer than the publish."""
    config = load_config("smoke", ["learner.on_policy_sync=free"])
    agent = Agent(config, fake_redis, 0, StopFlag(install_handlers=False))
    pulls = iter([False] * 40 + [True])
    waits: list[float] = []
    monkeypatch.setattr(agent, "_pull_params", lambda: next(pulls))
    monkeypatch.setattr(agent.stop, "wait", lambda seconds: waits.append(seconds) or False)
    assert agent._wait_for_first_params()
    assert len(waits) == 40 and 0 < max(waits) <= 0.1
