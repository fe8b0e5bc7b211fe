"""Reading new entries for the learner's consumer: move the agents' batches from the shard inboxes
into the streams (``move.lua``), read what the group has not delivered yet (``XREADGROUP ... >``)
without blocking, and when nothing came wait for a batch on one shard's inbox at a time. Each read
is announced on the shard's ``reads`` channel, for the senders waiting on its backlog."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping

import redis
from redis.typing import KeyT, StreamIdT

from surreal_redis.connection import RedisClient, RedisSettings, StreamRead, block_ms, stream_read
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver_config import ReceiverConfig
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys
from surreal_redis.redis_cluster import is_cluster, keyed_command, refresh_topology
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

MOVE_CALLS = 8  # move.lua calls per shard and read: at most 8 x move_items batches a round

BLOCK_SLICE_MS = 50
"""With several shards: the longest one blocking wait watches a single shard's inbox (the latency a
batch on another shard can see when everything was quiet)."""


def xreadgroup(client: RedisClient, consumer: str, streams: Mapping[KeyT, StreamIdT], count: int) -> StreamRead:
    """XREADGROUP without blocking; on a cluster one call per stream (one slot per call), sent
    to the stream's node (:func:`keyed_command`). Returns [(stream, entries), ...] for the
    streams that had entries."""
    if not is_cluster(client):
        return stream_read(client.xreadgroup(CONSUMER_GROUP, consumer, dict(streams), count=count))
    reply: StreamRead = []
    for name, cursor in streams.items():
        reply += stream_read(keyed_command(client, name, "XREADGROUP", "GROUP", CONSUMER_GROUP, consumer,
                                           "COUNT", count, "STREAMS", name, cursor))
    return reply


class NewEntryReader:
    """Moves and reads new entries of some shards for one consumer (the receiver's reading
    thread only).

    ``take(shard, entries)`` queues what a read returned; ``count_dead(reason, shard, count)``
    counts the dead letters ``move.lua`` wrote. Counts: ``moved`` (batches moved into the
    streams), ``duplicates`` (copies of a stored batch dropped), ``move_errors`` (calls refused).
    """

    def __init__(self, client: RedisClient, scripts: Scripts, keys: Mapping[int, ShardKeys], config: ReceiverConfig,
                 settings: RedisSettings, take: Callable[[int, list], int],
                 count_dead: Callable[[str, int, int], None]) -> None:
        self.client, self.scripts, self.keys, self.config, self.settings = client, scripts, keys, config, settings
        self._take, self._count_dead = take, count_dead
        self._shard_of = {k.exp.encode(): s for s, k in keys.items()}
        self._rotation = itertools.cycle(list(keys))  # the shard whose inbox the next wait watches
        self.announce = True  # reads announced on each shard's reads channel
        self.moved = self.duplicates = self.move_errors = 0

    def read(self, max_chunks: int, wait_ms: int) -> None:
        """Move the inboxes into the streams, then read new entries without blocking; while that
        finds nothing and ``wait_ms`` are not over (capped below half the socket timeout), wait
        for a batch in the next shard's inbox, in rotation (:data:`BLOCK_SLICE_MS`), and go again."""
        streams: dict[KeyT, StreamIdT] = {keys.exp: ">" for keys in self.keys.values()}
        count = -(-max_chunks // len(streams))
        block = block_ms(wait_ms, self.settings) if wait_ms > 0 else 0
        deadline = time.monotonic() + block / 1000
        while True:
            self._move_inboxes()
            reply = xreadgroup(self.client, self.config.consumer, streams, count)
            if reply:
                break
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._wait_for_batch(left_ms):
                return
        for name, entries in reply:
            self._take(self._shard_of[bytes(name)], entries)
        for name, entries in reply:
            self._announce_read(self._shard_of[bytes(name)], len(entries))

    def _wait_for_batch(self, left_ms: int) -> bool:
        """Block until a batch is in the next shard's inbox or the slice of ``left_ms`` is over;
        False when the primary blocked on was demoted (nothing read: the next read goes to its
        successor)."""
        inbox = self.keys[next(self._rotation)].inbox
        slice_ms = left_ms if len(self.keys) == 1 else min(left_ms, BLOCK_SLICE_MS)
        # LMOVE of a list's last item onto its own tail changes nothing: it only wakes us
        timeout_s = max(1, slice_ms) / 1000  # fractional seconds (Redis >= 6); redis-py types it int
        try:
            self.client.blmove(inbox, inbox, timeout_s, "RIGHT", "RIGHT")  # type: ignore[arg-type]
        except redis.ResponseError as exc:
            if not str(exc).startswith("UNBLOCKED"):
                raise
            # The primary we blocked on was demoted (a failover) and released its blocked clients.
            log.warning("shard inbox %r: %s; reading from the new primary", inbox, exc)
            refresh_topology(self.client, exc)
            return False
        return True

    def _announce_read(self, shard: int, count: int) -> None:
        """PUBLISH ``count`` on the shard's ``reads`` channel, for the senders waiting on its
        backlog. A user not allowed to publish there is told once, and the senders keep polling."""
        if not self.announce:
            return
        keys = self.keys[shard]
        try:  # on the node just read from, alive (redis-py sends keyless PUBLISH to its default node)
            keyed_command(self.client, keys.exp, "PUBLISH", keys.reads, count)
        except redis.exceptions.NoPermissionError as exc:
            self.announce = False
            log.warning("shard %d: reads are not announced (%s); waiting senders poll the backlog instead. "
                        "Run `surreal-redis acl` again to let this user publish them", shard, exc)

    def _move_inboxes(self) -> None:
        """Move every shard's queued batches into its stream (at most ``MOVE_CALLS`` calls per
        shard). A call the script refuses (it wrote nothing) is counted and logged, and reading
        goes on: what is already in the streams still reaches the learner."""
        cfg = self.config
        for shard, keys in self.keys.items():
            for _ in range(MOVE_CALLS):
                try:
                    moved = move_inbox(self.scripts, keys, cfg.move_items, cfg.seen_ttl_s, cfg.dead_maxlen,
                                       cfg.max_payload_bytes)
                except ScriptError as exc:
                    self.move_errors += 1
                    log.log(logging.ERROR if self.move_errors % 1000 == 1 else logging.DEBUG,
                            "shard %d: moving the inbox failed (%d calls so far), its batches stay queued: %s",
                            shard, self.move_errors, exc)
                    break
                self.moved += moved.taken - moved.duplicates - moved.malformed - moved.failed
                self.duplicates += moved.duplicates
                for reason, count in moved.set_aside.items():
                    self._count_dead(reason, shard, count)
                if moved.done:
                    break
