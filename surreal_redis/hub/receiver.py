"""Learner side of the experience path: shard streams -> decoded :class:`Chunk` objects.

Reads through the consumer group ``keys.CONSUMER_GROUP`` (XREADGROUP), resolves observation
digests with one MGET per shard and batch plus a bounded cache of decoded arrays, optionally
verifies every blob's digest, and hands out chunks to be acked once they are in replay. Malformed
entries are counted, logged once per kind, copied to the shard's dead-letter stream and acked: bad
data never stops the reader.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import redis

from surreal_redis.codec import CodecError, decode_array, digest
from surreal_redis.connection import RedisSettings, block_ms
from surreal_redis.experience import Chunk
from surreal_redis.hub.wire import ParsedEntry, WireError, build_chunk, parse_entry
from surreal_redis.keys import CONSUMER_GROUP, RunKeys, ShardKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    """Experience receiver settings.

    ``consumer``: this reader's name in the consumer group (a restarted learner with the same name
    gets its own pending entries back). ``block_ms``: default wait of :meth:`receive`.
    ``cache_entries``: decoded observation arrays kept by digest. ``verify_digests``: check
    blake2b(blob) == digest for every fetched blob. ``claim_min_idle_ms``: at start, take over
    entries pending this long on any consumer (a dead learner's). ``dead_maxlen``: approximate cap
    of the dead-letter stream.
    """

    consumer: str = "learner"
    block_ms: int = 1000
    cache_entries: int = 8192
    verify_digests: bool = True
    claim_min_idle_ms: int = 60_000
    claim_count: int = 100
    dead_maxlen: int = 10_000

    def __post_init__(self) -> None:
        if not self.consumer or not isinstance(self.consumer, str):
            raise ValueError(f"receiver.consumer must be a non-empty string, got {self.consumer!r}")
        for name in ("block_ms", "cache_entries", "claim_min_idle_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"receiver.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("claim_count", "dead_maxlen"):
            if getattr(self, name) < 1:
                raise ValueError(f"receiver.{name} must be >= 1, got {getattr(self, name)}")


class ReceivedChunk(NamedTuple):
    """A decoded chunk and what :meth:`ExperienceReceiver.ack` needs; ``nbytes``: entry size."""

    chunk: Chunk
    shard: int
    entry_id: bytes
    nbytes: int


class ReceiverStats(NamedTuple):
    """Cumulative receiver counters (for metrics); ``bytes`` counts entries and fetched blobs."""

    chunks: int
    steps: int
    bytes: int
    dead: int
    cache_hits: int
    cache_misses: int
    claimed: int


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
        self._started = False
        self._logged: set[str] = set()
        self.dead_by_reason: dict[str, int] = {}
        self._counts = dict.fromkeys(ReceiverStats._fields, 0)

    def stats(self) -> ReceiverStats:
        return ReceiverStats(**self._counts)

    def start(self) -> int:
        """Create missing consumer groups (from the stream start, MKSTREAM) and claim entries left
        pending by other consumers; they are returned first by :meth:`receive`. Returns how many
        were claimed. Called by the first :meth:`receive` if not called before."""
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
        self._started = True
        return claimed

    def _create_groups(self) -> None:
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

    # ------------------------------------------------------------ internals

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
        wanted: dict[int, list[str]] = {}
        for shard, _, _, entry in parsed:
            for d in entry.digests:
                if d in arrays or d in wanted.get(shard, ()):
                    continue
                cached = self._cache.get(d)
                if cached is not None:
                    self._cache.move_to_end(d)
                    arrays[d] = cached
                    self._counts["cache_hits"] += 1
                else:
                    wanted.setdefault(shard, []).append(d)
        bad: dict[str, tuple[str, str]] = {}
        if not wanted:
            return arrays, bad
        pipe = self.client.pipeline(transaction=False)
        for shard, digests in wanted.items():
            pipe.mget([self._keys[shard].obs(d) for d in digests])
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

    def _process(self, entries: list[tuple[int, bytes, dict]]) -> list[ReceivedChunk]:
        pipe = self.client.pipeline(transaction=False)
        parsed: list[tuple[int, bytes, dict, ParsedEntry]] = []
        for shard, entry_id, fields in entries:
            try:
                parsed.append((shard, entry_id, fields, parse_entry(fields)))
            except WireError as exc:
                self._dead("format", str(exc), shard, entry_id, fields, pipe)
            except CodecError as exc:
                self._dead("codec", str(exc), shard, entry_id, fields, pipe)
        arrays, bad = self._fetch(parsed)
        out: list[ReceivedChunk] = []
        for shard, entry_id, fields, entry in parsed:
            failed = next((bad[d] for d in entry.digests if d in bad), None)
            if failed is not None:
                self._dead(*failed, shard, entry_id, fields, pipe)
                continue
            try:
                chunk = build_chunk(entry, arrays)
            except WireError as exc:
                self._dead("format", str(exc), shard, entry_id, fields, pipe)
                continue
            out.append(ReceivedChunk(chunk, shard, entry_id, entry.nbytes))
            self._counts["chunks"] += 1
            self._counts["steps"] += chunk.num_steps
            self._counts["bytes"] += entry.nbytes
        if len(pipe):
            for reply in pipe.execute(raise_on_error=False):
                if isinstance(reply, Exception):  # e.g. OOM on the dead-letter XADD; the ack went through
                    log.error("setting a malformed entry aside failed: %s", reply)
        return out
