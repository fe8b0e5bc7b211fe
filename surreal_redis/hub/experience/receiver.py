"""Learner side of the experience path: shard inboxes -> shard streams -> decoded :class:`Chunk`
objects.

Agents queue batches in their shard's inbox (a list their ACL user may only append to); before
reading new entries the receiver moves them into the stream with ``lua/move.lua``, which stores
each (sender uuid, seq) once, in queue order, and sets malformed items aside. Reads through the consumer group ``keys.CONSUMER_GROUP`` (XREADGROUP; each read of new entries
is announced on the shard's ``reads`` channel, for the senders waiting on the backlog), fetches the payloads stored
apart (entries with field ``p``: one MGET per shard and batch), resolves observation digests with
one MGET per shard and batch plus a bounded cache of decoded arrays, optionally verifies every
observation blob's digest, and hands out chunks to be acked once they are in replay.

Exactly once: every entry the group hands this consumer stays in its pending list until
:meth:`~ExperienceReceiver.ack` (or until it is set aside). The receiver remembers what it holds
(handed out and not acked, queued, or waiting to be set aside); on start, and after any connection
error (an ``XREADGROUP ... >`` whose reply was lost has already moved entries into the pending
list), it reads its own pending list again from the start and takes back every entry it does not
hold. Across a failover, which can take back the move, the delivery and the ack of chunks the
learner stored, the receiver remembers every chunk's origin (sender uuid, batch seq, index) once
acked (:mod:`surreal_redis.hub.experience.consumed`; kept in the learner's checkpoint) and drops a
copy delivered again (``duplicates_consumed``); a copy of a chunk handed out and not acked yet
stays pending until that chunk is acked (then it is acked too), so a learner stopping in between
gets it back. Entries other consumers left pending for ``claim_min_idle_ms`` are claimed every
``claim_every_s``. Entries trimmed while pending (gone before anyone acked them) are counted
(``pending_trimmed``) and acked. An ack whose reply was lost is sent again with the next one.

No entry can stop the reader: any exception while decoding one entry sets it aside (dead-letter
stream of its shard, with the reason) and the batch goes on (decoding and the checks on observation
blobs: :mod:`surreal_redis.hub.experience.decoding`). When Redis is out of memory, setting aside
waits (capped backoff; the entries stay pending) instead of failing. :meth:`ExperienceReceiver.read_retained` reads the
whole retained window outside the group (an off-policy learner refilling its replay after a restart).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import redis
from redis.typing import KeyT, StreamIdT

from surreal_redis.connection import (
    CONNECTION_ERRORS,
    Backoff,
    RedisClient,
    RedisSettings,
    StreamRead,
    as_bytes,
    block_ms,
    stream_entries,
    stream_read,
)
from surreal_redis.experience import Chunk
from surreal_redis.hub.experience.consumed import ConsumedWindow
from surreal_redis.hub.experience.dead_letters import DeadLetters
from surreal_redis.hub.experience.decoding import Entry, EntryDecoder
from surreal_redis.hub.experience.inbox import DEAD_MAXLEN, MOVE_ITEMS, SEEN_TTL_S, move_inbox
from surreal_redis.hub.experience.ledger import Ledger
from surreal_redis.hub.experience.wire import Origin, WireError, entry_origin, parse_id
from surreal_redis.keys import CONSUMER_GROUP, RunKeys, ShardKeys
from surreal_redis.redis_cluster import is_cluster, keyed_command, node_name, refresh_topology
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

MOVE_CALLS = 8  # move.lua calls per shard and read: at most 8 x move_items batches a round

BLOCK_SLICE_MS = 50
"""With several shards: the longest one blocking wait watches a single shard's inbox (the latency a
batch on another shard can see when everything was quiet)."""

@dataclass(frozen=True)
class ReceiverConfig:
    """Experience receiver settings. Sizes in bytes, times in seconds unless named ``_ms``.

    ``consumer``: this reader's name in the consumer group (a restarted learner with the same name
    gets its own pending entries back at once). ``block_ms``: default wait of :meth:`receive`.
    ``cache_entries``/``cache_bytes``: decoded observation arrays kept by digest (both bound the
    cache). ``max_obs_bytes``: decoded size of one observation blob beyond which it is refused.
    ``verify_digests``: check blake2b(blob) == digest for every fetched observation blob (payload
    blobs are named by random ids, not digests).
    ``claim_min_idle_ms``: take over entries pending this long on other consumers (a dead
    learner's), checked every ``claim_every_s`` (then the group's other consumers with nothing
    pending are removed); ``claim_count``: entries per claim or pending-list read.
    ``dead_maxlen``: approximate cap of the dead-letter stream. ``move_items``: inbox batches per
    ``move.lua`` call; ``seen_ttl_s``: how long a sender's dedup window is kept after its last
    batch (a batch resent later than that would be stored twice). ``retained_batch``: entries per
    XRANGE of :meth:`ExperienceReceiver.read_retained`. ``retry_base_s``/``retry_cap_s``: backoff
    of setting entries aside while Redis is out of memory.
    """

    consumer: str = "learner"
    block_ms: int = 1000
    cache_entries: int = 8192
    cache_bytes: int = 64 << 20
    max_obs_bytes: int = 64 << 20
    verify_digests: bool = True
    claim_min_idle_ms: int = 60_000
    claim_every_s: float = 30.0
    claim_count: int = 100
    dead_maxlen: int = DEAD_MAXLEN
    move_items: int = MOVE_ITEMS
    seen_ttl_s: int = SEEN_TTL_S
    retained_batch: int = 256
    retry_base_s: float = 0.1
    retry_cap_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.consumer or not isinstance(self.consumer, str):
            raise ValueError(f"receiver.consumer must be a non-empty string, got {self.consumer!r}")
        for name in ("block_ms", "cache_entries", "cache_bytes", "claim_min_idle_ms", "claim_every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"receiver.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("claim_count", "dead_maxlen", "retained_batch", "max_obs_bytes", "seen_ttl_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"receiver.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.retry_base_s <= self.retry_cap_s:
            raise ValueError(f"need 0 < receiver.retry_base_s <= retry_cap_s, got {self.retry_base_s}, "
                             f"{self.retry_cap_s}")
        if not 1 <= self.move_items <= 256:
            raise ValueError(f"receiver.move_items must be in 1..256, got {self.move_items}")


class ReceivedChunk(NamedTuple):
    """A decoded chunk and what :meth:`ExperienceReceiver.ack` needs; ``nbytes``: entry size;
    ``origin``: where the chunk came from (None for an entry written without one)."""

    chunk: Chunk
    shard: int
    entry_id: bytes
    nbytes: int
    origin: Origin | None = None


class ReceiverStats(NamedTuple):
    """Cumulative receiver counters (for metrics). ``chunks``, ``steps``, ``dead``: of
    :meth:`~ExperienceReceiver.receive` (``dead``: entries set aside, counted once written);
    ``bytes`` counts its entries and every fetched blob; ``claimed``: entries taken over from
    other consumers; ``reread``: entries taken back from this consumer's own pending list (given
    to a predecessor, or read by a call whose reply was lost); ``pending_trimmed``: entries
    trimmed while pending, lost before anyone stored them; ``dead_retries``: attempts to set
    entries aside that Redis refused (out of memory); ``consumers_removed``: idle consumers
    deleted; ``retained``/``retained_skipped``: chunks yielded / malformed entries skipped by
    :meth:`~ExperienceReceiver.read_retained`; ``cached_bytes`` (a gauge): decoded observations
    in the cache now; ``moved``/``duplicates``: agents' batches moved from the inbox into the
    stream / dropped there as copies of a stored one (resent after a lost reply); malformed inbox
    items are set aside (``dead``, reason ``malformed_batch``, or ``script_error`` when storing one
    failed); ``move_errors``: move.lua calls refused as a whole (logged; reading goes on);
    ``duplicates_consumed``: entries dropped (and acked) because the learner already consumed
    their chunk (delivered again after a failover took back its move, delivery and ack)."""

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
    reread: int = 0
    pending_trimmed: int = 0
    dead_retries: int = 0
    cached_bytes: int = 0
    moved: int = 0
    duplicates: int = 0
    move_errors: int = 0
    duplicates_consumed: int = 0

    def as_metrics(self) -> dict[str, float]:
        """These counters as the learner's ``hub/`` metrics, by name (``_total``: since the start)."""
        return {
            "hub/dead_entries_total": float(self.dead),
            "hub/move_errors_total": float(self.move_errors),
            "hub/reread_entries_total": float(self.reread),
            "hub/pending_trimmed_total": float(self.pending_trimmed),
            "hub/batches_moved_total": float(self.moved),
            "hub/duplicate_batches_total": float(self.duplicates),
            "hub/duplicates_consumed_total": float(self.duplicates_consumed),
            "hub/dead_retries_total": float(self.dead_retries),
            "hub/obs_cache_mb": self.cached_bytes / 2**20,
            "hub/obs_cache_hit_ratio": self.cache_hits / max(1, self.cache_hits + self.cache_misses),
        }


def _origin_or_none(fields: Mapping[bytes, bytes]) -> Origin | None:
    """The origin of an entry that may be malformed (None when it has none or a bad one)."""
    try:
        return entry_origin(fields)
    except WireError:
        return None


def _message_id(entry: Mapping[str, object]) -> bytes:
    """An XPENDING entry's id (bytes from our clients; redis-py types it bytes, str or int)."""
    value = entry["message_id"]
    if not isinstance(value, (bytes, str)):
        raise TypeError(f"XPENDING entry id {value!r} is not a stream id")
    return as_bytes(value)


class ExperienceReceiver:
    """Reads experience chunks of some shards of one run.

    :meth:`receive` (and :meth:`read_retained`) from one thread; :meth:`ack` and :meth:`set_aside`
    may be called from another. Use one receiver per reader thread (with distinct ``shards`` or
    consumer names). Agents queue batches in each shard's inbox; reading new entries first moves
    them into the stream (``move.lua``), then reads without blocking; when nothing came, it waits
    for a batch on one shard's inbox at a time (at most ``BLOCK_SLICE_MS`` each when there are
    several shards, in rotation, so a quiet shard never starves the others), then moves and reads
    again. Blocking calls wait at most ``block_ms`` (capped below half the socket timeout).
    Connection errors propagate (nothing is lost: see the module docstring); the next call
    recovers. Out-of-memory replies never do: they are waited out.
    """

    def __init__(self, client: RedisClient, config: ReceiverConfig, run: str, num_shards: int,
                 shards: Sequence[int] | None = None, settings: RedisSettings | None = None,
                 ledger: Ledger | None = None) -> None:
        """``ledger``: where the chunks acked and set aside are recorded (default: the one
        ``SURREAL_LEDGER_DIR`` names, usually none; :mod:`surreal_redis.hub.experience.ledger`)."""
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
        self._decoder = EntryDecoder(client, self._keys, config)
        self._started = False
        self._scripts = Scripts(client)
        self._logged: set[str] = set()
        self.skipped_by_reason: dict[str, int] = {}
        self._counts = dict.fromkeys(ReceiverStats._fields, 0)
        # What this receiver holds, so re-reading its pending list never hands an entry out twice.
        # The lock orders pending-list reads against acks from the caller's thread.
        self._lock = threading.RLock()
        self._queue: deque[Entry] = deque()  # taken into our pending list, not yet processed
        self._held: set[tuple[int, bytes]] = set()  # queued, handed out and unacked, or being set aside
        self._unacked: dict[int, set[bytes]] = {}  # acks whose reply was lost: sent again
        self._consumed = ConsumedWindow()  # origins of the chunks acked (stored by the caller)
        # origins handed out and not acked -> copies delivered meanwhile, kept pending until then
        self._in_flight: dict[Origin, list[tuple[int, bytes]]] = {}
        self._dead = DeadLetters(client, self._keys, config.dead_maxlen,
                                 Backoff(config.retry_base_s, config.retry_cap_s), self._ack_ids, self._lock)
        self._oom_backoff = Backoff(config.retry_base_s, config.retry_cap_s)
        self._own_cursor: dict[int, bytes] = {}  # shards whose own pending list is being read again
        self._claim_cursor: dict[int, bytes] = {}
        self._next_claim = 0.0
        self._cluster = is_cluster(client)
        self._rotation = itertools.cycle(list(self._keys))  # the shard whose inbox the next wait watches
        self._ledger = ledger if ledger is not None else Ledger.from_environment("learner")
        self._announce = True  # reads announced on each shard's reads channel

    def count_dead_letters(self, reason: str, shard: int, count: int) -> None:
        """Count ``count`` records another mover of this run (the janitor's ``move.lua`` calls)
        wrote to ``shard``'s dead-letter stream, so ``dead`` covers every entry set aside. Safe
        from any thread."""
        with self._lock:
            self._dead.count_written(reason, shard, count)

    @property
    def dead_by_reason(self) -> dict[str, int]:
        """Entries set aside by :meth:`receive` and :meth:`set_aside`, by reason."""
        return self._dead.by_reason

    def consumed_state(self) -> dict:
        """The consumed window (for the learner's checkpoint). Safe from any thread."""
        with self._lock:
            return self._consumed.state_dict()

    def load_consumed(self, state: dict) -> None:
        """Restore :meth:`consumed_state` (a learner resuming from its checkpoint)."""
        with self._lock:
            self._consumed.load_state_dict(state)

    def stats(self) -> ReceiverStats:
        decoder = self._decoder
        return ReceiverStats(**{**self._counts, "bytes": self._counts["bytes"] + decoder.blob_bytes,
                                "cache_hits": decoder.cache_hits, "cache_misses": decoder.cache_misses,
                                "cached_bytes": decoder.cached_bytes, "dead": self._dead.written,
                                "dead_retries": self._dead.retries})

    def start(self) -> int:
        """Create missing consumer groups (from the stream start, MKSTREAM), load the agents'
        insert script, and take the first page of this consumer's own pending entries and of
        entries other consumers left pending (the rest follows page by page); they are returned
        first by :meth:`receive`. Returns how many entries were taken. Called by the first
        :meth:`receive` if not called before. Works in a full Redis once the groups exist."""
        self._create_groups()
        self._own_cursor = dict.fromkeys(self._keys, b"0-0")
        before = len(self._queue)
        self._read_own_pending()
        self._claim_page()
        self._started = True
        return len(self._queue) - before

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
        ``SCRIPT FLUSH`` stalls agents for one housekeeping interval at most. Loaded on the server
        of each shard (in a cluster, every primary at once failed while one was down): one round
        trip per server."""
        servers = {node_name(self.client, keys.exp): keys.exp for keys in self._keys.values()}
        for key in servers.values():
            self._scripts.load("insert", key)

    def _create_groups(self) -> None:
        """Create the missing consumer groups and load the agents' script (see
        :meth:`load_agent_scripts`). An existing group is left alone (XGROUP CREATE is refused
        in a full Redis, even when it would only answer BUSYGROUP)."""
        self.load_agent_scripts()
        for keys in self._keys.values():
            try:
                groups = self.client.xinfo_groups(keys.exp)
            except redis.ResponseError as exc:
                if "no such key" not in str(exc).lower():
                    raise
                groups = []
            if any(g["name"] in (CONSUMER_GROUP, CONSUMER_GROUP.encode()) for g in groups):
                continue
            try:
                self.client.xgroup_create(keys.exp, CONSUMER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def receive(self, max_chunks: int = 256, block_ms: int | None = None) -> list[ReceivedChunk]:
        """Up to ``max_chunks`` chunks (rounded up to a multiple of the number of shards read):
        entries this consumer was given before and does not hold (its own pending list, read
        again on start and after connection errors) and claimed ones first, then new ones.

        Waits up to ``block_ms`` (default ``config.block_ms``; 0: do not wait) when nothing is
        available; returns ``[]`` on timeout, and after waiting out an out-of-memory refusal.
        Malformed entries are set aside and acked here; the returned ones must be passed to
        :meth:`ack` once stored (or to :meth:`set_aside`). Connection errors propagate; the next
        call re-reads the pending list, so nothing a lost reply carried is lost.
        """
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        wait_ms = self.config.block_ms if block_ms is None else block_ms
        try:
            if not self._started:
                self.start()
            self._settle()
            if not self._queue:
                self._refill(max_chunks, wait_ms)
            with self._lock:
                entries = [self._queue.popleft() for _ in range(min(max_chunks, len(self._queue)))]
            if not entries:
                return []
            try:
                out = self._process(entries)
            except BaseException:
                with self._lock:  # still held: processed on the next call
                    self._queue.extendleft(reversed(entries))
                raise
            self._oom_backoff.reset()
            return out
        except CONNECTION_ERRORS:
            self._lost_connection()
            raise
        except redis.exceptions.OutOfMemoryError as exc:
            self._wait_out_oom(exc, wait_ms)
            return []
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream was dropped (server restart without persistence, `gc --drop`): recreate.
            log.warning("consumer group missing (%s); recreating it", exc)
            self._started = False
            return []

    def ack(self, received: Iterable[ReceivedChunk]) -> int:
        """XACK the given chunks (one round trip; acks whose reply was lost before go along);
        returns how many were still pending. On a connection error the acks are kept and sent
        with the next call (XACK is idempotent), and the error propagates."""
        by_shard: dict[int, set[bytes]] = {}
        received = list(received)
        with self._lock:
            for item in received:
                by_shard.setdefault(item.shard, set()).add(item.entry_id)
                for shard, entry_id in self._settle_origin(item.origin):
                    by_shard.setdefault(shard, set()).add(entry_id)
            if self._ledger is not None:  # consumed from here on, like the consumed window says
                self._ledger.trained(item.origin for item in received)
        return self._ack_ids(by_shard)

    def _settle_origin(self, origin: Origin | None) -> list[tuple[int, bytes]]:
        """Record ``origin`` as consumed; returns the copies of it held pending meanwhile (to be
        acked). Called with the lock held."""
        if origin is None:
            return []
        self._consumed.add(origin)
        return self._in_flight.pop(origin, [])

    def set_aside(self, item: ReceivedChunk, reason: str, detail: str) -> None:
        """Dead-letter (and ack) a chunk that decoded but that the caller cannot use, e.g. shapes
        that do not match its environment. Counted like malformed entries. While Redis is out of
        memory the entry stays pending and is set aside later (by :meth:`receive`); never raises
        for that. Two round trips."""
        keys = self._keys[item.shard]
        entries = stream_entries(self.client.xrange(keys.exp, item.entry_id, item.entry_id))
        self._dead.add([(reason, detail, item.shard, item.entry_id, entries[0][1] if entries else {})])
        self._dead.flush(force=True)
        with self._lock:  # set aside once: its copies are dropped like those of a stored chunk
            copies = self._settle_origin(item.origin)
            if self._ledger is not None:
                self._ledger.dead([item.origin])
        if copies:
            by_shard: dict[int, set[bytes]] = {}
            for shard, entry_id in copies:
                by_shard.setdefault(shard, set()).add(entry_id)
            self._ack_ids(by_shard)

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
            stored: dict[int, set[bytes]] = {}
            for shard, entry_id, _ in batch:
                if entry_id in pending.get(shard, ()):
                    stored.setdefault(shard, set()).add(entry_id)
            if stored:  # the caller has them now: no claim or pending-list read may hand them out again
                self._ack_ids(stored)
                with self._lock:
                    self._queue = deque(e for e in self._queue if e[1] not in stored.get(e[0], ()))

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
            pending[shard] = {_message_id(e) for e in entries}
        return window, pending

    # ------------------------------------------------------------ taking entries

    def _lost_connection(self) -> None:
        """After a connection error: read our own pending list again before anything new (a
        lost XREADGROUP/XAUTOCLAIM reply has put entries there that we never saw)."""
        if self._started:
            self._own_cursor = dict.fromkeys(self._keys, b"0-0")

    def _take(self, shard: int, entries: list) -> int:
        """Queue the entries (id, fields) this receiver does not hold yet; returns how many.
        Called with the lock held."""
        taken = 0
        for entry_id, fields in entries:
            if entry_id is None or (shard, entry_id) in self._held:
                continue
            self._held.add((shard, entry_id))
            self._queue.append((shard, entry_id, fields or {}))
            taken += 1
        return taken

    def _refill(self, max_chunks: int, wait_ms: int) -> None:
        """Queue entries: our own pending list while it is being re-read, then a page of claims
        when one is due, else new entries (blocking up to ``wait_ms``)."""
        while self._own_cursor and not self._queue:
            self._read_own_pending()
        if not self._queue and time.monotonic() >= self._next_claim:
            self._claim_page()
        if not self._queue:
            self._read_new(max_chunks, wait_ms)

    def _read_own_pending(self) -> None:
        """One page of this consumer's pending list (XREADGROUP from an id: nothing new is
        delivered) for every shard still being re-read."""
        count = self.config.claim_count
        with self._lock:
            streams: dict[KeyT, StreamIdT] = {self._keys[s].exp: cursor
                                              for s, cursor in self._own_cursor.items()}
            reply = self._xreadgroup(streams, count)
            pages = {self._shard_of[bytes(name)]: entries for name, entries in reply or []}
            for shard in list(self._own_cursor):
                entries = pages.get(shard, [])
                self._counts["reread"] += self._take(shard, entries)
                if len(entries) < count:
                    del self._own_cursor[shard]
                else:
                    self._own_cursor[shard] = entries[-1][0]

    def _claim_page(self) -> None:
        """One XAUTOCLAIM page per shard of entries idle ``claim_min_idle_ms`` (other consumers',
        or ours from a predecessor); once every shard's pass is through, idle consumers are
        removed and the next pass is due ``claim_every_s`` later."""
        cfg = self.config
        for shard, keys in self._keys.items():
            cursor = self._claim_cursor.get(shard, b"0-0")
            with self._lock:
                reply = self.client.xautoclaim(keys.exp, CONSUMER_GROUP, cfg.consumer, cfg.claim_min_idle_ms,
                                               cursor, count=cfg.claim_count)
                cursor, entries = reply[0], reply[1]
                taken = self._take(shard, entries)
                # Redis 7 lists the entries trimmed while pending (and drops them from the pending
                # list); those we queued already are counted when processed.
                deleted = sum((shard, i) not in self._held for i in (reply[2] if len(reply) > 2 else []))
            self._counts["claimed"] += taken
            if deleted:
                self._count_trimmed(shard, deleted)
            if taken:
                log.info("shard %d: claimed %d entries left pending by other consumers", shard, taken)
            if cursor in (b"0-0", "0-0"):
                self._claim_cursor.pop(shard, None)
            else:
                self._claim_cursor[shard] = cursor
        if not self._claim_cursor:
            self._remove_idle_consumers()
            self._next_claim = time.monotonic() + cfg.claim_every_s

    def _read_new(self, max_chunks: int, wait_ms: int) -> None:
        """Move the inboxes into the streams, then read new entries without blocking; while that
        finds nothing and ``wait_ms`` are not over, wait for a batch in the next shard's inbox
        and go again."""
        streams: dict[KeyT, StreamIdT] = {keys.exp: ">" for keys in self._keys.values()}
        count = -(-max_chunks // len(streams))
        block = block_ms(wait_ms, self.settings) if wait_ms > 0 else 0
        deadline = time.monotonic() + block / 1000
        while True:
            self._move_inboxes()
            reply = self._xreadgroup(streams, count)
            if reply:
                break
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return
            inbox = self._keys[next(self._rotation)].inbox
            slice_ms = left_ms if len(self._keys) == 1 else min(left_ms, BLOCK_SLICE_MS)
            # LMOVE of a list's last item onto its own tail changes nothing: it only wakes us
            # BLMOVE takes fractional seconds (Redis >= 6); redis-py types the timeout as int
            timeout_s = max(1, slice_ms) / 1000
            try:
                self.client.blmove(inbox, inbox, timeout_s, "RIGHT", "RIGHT")  # type: ignore[arg-type]
            except redis.ResponseError as exc:
                if not str(exc).startswith("UNBLOCKED"):
                    raise
                # The primary we blocked on was demoted (a failover) and released its blocked
                # clients: nothing was read; the next read goes to its successor.
                log.warning("shard inbox %r: %s; reading from the new primary", inbox, exc)
                refresh_topology(self.client, exc)
                return
        with self._lock:
            for name, entries in reply:
                self._take(self._shard_of[bytes(name)], entries)
        for name, entries in reply:
            self._announce_read(self._shard_of[bytes(name)], len(entries))

    def _announce_read(self, shard: int, count: int) -> None:
        """PUBLISH ``count`` on the shard's ``reads`` channel: senders waiting on its backlog look
        again now instead of at their next poll. A user not allowed to publish there (made by an
        older ``surreal-redis acl``) is told once, and the senders keep polling."""
        if not self._announce:
            return
        keys = self._keys[shard]
        try:  # on the node just read from, alive (redis-py sends keyless PUBLISH to its default node)
            keyed_command(self.client, keys.exp, "PUBLISH", keys.reads, count)
        except redis.exceptions.NoPermissionError as exc:
            self._announce = False
            log.warning("shard %d: reads are not announced (%s); waiting senders poll the backlog instead. "
                        "Run `surreal-redis acl` again to let this user publish them", shard, exc)

    def _move_inboxes(self) -> None:
        """Move every shard's queued batches into its stream (``move.lua``, ``move_items`` per
        call, until the inbox is empty and its pins are scored, or ``MOVE_CALLS`` calls per shard). It runs in a full
        Redis too. A call the script refuses (it wrote nothing) is counted and logged, and
        reading goes on: what is already in the streams still reaches the learner."""
        cfg = self.config
        for shard, keys in self._keys.items():
            for _ in range(MOVE_CALLS):
                try:
                    moved = move_inbox(self._scripts, keys, cfg.move_items, cfg.seen_ttl_s, cfg.dead_maxlen)
                except ScriptError as exc:
                    errors = self._counts["move_errors"] = self._counts["move_errors"] + 1
                    log.log(logging.ERROR if errors % 1000 == 1 else logging.DEBUG,
                            "shard %d: moving the inbox failed (%d calls so far), its batches stay queued: %s",
                            shard, errors, exc)
                    break
                self._counts["moved"] += moved.taken - moved.duplicates - moved.malformed - moved.failed
                self._counts["duplicates"] += moved.duplicates
                for reason, count in moved.set_aside.items():
                    self._dead.count_written(reason, shard, count)
                if moved.done:
                    break

    def _xreadgroup(self, streams: dict[KeyT, StreamIdT], count: int) -> StreamRead:
        """XREADGROUP without blocking; on a cluster one call per stream (one slot per call), sent
        to the stream's node (:func:`keyed_command`). Returns [(stream, entries), ...] for the
        streams that had entries."""
        consumer = self.config.consumer
        if not self._cluster:
            return stream_read(self.client.xreadgroup(CONSUMER_GROUP, consumer, streams, count=count))
        reply: StreamRead = []
        for name, cursor in streams.items():
            reply += stream_read(keyed_command(self.client, name, "XREADGROUP", "GROUP", CONSUMER_GROUP, consumer,
                                               "COUNT", count, "STREAMS", name, cursor))
        return reply

    def _count_trimmed(self, shard: int, count: int) -> None:
        self._counts["pending_trimmed"] += count
        log.warning("shard %d: %d entries were trimmed while pending, before anyone stored them "
                    "(retention.max_entries too small for a slow or absent learner)", shard, count)

    def _wait_out_oom(self, exc: BaseException, wait_ms: int) -> None:
        delay = min(self._oom_backoff.next_delay(), wait_ms / 1000)
        log.warning("Redis is out of memory (%s); receiver waits %.2fs", exc, delay)
        time.sleep(delay)

    # ------------------------------------------------------------ acking and setting aside

    def _settle(self) -> None:
        """Send acks whose reply was lost, and set aside what is due."""
        if self._unacked:
            self._ack_ids({})
        self._dead.flush()

    def _ack_ids(self, by_shard: dict[int, set[bytes]]) -> int:
        """XACK ``by_shard`` plus the acks still owed; returns how many were still pending."""
        with self._lock:
            owed = {s: set(ids) for s, ids in self._unacked.items()}
            for shard, ids in by_shard.items():
                owed.setdefault(shard, set()).update(ids)
            if not owed:
                return 0
            pipe = self.client.pipeline(transaction=False)
            for shard, ids in owed.items():
                pipe.xack(self._keys[shard].exp, CONSUMER_GROUP, *ids)
            try:
                acked = sum(pipe.execute())
            except CONNECTION_ERRORS:
                self._unacked = owed
                raise
            self._unacked = {}
            for shard, ids in owed.items():
                self._held.difference_update((shard, i) for i in ids)
            return acked

    # ------------------------------------------------------------ decoding

    def _scan(self, shard: int, end: bytes) -> Iterator[Entry]:
        """Entries of one shard up to ``end`` (inclusive), oldest first, one XRANGE per batch."""
        key, start = self._keys[shard].exp, b"-"
        while True:
            entries = stream_entries(
                self.client.xrange(key, min=start, max=end, count=self.config.retained_batch))
            for entry_id, fields in entries:
                yield shard, entry_id, fields
            if len(entries) < self.config.retained_batch or entries[-1][0] == end:
                return
            start = b"(" + entries[-1][0]

    def _decode_retained(self, entries: list[Entry]) -> list[Chunk]:
        good, failures = self._decoder.decode(entries)
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

    def _process(self, entries: list[Entry]) -> list[ReceivedChunk]:
        """Decode held entries: good ones are returned (held until acked), malformed ones set
        aside, ones trimmed while pending counted and acked."""
        gone: dict[int, set[bytes]] = {}
        for shard, entry_id, fields in entries:
            if not fields:
                gone.setdefault(shard, set()).add(entry_id)
        good, failures = self._decoder.decode([e for e in entries if e[2]])
        for shard, ids in gone.items():
            self._count_trimmed(shard, len(ids))
        if gone:
            try:
                self._ack_ids(gone)
            except CONNECTION_ERRORS:
                pass  # kept in _unacked: sent with the next ack
        if failures:
            if self._ledger is not None:  # before writing: a failed write leaves them pending, set aside later
                self._ledger.dead(_origin_or_none(fields) for *_, fields in failures)
            self._dead.add(failures)
            self._dead.flush(force=True)
        return self._hand_out(good)

    def _hand_out(self, good: list) -> list[ReceivedChunk]:
        """The decoded entries whose chunk was not consumed yet; nothing after this may raise
        (what it hands out is in flight). Copies of consumed chunks are acked (a lost reply is
        sent again with the next ack), copies of chunks in flight stay pending until those are
        acked."""
        out: list[ReceivedChunk] = []
        consumed: dict[int, set[bytes]] = {}
        with self._lock:
            for (shard, entry_id, fields), chunk, nbytes in good:
                origin = entry_origin(fields)  # checked by the decoder already
                if origin is not None and (self._consumed.seen(origin) or origin in self._in_flight):
                    self._counts["duplicates_consumed"] += 1
                    if origin in self._in_flight:
                        self._in_flight[origin].append((shard, entry_id))
                    else:
                        consumed.setdefault(shard, set()).add(entry_id)
                    continue
                if origin is not None:
                    self._in_flight[origin] = []
                out.append(ReceivedChunk(chunk, shard, entry_id, nbytes, origin))
                self._counts["chunks"] += 1
                self._counts["steps"] += chunk.num_steps
                self._counts["bytes"] += nbytes
            dropped = self._counts["duplicates_consumed"]
        if consumed:
            log.log(logging.WARNING if "duplicates_consumed" not in self._logged else logging.DEBUG,
                    "dropped %d entries whose chunks this learner consumed already (%d so far; delivered "
                    "again after a failover took back their move and ack)", sum(map(len, consumed.values())),
                    dropped)
            self._logged.add("duplicates_consumed")
            try:
                self._ack_ids(consumed)
            except CONNECTION_ERRORS:
                pass  # kept in _unacked: sent with the next ack
        return out
