"""Reading a run's retained experience outside the consumer group (XRANGE): an off-policy learner
refilling its replay after a restart (:meth:`ExperienceReceiver.read_retained
<surreal_redis.hub.experience.receiver.ExperienceReceiver.read_retained>`)."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping

import redis

from surreal_redis.chunks import Chunk
from surreal_redis.connection import RedisClient, as_bytes, stream_entries
from surreal_redis.hub.experience.decoding import Entry, EntryDecoder, ReasonLog
from surreal_redis.hub.experience.delivery import ByShard
from surreal_redis.hub.experience.wire import parse_id
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys

log = logging.getLogger(__name__)


def _message_id(entry: Mapping[str, object]) -> bytes:
    """An XPENDING entry's id (bytes from our clients; redis-py types it bytes, str or int)."""
    value = entry["message_id"]
    if not isinstance(value, (bytes, str)):
        raise TypeError(f"XPENDING entry id {value!r} is not a stream id")
    return as_bytes(value)


class RetainedReader:
    """Reads the retained window of some shards' streams, decoding like the receiver.

    ``batch``: entries per XRANGE and per decode; ``stored_elsewhere(by_shard)``: called with
    the pending entries a ``delivered_only`` read yielded (the receiver acks and unqueues them).
    Counts: ``count`` (chunks yielded), ``skipped`` (malformed entries skipped, by reason). Not
    thread-safe: the receiver's reading thread only.
    """

    def __init__(self, client: RedisClient, keys: Mapping[int, ShardKeys], decoder: EntryDecoder, batch: int,
                 stored_elsewhere: Callable[[ByShard], None]) -> None:
        self.client, self.keys, self.decoder, self.batch = client, keys, decoder, batch
        self._stored_elsewhere = stored_elsewhere
        self.count = 0
        self.skipped = ReasonLog(log)

    def read(self, max_entries: int | None = None, delivered_only: bool = False) -> Iterator[Chunk]:
        """See :meth:`ExperienceReceiver.read_retained
        <surreal_redis.hub.experience.receiver.ExperienceReceiver.read_retained>`."""
        if max_entries is not None and max_entries < 0:
            raise ValueError(f"max_entries must be >= 0 or None, got {max_entries}")
        pipe = self.client.pipeline(transaction=False)
        for keys in self.keys.values():
            pipe.xrevrange(keys.exp, count=1)
        ends = {shard: last[0][0] for shard, last in zip(self.keys, pipe.execute()) if last}
        pending: ByShard = {}
        if delivered_only:
            ends, pending = self._delivered_window(ends)
        merged = heapq.merge(*(self._scan(shard, end) for shard, end in ends.items()),
                             key=lambda entry: parse_id(entry[1]))
        entries = itertools.islice(merged, max_entries)
        while batch := list(itertools.islice(entries, self.batch)):
            yield from self._decode(batch)
            stored: ByShard = {}
            for shard, entry_id, _ in batch:
                if entry_id in pending.get(shard, ()):
                    stored.setdefault(shard, set()).add(entry_id)
            if stored:  # the caller has them now: no claim or pending-list read may hand them out again
                self._stored_elsewhere(stored)

    def _delivered_window(self, ends: dict[int, bytes]) -> tuple[dict[int, bytes], ByShard]:
        """Per shard: the last id the group was given (capped by ``ends``), and the pending ids."""
        window, pending = {}, {}
        for shard, end in ends.items():
            key = self.keys[shard].exp
            try:
                groups = self.client.xinfo_groups(key)
            except redis.ResponseError:
                continue
            group = next((g for g in groups if g["name"] in (CONSUMER_GROUP, CONSUMER_GROUP.encode())), None)
            if group is None or parse_id(group["last-delivered-id"]) == (0, 0):
                continue  # nothing delivered yet: receive() will hand out everything
            window[shard] = min(end, as_bytes(group["last-delivered-id"]), key=parse_id)
            entries = self.client.xpending_range(key, CONSUMER_GROUP, min="-", max=window[shard], count=100_000)
            pending[shard] = {_message_id(e) for e in entries}
        return window, pending

    def _scan(self, shard: int, end: bytes) -> Iterator[Entry]:
        """Entries of one shard up to ``end`` (inclusive), oldest first, one XRANGE per batch."""
        key, start = self.keys[shard].exp, b"-"
        while True:
            entries = stream_entries(self.client.xrange(key, min=start, max=end, count=self.batch))
            for entry_id, fields in entries:
                yield shard, entry_id, fields
            if len(entries) < self.batch or entries[-1][0] == end:
                return
            start = b"(" + entries[-1][0]

    def _decode(self, entries: list[Entry]) -> list[Chunk]:
        good, failures = [], []
        while entries:  # entries past a read's byte budget come back deferred: decoded next
            decoded, failed, entries = self.decoder.decode(entries)
            good += decoded
            failures += failed
        for reason, detail, shard, entry_id, _ in failures:
            self.skipped(reason, "shard %d entry %s skipped (%s: %s)", shard, entry_id, reason, detail,
                         first="shard %d entry %s skipped while reading the retained window (%s: %s); "
                         "further '%s' entries are logged at debug level")
        self.count += len(good)
        return [decoded.chunk for decoded in good]
