"""Redis Cluster addressing: which server holds a key, every primary or node, and reloading the
slot map after a failover. On a standalone client each function is the identity (or a no-op).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.typing import EncodableT, KeyT

from surreal_redis.connection import RedisClient

log = logging.getLogger(__name__)


def is_cluster(client: object) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a :class:`RedisCluster` or its pipeline)."""
    return isinstance(client, (RedisCluster, redis.cluster.ClusterPipeline))


def primary_clients(client: RedisClient) -> list[redis.Redis]:
    """One client per primary: ``[client]`` for a standalone server; for a cluster, the cluster's
    own per-node clients of its current primaries (commands that act on one server's keyspace or
    state, e.g. SCAN, SCRIPT LOAD, INFO, run on each)."""
    if not isinstance(client, RedisCluster):
        return [client]
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def all_node_clients(client: RedisClient) -> list[redis.Redis]:
    """One client per server: ``[client]`` for a standalone server; for a cluster, every node its
    primaries know of (``CLUSTER NODES``), replicas and failed ones included (the slot map alone
    misses a replica just joined or down), for per-node state such as ACL users. Blocks for one
    round trip per primary."""
    if not isinstance(client, RedisCluster):
        return [client]
    nodes: dict[str, ClusterNode] = {}
    for primary in client.get_primaries():
        listing = client.get_redis_connection(primary).execute_command("CLUSTER", "NODES")
        for line in (listing.decode() if isinstance(listing, bytes) else listing).splitlines():
            fields = line.split()
            if len(fields) < 3 or "noaddr" in fields[2].split(","):
                continue
            address = fields[1].split("@")[0]
            host, _, port = address.rpartition(":")
            node = ClusterNode(host or primary.host, int(port))
            nodes.setdefault(node.name, client.get_node(node_name=node.name) or node)
    client.nodes_manager.create_redis_connections([n for n in nodes.values() if n.redis_connection is None])
    return [node.redis_connection for node in nodes.values()]


def node_client(client: RedisClient, key: str | bytes) -> redis.Redis:
    """The client of the server that owns ``key``: ``client`` itself when standalone, else the
    cluster's client of the primary serving the key's slot (as of the last slot-map refresh)."""
    if not isinstance(client, RedisCluster):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def keyed_command(client: RedisClient, key: KeyT, *args: EncodableT) -> Any:
    """``client.execute_command(*args)``; on a cluster sent straight to the primary of ``key``'s
    slot. For commands whose keys redis-py cannot place by itself (XREAD, XREADGROUP: it asks the
    default node with COMMAND GETKEYS, a round trip more per call, and fails without retrying or
    refreshing its slot map while that node is down). Every key in ``args`` must share ``key``'s slot."""
    if not isinstance(client, RedisCluster):
        return client.execute_command(*args)
    return client.execute_command(*args, target_nodes=client.get_node_from_key(key))


def node_name(client: RedisClient, key: str | bytes) -> str | None:
    """``host:port`` of the cluster primary serving ``key``'s slot (as of the last slot-map
    refresh: the node :func:`node_client` gives), or None for a standalone client."""
    if not isinstance(client, RedisCluster):
        return None
    return str(client.get_node_from_key(key).name)


def refresh_topology(client: RedisClient, reason: BaseException) -> None:
    """After a connection error or a MOVED reply on a raw connection: reload a cluster client's
    slot map (no-op when standalone). A failure to reload is logged; the next call tries again."""
    if not isinstance(client, RedisCluster):
        return
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        log.warning("cluster slot map not refreshed after %s: %s", reason, exc)
