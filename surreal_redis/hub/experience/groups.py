"""The learner's consumer groups on the shard streams (``keys.CONSUMER_GROUP``) and the agents'
script: creating the groups, removing dead readers' consumers, loading ``insert.lua``."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis

from surreal_redis.connection import RedisClient
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys
from surreal_redis.redis_cluster import node_name
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)


def load_agent_scripts(client: RedisClient, scripts: Scripts, shards: Iterable[ShardKeys]) -> None:
    """(Re)load ``insert.lua`` for agents whose ACL user may run scripts but not load them (at
    start, after a server restart and periodically). One round trip per shard's server, each
    loaded apart, so one primary down fails none of the others."""
    servers = {node_name(client, keys.exp): keys.exp for keys in shards}
    for key in servers.values():
        scripts.load("insert", key)


def create_groups(client: RedisClient, scripts: Scripts, shards: Iterable[ShardKeys]) -> None:
    """Create the missing consumer groups (from the stream start, MKSTREAM) and load the agents'
    script (see :func:`load_agent_scripts`). An existing group is left alone (XGROUP CREATE is
    refused in a full Redis, even when it would only answer BUSYGROUP)."""
    shards = list(shards)
    load_agent_scripts(client, scripts, shards)
    for keys in shards:
        try:
            groups = client.xinfo_groups(keys.exp)
        except redis.ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            groups = []
        if any(g["name"] in (CONSUMER_GROUP, CONSUMER_GROUP.encode()) for g in groups):
            continue
        try:
            client.xgroup_create(keys.exp, CONSUMER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def remove_idle_consumers(client: RedisClient, scripts: Scripts, shards: Iterable[ShardKeys], own: str) -> int:
    """Delete the group's consumers other than ``own`` that have no pending entries (dead
    learners' names would pile up otherwise); returns how many. ``lua/consumers.lua`` re-checks
    each one atomically, so a live reader that just took entries keeps them."""
    own_name = own.encode()
    count = 0
    for keys in shards:
        names = [c["name"] for c in client.xinfo_consumers(keys.exp, CONSUMER_GROUP)
                 if c["pending"] == 0 and c["name"] != own_name]
        for first in range(0, len(names), 100):
            removed = scripts.call("consumers", [keys.exp], [CONSUMER_GROUP, *names[first:first + 100]])
            count += len(removed)
            if removed:
                log.info("shard %d: removed idle consumers %s", keys.shard,
                         ", ".join(bytes(r).decode(errors="replace") for r in removed))
    return count
