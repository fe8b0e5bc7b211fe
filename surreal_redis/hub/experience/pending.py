"""Taking entries back from the consumer group's pending lists: this consumer's own (read again on
start and after a connection error, since a lost reply may have put entries there that the
receiver never saw) and those other consumers left pending for ``claim_min_idle_ms`` (a dead
learner's). What the receiver holds is skipped (:class:`~surreal_redis.hub.experience.delivery.Delivery`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from redis.typing import KeyT, StreamIdT

from surreal_redis.connection import RedisClient
from surreal_redis.hub.experience import groups
from surreal_redis.hub.experience.delivery import Delivery
from surreal_redis.hub.experience.new_entries import xreadgroup
from surreal_redis.hub.experience.receiver_config import ReceiverConfig
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)


class PendingReader:
    """Pages of pending entries for one consumer, queued in ``delivery`` (the receiver's reading
    thread only; each page is read under ``delivery.lock``, so acks from another thread wait).

    ``count_trimmed(shard, n)``: entries trimmed while pending that XAUTOCLAIM reported. Counts:
    ``reread`` (taken back from our own list), ``claimed``, ``consumers_removed``.
    """

    def __init__(self, client: RedisClient, scripts: Scripts, keys: Mapping[int, ShardKeys], config: ReceiverConfig,
                 delivery: Delivery, count_trimmed: Callable[[int, int], None]) -> None:
        self.client, self.scripts, self.keys, self.config = client, scripts, keys, config
        self._delivery, self._count_trimmed = delivery, count_trimmed
        self._shard_of = {k.exp.encode(): s for s, k in keys.items()}
        self._own_cursor: dict[int, bytes] = {}  # shards whose own pending list is being read again
        self._claim_cursor: dict[int, bytes] = {}
        self._next_claim = 0.0
        self.reread = self.claimed = self.consumers_removed = 0

    def start(self) -> None:
        """Read our own pending list again (the first page now), and take a page of claims."""
        self.reread_own()
        self._read_own_page()
        self._claim_page()

    def reread_own(self) -> None:
        """Read our own pending list again, from the start, before anything new."""
        self._own_cursor = dict.fromkeys(self.keys, b"0-0")

    def refill(self) -> None:
        """Queue our own pending entries while the list is re-read, then claims when due."""
        delivery = self._delivery
        while self._own_cursor and not delivery.queue:
            self._read_own_page()
        if not delivery.queue and time.monotonic() >= self._next_claim:
            self._claim_page()

    def _read_own_page(self) -> None:
        """One page of this consumer's pending list (XREADGROUP from an id: nothing new is
        delivered) for every shard still being re-read."""
        count, delivery = self.config.claim_count, self._delivery
        with delivery.lock:
            streams: dict[KeyT, StreamIdT] = {self.keys[s].exp: cursor for s, cursor in self._own_cursor.items()}
            reply = xreadgroup(self.client, self.config.consumer, streams, count)
            pages = {self._shard_of[bytes(name)]: entries for name, entries in reply or []}
            for shard in list(self._own_cursor):
                entries = pages.get(shard, [])
                self.reread += delivery.take(shard, entries)
                if len(entries) < count:
                    del self._own_cursor[shard]
                else:
                    self._own_cursor[shard] = entries[-1][0]

    def _claim_page(self) -> None:
        """One XAUTOCLAIM page per shard of entries idle ``claim_min_idle_ms`` (other consumers',
        or ours from a predecessor); once every shard's pass is through, idle consumers are
        removed and the next pass is due ``claim_every_s`` later."""
        cfg, delivery = self.config, self._delivery
        for shard, keys in self.keys.items():
            cursor = self._claim_cursor.get(shard, b"0-0")
            with delivery.lock:
                reply = self.client.xautoclaim(keys.exp, CONSUMER_GROUP, cfg.consumer, cfg.claim_min_idle_ms,
                                               cursor, count=cfg.claim_count)
                cursor, entries = reply[0], reply[1]
                taken = delivery.take(shard, entries)
                # Redis 7 lists the entries trimmed while pending (and drops them from the pending
                # list); those we queued already are counted when processed.
                deleted = sum(not delivery.holds(shard, i) for i in (reply[2] if len(reply) > 2 else []))
            self.claimed += taken
            if deleted:
                self._count_trimmed(shard, deleted)
            if taken:
                log.info("shard %d: claimed %d entries left pending by other consumers", shard, taken)
            if cursor in (b"0-0", "0-0"):
                self._claim_cursor.pop(shard, None)
            else:
                self._claim_cursor[shard] = cursor
        if not self._claim_cursor:
            self.consumers_removed += groups.remove_idle_consumers(self.client, self.scripts, self.keys.values(),
                                                                   cfg.consumer)
            self._next_claim = time.monotonic() + cfg.claim_every_s
