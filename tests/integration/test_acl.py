"""ACL users of a run on a real redis-server: the agent user runs the whole agent side of the hub
and nothing else; the learner user runs the learner side but no server-wide commands."""

import logging
import threading
import time

import numpy as np
import pytest
import redis

from surreal_redis.acl import create_users, username
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeRecord
from surreal_redis.hub.run.heartbeat import Heartbeat, read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

pytestmark = pytest.mark.integration

RUN = "aclrun"
KEYS = RunKeys(RUN)


def login(server, role: str, password: str) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(server.socket_path), username=username(RUN, role), password=password)


def frames(step: int) -> dict:
    """A 2-frame stack per env (2 envs): one new 84x84 frame per step, referenced by digest."""
    pix = [np.stack([np.full((84, 84), (7 * env + step + k) % 251, np.uint8) for env in range(2)]) for k in range(2)]
    return {"pix": tuple(pix), "vec": np.full((2, 3), step, np.float32)}


def test_agent_user_runs_the_agent_side_only(redis_server, real_redis, caplog):
    assert create_users(real_redis, RUN, "agent-pw", "learner-pw", num_shards=1) == {
        "agent": "sr-aclrun-agent", "learner": "sr-aclrun-learner"}
    agent, learner = login(redis_server, "agent", "agent-pw"), login(redis_server, "learner", "learner-pw")
    zeros = np.zeros(2, bool)

    # No learner has loaded insert.lua yet and the agent may not: its sender backs off, then
    # stores everything once the learner's receiver has started.
    sender = ExperienceSender(agent, SenderConfig(flush_steps=2, retry_base_s=0.02, retry_cap_s=0.05), RUN, 0, 1)
    errors = []

    def act() -> None:
        try:
            for step in range(5):
                sender.add(frames(step), np.arange(2), np.ones(2), zeros, zeros, policy_version=step)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="surreal_redis.hub.experience.sender"):
        thread = threading.Thread(target=act)
        thread.start()
        time.sleep(0.4)
        assert thread.is_alive() and "cannot load insert.lua" in caplog.text
        assert real_redis.exists(KEYS.shard(0).exp) == 0
        receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 1)
        receiver.start()
        thread.join(timeout=20)
    assert not thread.is_alive() and errors == [] and sender.stats().steps_dropped == 0
    got = receiver.receive(100, 0)
    assert len(got) == 4 and receiver.stats().dead == 0  # 2 flushes x 2 envs
    for item in got:
        chunk = item.chunk
        for t in range(chunk.num_steps):
            step = int(chunk.policy_version[t])
            np.testing.assert_array_equal(chunk.obs["pix"][1][t], frames(step)["pix"][1][chunk.env_index])
    receiver.ack(got)

    # parameters: the learner publishes, the agent pulls
    params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    ParameterPublisher(learner, RUN, PublisherConfig()).publish(params, 1)
    fetched, info = ParameterClient(agent, RUN, ParameterClientConfig()).fetch()
    assert info.version == 1
    np.testing.assert_array_equal(fetched["w"], params["w"])

    # heartbeat, episodes, run control
    Heartbeat(agent, RUN, 0, ttl_s=10).beat(10, 1, 1)
    assert [a.steps for a in read_agents(learner, RUN, ttl_s=10)] == [10]
    EpisodeLog(agent, RUN).record([EpisodeRecord("0", "train", 1.5, 20, 1, time.time())])
    assert learner.xlen(KEYS.episodes) == 1
    RunControl(learner, RUN).start()
    assert RunControl(agent, RUN).stopping() == (False, "")

    # everything else is refused
    exp = KEYS.shard(0).exp
    refused = [
        ("FLUSHALL",), ("EVAL", "return 1", 0), ("SCRIPT", "LOAD", "return 1"),
        ("HSET", KEYS.params.meta, "version", 99), ("SET", KEYS.params.blob(2), b"x"),
        ("SET", exp, b"clobbers the stream"), ("DEL", exp), ("XTRIM", exp, "MAXLEN", 0),
        ("HSET", KEYS.control, "state", "stopping"), ("CONFIG", "SET", "maxmemory", "1"),
        ("GET", RunKeys("other").shard(0).obs("ab" * 16)), ("KEYS", "*"), ("XREADGROUP", "GROUP", "learner", "x",
                                                                         "STREAMS", exp, ">"),
    ]
    for command in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    # scripts the learner loaded run with the agent's permissions: publish.lua's keys are not the
    # agent's, and gc.lua needs commands the agent lacks
    publish = Scripts(learner).get("publish").sha
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.evalsha(publish, 4, KEYS.params.meta, KEYS.params.staging("ab" * 8), KEYS.params.blob(2),
                      KEYS.params.blob(1), 2, 1, 1, 1024, "sha256:x", "srt1", "{}", 1, 0, "", 1000, "n")
    obs_keys = [k.decode() for k in real_redis.keys(KEYS.shard(0).obs_prefix + "*")]
    assert obs_keys
    with pytest.raises(redis.ResponseError):
        agent.evalsha(Scripts(learner).get("gc").sha, 2 + len(obs_keys), exp, KEYS.shard(0).obsref, *obs_keys)
    assert learner.hget(KEYS.params.meta, "version") == b"1" and learner.xlen(exp) == 4
    assert learner.exists(*obs_keys) == len(obs_keys)

    # the learner runs its side (gc, trims) but nothing server-wide or of other runs
    assert HubJanitor(learner, RetentionConfig(max_entries=0), RUN, 1).run_once().trimmed == 4
    for command in (("FLUSHALL",), ("SCRIPT", "FLUSH"), ("CONFIG", "GET", "maxmemory"),
                    ("SET", RunKeys("other").control, b"x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            learner.execute_command(*command)
    agent.close()
    learner.close()


def test_learner_reloads_the_insert_script_after_a_script_flush(redis_server, real_redis):
    """Agents may not load scripts: after SCRIPT FLUSH their inserts wait until the learner's
    next housekeeping reloads insert.lua, then go through (nothing lost)."""
    create_users(real_redis, RUN, "agent-pw", "learner-pw", num_shards=1)
    receiver = ExperienceReceiver(login(redis_server, "learner", "learner-pw"), ReceiverConfig(), RUN, 1)
    receiver.start()
    sender = ExperienceSender(login(redis_server, "agent", "agent-pw"), SenderConfig(flush_steps=2, max_wait_s=30),
                              RUN, 0, 1)
    real_redis.script_flush()
    done = threading.Event()

    def send() -> None:
        for step in range(3):  # the third add completes the first 2-step chunk
            sender.add(frames(step), np.zeros(2, np.int64), np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool))
        done.set()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    time.sleep(1.0)
    assert not done.is_set() and real_redis.xlen(KEYS.shard(0).exp) == 0  # backing off: NOSCRIPT
    receiver.load_agent_scripts()
    assert done.wait(15)
    thread.join(5)
    assert real_redis.xlen(KEYS.shard(0).exp) == 2  # one chunk per env
