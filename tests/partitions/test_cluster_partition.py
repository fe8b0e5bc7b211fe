"""A Redis Cluster primary partitioned from its replica and the other primaries (the minority
side) past ``cluster-node-timeout``: 3 primaries and 3 replicas, each node in its own network
namespace, the smoke run's learner and two agents on their own hosts.

Cut alone: the primary holding shard 0's stream is cut from everyone until its replica has taken
over, then healed (it rejoins as a replica of the new primary). Split with a client: that primary
and agent0 are split off together, so agent0 goes on inserting into the old primary, which
acknowledges until it notices it lost the majority. Required: training and heartbeats resume,
nobody is restarted, no chunk is in the stream twice or trained twice; chunks the old primary
acknowledged and had not replicated are lost, and counted (docs/reliability.md, "Partitions"),
and with ``hub.sender.wait_replica_ms`` none is.
"""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot
from support.netns import LabCluster, NetnsLab, netns_unavailable

from .harness import AGENTS, Run, account_for_every_chunk

pytestmark = [pytest.mark.partitions, pytest.mark.integration, pytest.mark.slow]

NODES = ("c0", "c1", "c2", "c3", "c4", "c5")
PORT = 6379
NODE_TIMEOUT_MS = 2000


def start_cluster_run(tmp_path, overrides: tuple[str, ...] = ()):
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"partition tests need network namespaces: {reason}")
    with NetnsLab([*NODES, "learner", *AGENTS, "observer"], tmp_path / "logs") as lab:
        cluster = LabCluster(lab, NODES, primaries=3, admin_host="observer", port=PORT,
                             node_timeout_ms=NODE_TIMEOUT_MS).start()
        servers = [p for p in lab.processes if p.name.startswith("redis-")]
        run = Run(lab, tmp_path / "run", cluster.url, "c0", PORT, servers, overrides)
        run.wait_training(0, time.time(), "start")
        yield cluster, run


@pytest.fixture
def cluster_run(tmp_path):
    yield from start_cluster_run(tmp_path)


@pytest.fixture(params=[0, 1000], ids=["primary-ack", "replica-ack"])
def free_cluster_run(tmp_path, request):
    """The same run with agents that never wait for grants (``learner.on_policy_sync: free``: an
    agent cut off from the parameters' primary still produces), their senders with
    ``hub.sender.wait_replica_ms`` ``request.param``; yields (that, cluster, run)."""
    overrides = ("learner.on_policy_sync=free", f"hub.sender.wait_replica_ms={request.param}")
    for cluster, run in start_cluster_run(tmp_path, overrides):
        yield request.param, cluster, run


def shard0_nodes(cluster: LabCluster, run: Run, what: str) -> tuple[str, str, str]:
    """(the primary of shard 0's stream, its replica, a third node the observer now asks, on the
    majority side), once the run trains (``what``: the fault to come)."""
    primary = cluster.primary_of_slot(key_slot(run.keys.shard(0).exp.encode()))
    replica = NODES[NODES.index(primary) + 3]
    witness = next(n for n in NODES if n not in (primary, replica))
    run.redis_address = run.lab.host(witness).address
    run.wait_training(run.iteration(), time.time(), f"before {what}")
    return primary, replica, witness


def account_after_rejoin(cluster: LabCluster, run: Run, old: str, promoted: str, witness: str) -> dict:
    """Once the cluster is whole: ``old`` is a replica, ``promoted`` the primary, every process
    still runs; then every chunk is accounted for (losses allowed and counted)."""
    cluster.wait_ok(timeout_s=60)
    roles = cluster.roles(witness)
    assert roles[old] == "slave" and roles[promoted] == "master", roles
    run.assert_all_running()
    return account_for_every_chunk(run, may_lose=True)


def test_a_primary_cut_off_past_the_node_timeout_fails_over_and_the_run_goes_on(cluster_run):
    cluster, run = cluster_run
    cut, replica, witness = shard0_nodes(cluster, run, "the cut")
    run.lab.cut(cut)
    started, cut_at = time.monotonic(), time.time()
    try:
        promoted = run.wait_for(lambda: cluster.roles(witness)[replica] == "master", 60,
                                f"{replica} promoted in place of {cut}")
        assert cluster.roles(witness)[cut] == "master fail"
        # the majority side goes on while the old primary is still cut off
        during = run.wait_training(run.iteration(), cut_at + promoted, f"while {cut} is cut off, after the failover")
    finally:
        run.lab.heal(cut)
    healed_at, cut_s = time.time(), time.monotonic() - started
    timings = run.wait_training(run.iteration(), healed_at, f"after {cut} was cut for {cut_s:.1f}s")
    numbers = account_after_rejoin(cluster, run, cut, replica, witness)
    print(f"cluster: {cut} cut {cut_s:.1f}s, {replica} promoted {promoted:.1f}s after the cut, updates resumed "
          f"{during['updates_s']:.1f}s after that (still cut), and {timings['updates_s']:.1f}s after the heal; "
          f"lost {numbers['lost']}, dropped {numbers['dropped']}")


def test_a_primary_split_off_with_an_agent_loses_only_what_it_acknowledged_alone(free_cluster_run):
    """The primary of shard 0 and agent0 are split from everyone else, together (a minority side
    with a client): agent0 goes on inserting into the old primary, which acknowledges them until
    it notices it lost the majority (about the node timeout), while its replica is promoted on the
    majority side. After the join the old primary rejoins as a replica and what it acknowledged
    alone is gone, counted per agent as lost. With ``hub.sender.wait_replica_ms`` nothing is: on
    the minority side ``WAIT 1`` finds no replica, so those inserts never count as stored and go
    to the new primary after the join."""
    wait_ms, cluster, run = free_cluster_run
    split, replica, witness = shard0_nodes(cluster, run, "the split")
    run.lab.split(split, "agent0")
    started = time.monotonic()
    try:
        promoted = run.wait_for(lambda: cluster.roles(witness)[replica] == "master", 60,
                                f"{replica} promoted in place of {split}")
        time.sleep(3.0)  # agent0 keeps at the old primary, which now refuses it (CLUSTERDOWN)
    finally:
        run.lab.join(split, "agent0")
    joined_at, split_s = time.time(), time.monotonic() - started
    timings = run.wait_training(run.iteration(), joined_at, f"after {split} and agent0 were split for {split_s:.1f}s")
    numbers = account_after_rejoin(cluster, run, split, replica, witness)
    print(f"cluster, wait_replica_ms={wait_ms}: {split} split off with agent0 for {split_s:.1f}s, {replica} "
          f"promoted {promoted:.1f}s in; updates {timings['updates_s']:.1f}s after the join; lost {numbers['lost']}, "
          f"dropped {numbers['dropped']}")
    if wait_ms:
        assert sum(numbers["lost"].values()) == 0, numbers["lost"]
