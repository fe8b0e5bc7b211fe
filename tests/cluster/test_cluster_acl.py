"""ACL users of a run on a real Redis Cluster (3 primaries + 3 replicas): ``surreal-redis acl``
sets them on every node (ACLs are per node, never replicated), and the agent, eval and learner
users work through RedisCluster clients, which also send CLUSTER SLOTS and COMMAND; the agent is
still refused what it is refused on a single server."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import redis
from click.testing import CliRunner

from surreal_redis.acl import ROLES, create_users, script_sha, username
from surreal_redis.cli import main
from surreal_redis.connection import connect
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeReader, EpisodeRecord
from surreal_redis.hub.run.heartbeat import Heartbeat, read_agents
from surreal_redis.hub.run.lease import RENEWED, RunLease
from surreal_redis.keys import RunKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.redis_cluster import all_node_clients
from surreal_redis.scripts import Scripts

pytestmark = pytest.mark.integration

RUN = "caclrun"
KEYS = RunKeys(RUN)
PASSWORDS = {"agent": "agent-pw", "eval": "eval-pw", "learner": "learner-pw"}


def login(cluster, role: str):
    return connect(cluster.url.replace("://", f"://{username(RUN, role)}:{PASSWORDS[role]}@"))


def _steps(sender: ExperienceSender, count: int) -> None:
    for t in range(count):
        sender.add(np.full((2, 8), t, np.float32), np.zeros(2, np.int64), np.ones(2, np.float32),
                   np.zeros(2, bool), np.zeros(2, bool))


def test_acl_command_sets_users_on_every_node_and_they_work_through_cluster_clients(redis_cluster):
    done = CliRunner().invoke(main, ["acl", "--run", RUN, "--shards", "3", "--redis-url", redis_cluster.url,
                                     "--agent-password", PASSWORDS["agent"], "--eval-password", PASSWORDS["eval"],
                                     "--learner-password", PASSWORDS["learner"]])
    assert done.exit_code == 0, done.output
    assert f"agent: user {username(RUN, 'agent')} password agent-pw  (URL form: redis+cluster://" in done.output
    admin = connect(redis_cluster.url)
    nodes = all_node_clients(admin)
    roles = [node.info("replication")["role"] for node in nodes]
    assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
    for node in nodes:  # replicas too: a promoted replica must know the users
        assert {username(RUN, role) for role in ROLES} <= set(node.acl_users())

    learner, agent, evaluator = (login(redis_cluster, role) for role in ("learner", "agent", "eval"))
    receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 3)
    receiver.start()  # loads insert.lua on every primary: the agent may not
    for agent_id in range(3):  # one sender per shard, each insert acked by a replica too (WAIT)
        config = SenderConfig(flush_steps=2, dedup_min_bytes=16, wait_replica_ms=5000, max_wait_s=10)
        sender = ExperienceSender(agent, config, RUN, agent_id, 3)
        _steps(sender, 3)
        assert sender.stats().unreplicated_retries == 0
    got, deadline = [], time.monotonic() + 20
    while len(got) < 6 and time.monotonic() < deadline:
        batch = receiver.receive(64, block_ms=100)
        receiver.ack(batch)
        got += batch
    assert len(got) == 6 and {item.shard for item in got} == {0, 1, 2}

    params = {"w": np.arange(6, dtype=np.float32)}
    ParameterPublisher(learner, RUN, PublisherConfig()).publish(params, 1)
    fetched, info = ParameterClient(agent, RUN, ParameterClientConfig()).fetch()
    assert info.version == 1 and np.array_equal(fetched["w"], params["w"])
    quota = ProductionQuota(learner, RUN)
    quota.load_script()
    quota.grant(1, 10)
    assert ProductionQuota(agent, RUN).claim(1, 4).status == "OK"
    Heartbeat(agent, RUN, 0, ttl_s=10).beat(10, 1, 1)
    assert [a.steps for a in read_agents(learner, RUN, ttl_s=10)] == [10]
    reader = EpisodeReader(learner, RUN, start_id="0-0")
    EpisodeLog(agent, RUN).record([EpisodeRecord("0", "train", 1.5, 20, 1, time.time())])
    EpisodeLog(evaluator, RUN).record([EpisodeRecord("eval-0", "eval", 2.5, 20, 1, time.time())])
    assert sorted(r.mode for r in reader.read_new()) == ["eval", "train"]

    lease = RunLease(learner, RUN, folder="/runs/acl")  # a launch with the learner's user: one key, one slot
    lease.acquire()
    assert lease.renew() == RENEWED and lease.holder()["folder"] == "/runs/acl"  # lease.lua loaded on its node

    # what the agent is refused on one server, it is refused on every shard's primary
    exp = KEYS.shard(1).exp
    refused = [("HSET", KEYS.params.meta, "version", 99), ("SET", exp, b"x"), ("DEL", exp),
               ("XTRIM", exp, "MAXLEN", 0), ("HSET", KEYS.control, "state", "stopping"),
               ("XADD", KEYS.evals, "*", "mode", "eval"), ("EVAL", "return 1", 1, exp),
               ("GET", RunKeys("other").shard(0).obs("ab" * 16)), ("SET", KEYS.lease, "x"), ("DEL", KEYS.lease)]
    for command in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    for node in map(agent.get_redis_connection, agent.get_nodes()):  # server-wide commands, on each node
        for command in (("FLUSHALL",), ("KEYS", "*"), ("SCRIPT", "LOAD", "return 1"), ("CONFIG", "GET", "maxmemory"),
                        ("CLUSTER", "FAILOVER"), ("CLUSTER", "RESET")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                node.execute_command(*command)
    gc_sha = Scripts(learner).get("gc").sha
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.evalsha(gc_sha, 3, exp, KEYS.shard(1).obsref, KEYS.shard(1).pinned)
    with pytest.raises(redis.exceptions.NoPermissionError):
        learner.execute_command("FLUSHALL")  # sent to every primary
    assert admin.xlen(exp) == 2 and admin.hget(KEYS.params.meta, "version") == b"1"
    assert lease.release() and admin.get(KEYS.lease) is None


def test_after_failover_the_learner_reloads_the_agents_scripts_on_the_promoted_replica(fresh_redis_cluster, caplog):
    """A promoted replica has an empty script cache and agents may not load scripts: their inserts
    and claims wait until the learner's periodic ``load_agent_scripts`` / ``quota.load_script``
    reach the new primary, then go through (nothing lost)."""
    cluster = fresh_redis_cluster
    admin = connect(cluster.url)
    create_users(admin, RUN, PASSWORDS, num_shards=3)
    learner, agent = login(cluster, "learner"), login(cluster, "agent")
    receiver, quota = ExperienceReceiver(learner, ReceiverConfig(), RUN, 3), ProductionQuota(learner, RUN)
    receiver.start()
    quota.load_script()
    meta = KEYS.params.meta
    shard = next(i for i in range(3) if cluster.primary_port_of(KEYS.shard(i).exp) == cluster.primary_port_of(meta))
    sender = ExperienceSender(agent, SenderConfig(flush_steps=2, dedup_min_bytes=16, max_wait_s=60), RUN, shard, 3)
    _steps(sender, 3)
    killed = cluster.kill_primary_of(meta)
    sent = threading.Event()
    thread = threading.Thread(target=lambda: (_steps(sender, 2), sent.set()), daemon=True)
    thread.start()  # backs off through the failover, then NOSCRIPT until the learner reloads
    deadline = time.monotonic() + 30
    with caplog.at_level(logging.DEBUG, logger="surreal_redis.hub.experience.sender"):
        while not sent.is_set():  # the learner's housekeeping, once the agent is stuck on NOSCRIPT
            assert time.monotonic() < deadline, "the agent's insert never went through"
            try:
                if "cannot load insert.lua" in caplog.text:
                    receiver.load_agent_scripts()
                    quota.load_script()
            except OUTAGE_ERRORS:
                pass
            sent.wait(0.5)
    assert cluster.primary_port_of(meta) != killed
    thread.join(5)
    new_primary = cluster.node(cluster.primary_port_of(meta))
    assert new_primary.script_exists(script_sha("insert"), script_sha("claim")) == [True, True]
    quota.grant(0, 8)
    assert ProductionQuota(agent, RUN).claim(0, 4).status == "OK"
    got, deadline = [], time.monotonic() + 20
    while len(got) < 4 and time.monotonic() < deadline:
        try:
            batch = receiver.receive(64, block_ms=100)
        except OUTAGE_ERRORS:
            time.sleep(0.2)
            continue
        receiver.ack(batch)
        got += batch
    assert len(got) == 4 and sender.stats().steps_dropped == 0  # 2 flushes x 2 envs

    # users of another run: every live node gets them, the dead one is named
    with pytest.raises(redis.RedisError, match=rf"not set on 1 of 6 cluster nodes: 127\.0\.0\.1:{killed} "):
        create_users(connect(cluster.url), "other", PASSWORDS)
    alive = [cluster.node(p) for p, proc in cluster.processes.items() if proc.poll() is None]
    assert len(alive) == 5 and all(username("other", "agent") in node.acl_users() for node in alive)
