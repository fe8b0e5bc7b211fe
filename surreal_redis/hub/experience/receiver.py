"""Learner side of the experience path: shard streams -> decoded :class:`Chunk` objects.

Reads through the consumer group ``keys.CONSUMER_GROUP`` (XREADGROUP), resolves observation
digests with one MGET per shard and batch plus a bounded cache of decoded arrays, optionally
verifies every blob's digest, and hands out chunks to be acked once they are in replay. Malformed
entries are counted, logged once per kind, copied to the shard's dead-letter stream and acked: bad
data never stops the reader. :meth:`ExperienceReceiver.read_retained` reads the whole retained
window outside the group (an off-policy learner refilling its replay after a restart).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import redis

from surreal_redis.codec import CodecError, decode_array, digest
from surreal_redis.connection import RedisSettings, block_ms
from surreal_redis.experience import Chunk
from surreal_redis.hub.experience.payload import Layout
from surreal_redis.hub.experience.wire import ParsedEntry, WireError, build_chunk, parse_entry, parse_id
from surreal_redis.keys import CONSUMER_GROUP, RunKeys, ShardKeys
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    """Experience receiver settings.

    ``consumer``: this reader's name in the consumer group (a restarted learner with the same name
    gets its own pending entries back). ``block_ms``: default wait of :meth:`receive`.
    ``cache_entries``: decoded observation arrays kept by digest. ``verify_digests``: check
    blake2b(blob) == digest for every fetched blob. ``claim_min_idle_ms``: at start, take over
    entries pending this long on any consumer (a dead learner's), then remove the group's other
    consumers that have nothing pending. ``dead_maxlen``: approximate cap of the dead-letter
    stream. ``retained_batch``: entries per XRANGE of :meth:`ExperienceReceiver.read_retained`.
    """

    consumer: str = "learner"
    block_ms: int = 1000
    cache_entries: int = 8192
    verify_digests: bool = True
    claim_min_idle_ms: int = 60_000
    claim_count: int = 100
    dead_maxlen: int = 10_000
    retained_batch: int = 256

    def __post_init__(self) -> None:
        if not self.consumer or not isinstance(self.consumer, str):
            raise ValueError(f"receiver.consumer must be a non-empty string, got {self.consumer!r}")
        for name in ("block_ms", "cache_entries", "claim_min_idle_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"receiver.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("claim_count", "dead_maxlen", "retained_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"receiver.{name} must be >= 1, got {getattr(self, name)}")


class ReceivedChunk(NamedTuple):
    """A decoded chunk and what :meth:`ExperienceReceiver.ack` needs; ``nbytes``: entry size."""

    chunk: Chunk
    shard: int
    entry_id: bytes
    nbytes: int


class ReceiverStats(NamedTuple):
    """Cumulative receiver counters (for metrics). ``chunks``, ``steps``, ``dead``: of
    :meth:`~ExperienceReceiver.receive`; ``bytes`` counts its entries and every fetched blob;
    ``claimed``: entries taken over from other consumers, ``consumers_removed``: idle consumers
    deleted at start; ``retained``/``retained_skipped``: chunks yielded / malformed entries
    skipped by :meth:`~ExperienceReceiver.read_retained`."""

    chunks: int
    steps: int
    bytes: int
    dead: int
    cache_hits: int
    cache_misses: int
    claimed: int
    consumers_removed: int
    retained: int
    retained_skipped: int


_Entry = tuple[int, bytes, dict]  # (shard, entry id, raw fields)
_Failure = tuple[str, str, int, bytes, dict]  # (reason, detail, shard, entry id, raw fields)


class ExperienceReceiver:
    """Reads experience chunks of some shards of one run.

    Not thread-safe; use one receiver per reader thread (with distinct ``shards`` or consumer
    names). On Redis Cluster give each receiver one shard: one XREADGROUP may not span slots.
    Blocking calls wait at most ``block_ms`` (capped below half the socket timeout); connection
    errors propagate once the client's own retries are spent.
    """

    def __init__(self, client: redis.Redis, config: ReceiverConfig, run: str, num_shards: int,
                 shards: Sequence[int] | None = None, settings: RedisSettings | None = None) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        shards = list(range(num_shards)) if shards is None else list(shards)
        bad = [s for s in shards if not 0 <= s < num_shards]
        if bad or not shards:
            raise ValueError(f"shards {shards} must be a non-empty subset of 0..{num_shards - 1}")
        self.client, self.config = client, config
        self.settings = settings or RedisSettings()
        run_keys = RunKeys(run)
        self._keys: dict[int, ShardKeys] = {s: run_keys.shard(s) for s in shards}
        self._shard_of = {k.exp.encode(): s for s, k in self._keys.items()}
        self._claimed: deque[tuple[int, bytes, dict]] = deque()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._layouts: dict[bytes, Layout] = {}  # parsed chunk templates, one per sender layout
        self._started = False
        self._scripts = Scripts(client)
        self._logged: set[str] = set()
        self.dead_by_reason: dict[str, int] = {}
        self.skipped_by_reason: dict[str, int] = {}
        self._counts = dict.fromkeys(ReceiverStats._fields, 0)

    def stats(self) -> ReceiverStats:
        return ReceiverStats(**self._counts)

    def start(self) -> int:
        """Create missing consumer groups (from the stream start, MKSTREAM), load the agents'
        insert script, and claim entries left pending by other consumers; they are returned first
        by :meth:`receive`. Returns how many were claimed. Called by the first :meth:`receive` if
        not called before."""
        self._create_groups()
        claimed = 0
        for shard, keys in self._keys.items():
            cursor = b"0-0"
            while True:
                reply = self.client.xautoclaim(keys.exp, CONSUMER_GROUP, self.config.consumer,
                                               self.config.claim_min_idle_ms, cursor,
                                               count=self.config.claim_count)
                cursor, entries = reply[0], reply[1]
                for entry_id, fields in entries:
                    if entry_id is not None and fields is not None:
                        self._claimed.append((shard, entry_id, fields))
                        claimed += 1
                if cursor in (b"0-0", "0-0"):
                    break
        if claimed:
            log.info("claimed %d entries pending on other consumers", claimed)
        self._counts["claimed"] += claimed
        self._remove_idle_consumers()
        self._started = True
        return claimed

    def _remove_idle_consumers(self) -> None:
        """Delete the group's consumers other than ours that have no pending entries (dead
        learners' names would pile up otherwise). ``lua/consumers.lua`` re-checks each one
        atomically, so a live reader that just took entries keeps them."""
        own = self.config.consumer.encode()
        for keys in self._keys.values():
            names = [c["name"] for c in self.client.xinfo_consumers(keys.exp, CONSUMER_GROUP)
                     if c["pending"] == 0 and c["name"] != own]
            for first in range(0, len(names), 100):
                removed = self._scripts.call("consumers", [keys.exp], [CONSUMER_GROUP, *names[first:first + 100]])
                self._counts["consumers_removed"] += len(removed)
                if removed:
                    log.info("shard %d: removed idle consumers %s", keys.shard,
                             ", ".join(bytes(r).decode(errors="replace") for r in removed))

    def load_agent_scripts(self) -> None:
        """(Re)load ``insert.lua`` for agents whose ACL user may run scripts but not load them.
        The learner calls this at start, after a server restart (NOGROUP) and periodically, so a
        ``SCRIPT FLUSH`` stalls agents for one housekeeping interval at most. One round trip."""
        self.client.script_load(self._scripts.get("insert").script)

    def _create_groups(self) -> None:
        """Create the consumer groups and load the agents' script (see :meth:`load_agent_scripts`)."""
        self.load_agent_scripts()
        for keys in self._keys.values():
            try:
                self.client.xgroup_create(keys.exp, CONSUMER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def receive(self, max_chunks: int = 256, block_ms: int | None = None) -> list[ReceivedChunk]:
        """Up to ``max_chunks`` chunks (rounded up to a multiple of the number of shards read),
        claimed ones first. Waits up to ``block_ms`` (default ``config.block_ms``; 0: do not wait)
        when nothing is available; returns ``[]`` on timeout. Malformed entries are set aside and
        acked here; the returned ones must be passed to :meth:`ack` once stored."""
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        if not self._started:
            self.start()
        entries = [self._claimed.popleft() for _ in range(min(max_chunks, len(self._claimed)))]
        if not entries:
            entries = self._read(max_chunks, self.config.block_ms if block_ms is None else block_ms)
        return self._process(entries) if entries else []

    def ack(self, received: Iterable[ReceivedChunk]) -> int:
        """XACK the given chunks (one round trip); returns how many were still pending."""
        by_shard: dict[int, list[bytes]] = {}
        for item in received:
            by_shard.setdefault(item.shard, []).append(item.entry_id)
        if not by_shard:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for shard, ids in by_shard.items():
            pipe.xack(self._keys[shard].exp, CONSUMER_GROUP, *ids)
        return sum(pipe.execute())

    def read_retained(self, max_entries: int | None = None, delivered_only: bool = False) -> Iterator[Chunk]:
        """Every entry retained in this receiver's shard streams, oldest first (shards merged by
        entry id), as decoded chunks: acked entries included, read with XRANGE outside the
        consumer group (nothing is acked, claimed or delivered).

        For an off-policy learner refilling its replay after a restart. Reads up to the newest
        entry of each shard when the call starts (later inserts are left to :meth:`receive`),
        ``config.retained_batch`` entries per round trip, resolving observations like
        :meth:`receive` (cache, MGET, digest check). A malformed entry, or one whose
        observations were collected meanwhile, is counted (``retained_skipped``,
        ``skipped_by_reason``), logged and skipped; it stays in the stream and is not
        dead-lettered again. ``max_entries``: stop after that many entries (good or skipped).
        Blocks for one round trip per batch and shard, lazily, as the iterator is consumed.

        ``delivered_only``: only what the consumer group was already given (up to its
        last-delivered id), and entries still pending (a dead learner read them, never stored
        them) are acked once yielded, so a restarted learner that refills its replay this way
        then gets every other entry from :meth:`receive`, exactly once.
        """
        if max_entries is not None and max_entries < 0:
            raise ValueError(f"max_entries must be >= 0 or None, got {max_entries}")
        pipe = self.client.pipeline(transaction=False)
        for keys in self._keys.values():
            pipe.xrevrange(keys.exp, count=1)
        ends = {shard: last[0][0] for shard, last in zip(self._keys, pipe.execute()) if last}
        pending: dict[int, set[bytes]] = {}
        if delivered_only:
            ends, pending = self._delivered_window(ends)
        merged = heapq.merge(*(self._scan(shard, end) for shard, end in ends.items()),
                             key=lambda entry: parse_id(entry[1]))
        entries = itertools.islice(merged, max_entries)
        while batch := list(itertools.islice(entries, self.config.retained_batch)):
            yield from self._decode_retained(batch)
            stored = [(shard, entry_id) for shard, entry_id, _ in batch if entry_id in pending.get(shard, ())]
            if stored:  # the caller has them now: a later claim must not hand them out again
                pipe = self.client.pipeline(transaction=False)
                for shard, entry_id in stored:
                    pipe.xack(self._keys[shard].exp, CONSUMER_GROUP, entry_id)
                pipe.execute()

    def _delivered_window(self, ends: dict[int, bytes]) -> tuple[dict[int, bytes], dict[int, set[bytes]]]:
        """Per shard: the last id the group was given (capped by ``ends``), and the pending ids."""
        window, pending = {}, {}
        for shard, end in ends.items():
            key = self._keys[shard].exp
            try:
                groups = self.client.xinfo_groups(key)
            except redis.ResponseError:
                continue
            group = next((g for g in groups if g["name"] in (CONSUMER_GROUP, CONSUMER_GROUP.encode())), None)
            if group is None or parse_id(group["last-delivered-id"]) == (0, 0):
                continue  # nothing delivered yet: receive() will hand out everything
            last = group["last-delivered-id"]
            last = last if isinstance(last, bytes) else str(last).encode()
            window[shard] = min(end, last, key=parse_id)
            entries = self.client.xpending_range(key, CONSUMER_GROUP, min="-", max=window[shard], count=100_000)
            pending[shard] = {e["message_id"] for e in entries}
        return window, pending

    # ------------------------------------------------------------ internals

    def _scan(self, shard: int, end: bytes) -> Iterator[_Entry]:
        """Entries of one shard up to ``end`` (inclusive), oldest first, one XRANGE per batch."""
        key, start = self._keys[shard].exp, b"-"
        while True:
            entries = self.client.xrange(key, min=start, max=end, count=self.config.retained_batch)
            for entry_id, fields in entries:
                yield shard, entry_id, fields
            if len(entries) < self.config.retained_batch or entries[-1][0] == end:
                return
            start = b"(" + entries[-1][0]

    def _decode_retained(self, entries: list[_Entry]) -> list[Chunk]:
        good, failures = self._decode(entries)
        for reason, detail, shard, entry_id, _ in failures:
            self._counts["retained_skipped"] += 1
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + 1
            key = "retained:" + reason
            if key not in self._logged:
                self._logged.add(key)
                log.warning("shard %d entry %s skipped while reading the retained window (%s: %s); "
                            "further '%s' entries are logged at debug level", shard, entry_id, reason,
                            detail, reason)
            else:
                log.debug("shard %d entry %s skipped (%s: %s)", shard, entry_id, reason, detail)
        self._counts["retained"] += len(good)
        return [chunk for _, chunk, _ in good]

    def _read(self, max_chunks: int, wait_ms: int) -> list[tuple[int, bytes, dict]]:
        streams = {keys.exp: ">" for keys in self._keys.values()}
        count = -(-max_chunks // len(streams))
        block = block_ms(wait_ms, self.settings) if wait_ms > 0 else None  # BLOCK 0 would wait forever
        try:
            reply = self.client.xreadgroup(CONSUMER_GROUP, self.config.consumer, streams,
                                           count=count, block=block)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream was dropped (server restart without persistence, `gc --drop`): recreate.
            log.warning("consumer group missing (%s); recreating it", exc)
            self._create_groups()
            return []
        return [(self._shard_of[bytes(name)], entry_id, fields)
                for name, entries in reply or [] for entry_id, fields in entries]

    def set_aside(self, item: ReceivedChunk, reason: str, detail: str) -> None:
        """Dead-letter (and ack) a chunk that decoded but that the caller cannot use, e.g. shapes
        that do not match its environment. Counted like malformed entries; two round trips."""
        keys = self._keys[item.shard]
        entries = self.client.xrange(keys.exp, item.entry_id, item.entry_id)
        pipe = self.client.pipeline(transaction=False)
        self._dead(reason, detail, item.shard, item.entry_id, entries[0][1] if entries else None, pipe)
        pipe.execute()

    def _dead(self, reason: str, detail: str, shard: int, entry_id: bytes, fields: Any,
              pipe: redis.client.Pipeline) -> None:
        self._counts["dead"] += 1
        self.dead_by_reason[reason] = self.dead_by_reason.get(reason, 0) + 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("shard %d entry %s set aside (%s: %s); further '%s' entries are logged at "
                        "debug level", shard, entry_id, reason, detail, reason)
        else:
            log.debug("shard %d entry %s set aside (%s: %s)", shard, entry_id, reason, detail)
        keys = self._keys[shard]
        record = {b"id": entry_id, b"reason": reason, b"detail": detail[:1000]}
        if isinstance(fields, dict):
            record.update({b"f." + bytes(k): v for k, v in fields.items()})
        pipe.xadd(keys.dead, record, maxlen=self.config.dead_maxlen, approximate=True)
        pipe.xack(keys.exp, CONSUMER_GROUP, entry_id)

    def _fetch(self, parsed: list[tuple[int, bytes, dict, ParsedEntry]]) -> tuple[dict, dict]:
        """Decoded arrays of every digest the entries need (cache, then one MGET per shard), and
        digest -> (reason, detail) for those that could not be resolved."""
        arrays: dict[str, np.ndarray] = {}
        wanted: dict[int, dict[str, None]] = {}
        cache = self._cache
        for shard, _, _, entry in parsed:
            for d in entry.digests:
                if d in arrays:
                    continue
                cached = cache.get(d)
                if cached is not None:
                    cache.move_to_end(d)
                    arrays[d] = cached
                    self._counts["cache_hits"] += 1
                else:
                    wanted.setdefault(shard, {})[d] = None
        bad: dict[str, tuple[str, str]] = {}
        if not wanted:
            return arrays, bad
        pipe = self.client.pipeline(transaction=False)
        for shard, digests in wanted.items():
            pipe.mget(self._keys[shard].obs_keys(list(digests)))
        for digests, blobs in zip(wanted.values(), pipe.execute()):
            for d, blob in zip(digests, blobs):
                self._counts["cache_misses"] += 1
                if blob is None:
                    bad[d] = ("missing_obs", f"observation {d} is gone (expired or collected)")
                    continue
                self._counts["bytes"] += len(blob)
                if self.config.verify_digests and digest(blob) != d:
                    bad[d] = ("digest_mismatch", f"observation {d} holds data of digest {digest(blob)}")
                    continue
                try:
                    array = decode_array(blob)
                except CodecError as exc:
                    bad[d] = ("codec", f"observation {d}: {exc}")
                    continue
                array.setflags(write=False)  # shared by every chunk referencing the digest
                arrays[d] = array
                if self.config.cache_entries:
                    self._cache[d] = array
        while len(self._cache) > self.config.cache_entries:
            self._cache.popitem(last=False)
        return arrays, bad

    def _decode(self, entries: list[_Entry]) -> tuple[list[tuple[_Entry, Chunk, int]], list[_Failure]]:
        """Parse, resolve and build: ((entry, chunk, entry bytes) of each good entry, failures)."""
        parsed: list[tuple[int, bytes, dict, ParsedEntry]] = []
        failures: list[_Failure] = []
        for shard, entry_id, fields in entries:
            try:
                parsed.append((shard, entry_id, fields, parse_entry(fields, self._layouts)))
            except WireError as exc:
                failures.append(("format", str(exc), shard, entry_id, fields))
            except CodecError as exc:
                failures.append(("codec", str(exc), shard, entry_id, fields))
        arrays, bad = self._fetch(parsed)
        good: list[tuple[_Entry, Chunk, int]] = []
        for shard, entry_id, fields, entry in parsed:
            failed = next((bad[d] for d in entry.digests if d in bad), None)
            if failed is not None:
                failures.append((*failed, shard, entry_id, fields))
                continue
            try:
                chunk = build_chunk(entry, arrays)
            except WireError as exc:
                failures.append(("format", str(exc), shard, entry_id, fields))
                continue
            good.append(((shard, entry_id, fields), chunk, entry.nbytes))
        return good, failures

    def _process(self, entries: list[_Entry]) -> list[ReceivedChunk]:
        good, failures = self._decode(entries)
        out: list[ReceivedChunk] = []
        for (shard, entry_id, _), chunk, nbytes in good:
            out.append(ReceivedChunk(chunk, shard, entry_id, nbytes))
            self._counts["chunks"] += 1
            self._counts["steps"] += chunk.num_steps
            self._counts["bytes"] += nbytes
        if failures:
            pipe = self.client.pipeline(transaction=False)
            for failure in failures:
                self._dead(*failure, pipe)
            for reply in pipe.execute(raise_on_error=False):
                if isinstance(reply, Exception):  # e.g. OOM on the dead-letter XADD; the ack went through
                    log.error("setting a malformed entry aside failed: %s", reply)
        return out
