"""Redis Cluster: URLs, shard placement, the hub round trip and Lua scripts on a real local
cluster (3 primaries + 3 replicas, one per session), a ``launch`` smoke run and a failover."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from surreal_redis.connection import connect, parse_cluster_url
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import ParameterPublisher, PublisherConfig
from surreal_redis.hub.run.control import RunControl
from surreal_redis.keys import RunKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.redis_cluster import is_cluster, primary_clients

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


def test_cluster_url_parsing():
    address = parse_cluster_url("rediss+cluster://learner:p%40ss@h1:7000,h2:7001/0")
    assert address.nodes == (("h1", 7000), ("h2", 7001)) and address.ssl
    assert (address.username, address.password) == ("learner", "p@ss")
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_cluster_url("redis+cluster://h1")
    with pytest.raises(ValueError, match="database"):
        parse_cluster_url("redis+cluster://h1:7000/2")
    with pytest.raises(ValueError, match="unsupported Redis URL"):
        connect("cluster://h1:7000")


def _steps(sender: ExperienceSender, count: int) -> None:
    for t in range(count):
        sender.add(np.full((2, 8), t, np.float32), np.zeros(2, np.int64), np.ones(2, np.float32),
                   np.zeros(2, bool), np.zeros(2, bool))


def _receive(receiver: ExperienceReceiver, want: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        batch = receiver.receive(256, block_ms=200)
        receiver.ack(batch)
        got += batch
    return got


@pytest.mark.parametrize("apart", [None, 1], ids=["payloads-inline", "payloads-apart"])
def test_shards_spread_over_primaries_and_round_trip(redis_cluster, apart):
    """Also with every payload stored apart: the sender's SADD and SETNX and the receiver's payload
    MGET go to each shard's primary."""
    client = connect(redis_cluster.url)
    assert is_cluster(client) and len(primary_clients(client)) == 3
    run = f"rt{apart}"
    config = SenderConfig(flush_steps=4, dedup_min_bytes=16, payload_ref_min_bytes=apart)
    owners = {client.get_node_from_key(RunKeys(run).shard(i).exp).name for i in range(3)}
    assert len(owners) == 3, "three shards on three primaries"
    receiver = ExperienceReceiver(client, ReceiverConfig(), run, 3)
    receiver.start()
    for agent in range(6):  # two agents per shard, blobs deduplicated (insert.lua), 2 chunks each
        _steps(ExperienceSender(client, config, run, agent, 3), 5)
    got = _receive(receiver, 12)
    assert len(got) == 12 and {item.shard for item in got} == {0, 1, 2} and receiver.stats().dead == 0
    assert {item.chunk.agent_id for item in got} == set(range(6))
    # one quiet shard never starves the others: data on the last shard arrives within one call
    _steps(ExperienceSender(client, config, run, 2, 3), 5)
    assert {item.shard for item in _receive(receiver, 2)} == {2}
    # gc.lua per shard, and drop on every primary
    stats = HubJanitor(client, RetentionConfig(max_entries=1), run, 3).run_once()
    assert stats is not None
    assert RunControl(client, run).drop() > 0
    assert not any(node.keys(f"sr:{{{run}*") for node in primary_clients(client))


def test_scripts_reload_after_script_flush_on_every_primary(redis_cluster):
    """The learner loads insert.lua on every primary; after a flush (as on a promoted replica,
    whose script cache is empty) the sender's NOSCRIPT path reloads it and nothing is lost."""
    client = connect(redis_cluster.url)
    run = "noscript"
    receiver = ExperienceReceiver(client, ReceiverConfig(), run, 3)
    receiver.start()
    for node in primary_clients(client):
        node.script_flush()
    for agent in range(3):
        _steps(ExperienceSender(client, SenderConfig(flush_steps=4, dedup_min_bytes=16), run, agent, 3), 5)
    assert len(_receive(receiver, 6)) == 6
    receiver.load_agent_scripts()
    sha = receiver._scripts.get("insert").sha
    assert all(node.script_exists(sha) == [True] for node in primary_clients(client))


def test_failover_mid_run_loses_nothing_acked(fresh_redis_cluster):
    """kill -9 the primary of shard 0 between flushes: the sender backs off until the replica is
    promoted (its script cache is empty: NOSCRIPT -> reload), the receiver's next calls find the new
    primary, and every chunk stored before or after arrives exactly once."""
    cluster = fresh_redis_cluster
    client = connect(cluster.url)
    run = "failover"
    receiver = ExperienceReceiver(client, ReceiverConfig(), run, 3)
    receiver.start()
    senders = [ExperienceSender(client, SenderConfig(flush_steps=4, dedup_min_bytes=16, max_wait_s=60), run, a, 3)
               for a in range(3)]
    for sender in senders:
        _steps(sender, 5)
    got = _receive(receiver, 6)
    assert len(got) == 6
    cluster.kill_primary_of(RunKeys(run).shard(0).exp)
    for sender in senders:  # blocks through the failover (about 3 s with cluster-node-timeout 2000)
        _steps(sender, 8)
    after: list = []
    deadline = time.monotonic() + 30
    while len(after) < 12 and time.monotonic() < deadline:
        try:
            batch = receiver.receive(256, block_ms=200)
            receiver.ack(batch)
            after += batch
        except Exception as exc:  # connection errors during the failover: the learner's OutageGuard retries
            assert isinstance(exc, OUTAGE_ERRORS), exc
            time.sleep(0.2)
    ids = [(item.shard, item.entry_id) for item in after]
    assert len(ids) == len(set(ids)) == 12 and {item.shard for item in after} == {0, 1, 2}
    assert sum(s.stats().chunks for s in senders) == 18


@pytest.mark.slow
def test_launch_survives_kill_9_of_a_primary(fresh_redis_cluster, tmp_path):
    """kill -9 the primary holding the parameters (and one shard) while a ``launch`` runs: agents,
    learner and evaluator ride out the failover (its replica, promoted, has an empty script cache;
    lockstep agents wait on the notify channel, whose subscription must find the new primary) and
    the run finishes with exit 0; ``status`` reads it afterwards."""
    cluster = fresh_redis_cluster
    client = connect(cluster.url)
    run = "cfail"
    # 4000 steps: the run goes on well after the ~3 s failover, so agents (stopped as soon as the
    # run stops) still claim from the killed primary's replica once it is promoted
    overrides = ["-o", f"experiment.root={tmp_path}", "-o", "redis.num_shards=3", "-o", f"experiment.name={run}",
                 "-o", "stop.max_env_steps=4000", "-o", "stop.max_seconds=150"]
    launch = subprocess.Popen([*CLI, "launch", SMOKE, "--agents", "2", "--redis-url", cluster.url, *overrides],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        meta = RunKeys(run).params.meta
        deadline = time.monotonic() + 120
        while int(client.hget(meta, "version") or 0) < 2:  # a couple of updates in
            assert launch.poll() is None and time.monotonic() < deadline, "the run ended before the kill"
            time.sleep(0.2)
        killed = cluster.kill_primary_of(meta)
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 0, output[-4000:]
    logs = "".join(path.read_text() for path in (tmp_path / run / "logs").glob("agent-*.log"))
    # an agent notices in whichever call first meets the dead primary: a claim or a send
    # (OutageGuard) or its parameter poll (one warning per streak of failures)
    noticed = "Redis unavailable" in logs or "parameter fetch failed" in logs
    recovered = "reachable again" in logs or "parameter fetch works again" in logs
    assert noticed and recovered, "the agents did not notice the kill"
    learner_log = (tmp_path / run / "logs" / "learner.log").read_text()
    assert "stop.max_env_steps=4000)" in learner_log, "the run stalled after the failover (stopped on time)"
    client = connect(cluster.url)
    assert cluster.primary_port_of(meta) != killed
    assert int(client.hget(meta, "version")) > 2
    status = subprocess.run([*CLI, "status", "--run", run, "--redis-url", cluster.url],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr[-3000:]


def test_publish_waits_for_a_replica_when_asked(redis_cluster, real_redis, caplog):
    """``wait_replica_ms``: once publish returns, the replica of the parameters' primary has the
    version (a failover now cannot take it back); with no replica it logs and goes on."""
    client = connect(redis_cluster.url)
    run = "waitrun"
    meta = RunKeys(run).params.meta
    primary = redis_cluster.primary_port_of(meta)
    replica_port = next(p for p in redis_cluster.ports
                        if redis_cluster.node(p).info("replication").get("master_port") == primary)
    replica = redis_cluster.node(replica_port)
    replica.execute_command("READONLY")
    publisher = ParameterPublisher(client, run, PublisherConfig(wait_replica_ms=20_000))
    assert publisher.publish({"w": np.zeros(3, np.float32)}, 0) == 1
    published = []
    redis_cluster.processes[replica_port].send_signal(signal.SIGSTOP)  # the replica lags
    try:
        thread = threading.Thread(target=lambda: published.append(publisher.publish({"w": np.ones(3, np.float32)}, 1)))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and client.hget(meta, "version") == b"2"  # published, waiting for the replica
    finally:
        redis_cluster.processes[replica_port].send_signal(signal.SIGCONT)
    thread.join(20)
    assert published == [2] and replica.hget(meta, "version") == b"2"
    assert "no replica acknowledged" not in caplog.text
    lonely = ParameterPublisher(real_redis, run, PublisherConfig(wait_replica_ms=20))
    assert lonely.publish({"w": np.zeros(3, np.float32)}, 0) == 1
    assert "no replica acknowledged the publish within 20 ms" in caplog.text
    with pytest.raises(ValueError, match="wait_replica_ms"):
        PublisherConfig(wait_replica_ms=-1)


def test_cluster_bench_runs_on_tiny_sizes():
    script = Path(__file__).resolve().parents[2] / "bench" / "cluster.py"
    done = subprocess.run([sys.executable, str(script), "--primaries", "1,2", "--senders", "1", "--seconds", "0.2",
                           "--wait-cost", "--param-kb", "16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["scaling"]) == {"1", "2"} and result["scaling"]["1"]["insert_ratio"] == 1.0
    assert all(row["insert_steps_per_s"] > 0 and row["receive_steps_per_s"] > 0 for row in result["scaling"].values())
    assert result["wait_cost"]["wait_ratio"] > 0 and result["wait_cost"]["insert_wait_ratio"] > 0
    bad = subprocess.run([sys.executable, str(script), "--senders", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--senders must be >= 1, got 0" in bad.stderr


def test_a_waiting_sender_hears_the_read_after_the_default_node_died(fresh_redis_cluster):
    """With the cluster client's default node killed, before its failover, the shards elsewhere go
    on: redis-py sends keyless commands there (PUBLISH, SCRIPT LOAD to every primary, COMMAND
    GETKEYS for XREADGROUP), so the receiver loads move.lua, reads and announces each read on the
    node of the shard itself, and a sender waiting on max_lag (backoff 60 s) wakes on that read."""
    cluster = fresh_redis_cluster
    client = connect(cluster.url)
    run = "announce"
    keys = RunKeys(run)
    default = client.get_default_node().port
    owner = {cluster.primary_port_of(keys.shard(i).exp): i for i in range(3)}
    shard = next(i for port, i in owner.items() if port != default)
    receiver = ExperienceReceiver(client, ReceiverConfig(), run, 3, shards=[shard])
    receiver.start()
    sender = ExperienceSender(client, SenderConfig(flush_steps=1, max_lag=1, retry_base_s=60, retry_cap_s=60),
                              run, shard, 3)
    _steps(sender, 2)  # one insert (a chunk of each env): 1 batch unread in the inbox, not over max_lag 1
    cluster.kill_primary_of(keys.shard(owner[default]).exp)
    thread = threading.Thread(target=_steps, args=(sender, 1), daemon=True)
    thread.start()  # a second insert: 2 batches unread > max_lag 1
    time.sleep(0.5)
    assert thread.is_alive()  # waiting on the backlog
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            receiver.ack(receiver.receive(256, block_ms=200))
        except OUTAGE_ERRORS:  # the cluster finding its way around the dead node
            time.sleep(0.2)
        thread.join(0.5)
    assert not thread.is_alive(), "the sender never heard the learner read its shard"
    sender.close()
