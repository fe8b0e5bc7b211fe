"""Learner side of the experience path: shard inboxes -> shard streams -> decoded :class:`Chunk`
objects, read through the consumer group ``keys.CONSUMER_GROUP`` and acked once in replay; its
parts are the sibling modules new_entries, pending, decoding, delivery, retained and groups.

Exactly once: every entry the group hands this consumer stays in its pending list until
:meth:`~ExperienceReceiver.ack` (or until it is set aside); on start and after any connection
error the receiver reads its own pending list again and takes back every entry it does not hold,
and it drops a copy of a chunk it consumed already (``duplicates_consumed``: delivered again after
a failover took back the move, the delivery and the ack). Entries trimmed while pending (gone
before anyone acked them) are counted (``pending_trimmed``) and acked. An ack whose reply was lost
is sent again with the next one.

No entry can stop the reader: any exception while decoding one entry sets it aside (dead-letter
stream of its shard, with the reason) and the batch goes on. When Redis is out of memory, setting
aside waits (capped backoff; the entries stay pending) instead of failing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import redis

from surreal_redis.chunks import Chunk
from surreal_redis.connection import (
    CONNECTION_ERRORS,
    Backoff,
    RedisClient,
    RedisSettings,
    stream_entries,
)
from surreal_redis.hub.experience import groups
from surreal_redis.hub.experience.decoding import Decoded, Entry, EntryDecoder
from surreal_redis.hub.experience.delivery import Delivery, by_shard
from surreal_redis.hub.experience.ledger import Ledger
from surreal_redis.hub.experience.new_entries import NewEntryReader, OwedAcks
from surreal_redis.hub.experience.pending import PendingReader
from surreal_redis.hub.experience.receiver_config import ReceiverConfig
from surreal_redis.hub.experience.retained import RetainedReader
from surreal_redis.hub.experience.wire import Origin
from surreal_redis.keys import RunKeys, ShardKeys
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)


class ReceivedChunk(NamedTuple):
    """A decoded chunk and what :meth:`ExperienceReceiver.ack` needs; ``nbytes``: entry size;
    ``origin``: where the chunk came from (None for an entry written without one)."""

    chunk: Chunk
    shard: int
    entry_id: bytes
    nbytes: int
    origin: Origin | None = None


class ReceiverStats(NamedTuple):
    """Cumulative receiver counters (for metrics). ``chunks``, ``steps``: of
    :meth:`~ExperienceReceiver.receive`; ``dead``: entries set aside, counted once written
    (malformed inbox items included, reason ``malformed_batch`` or ``script_error``); ``bytes``
    counts the entries and every fetched blob; ``claimed``: entries taken over from other
    consumers; ``reread``: entries taken back from this consumer's own pending list;
    ``pending_trimmed``: entries trimmed while pending, lost before anyone stored them;
    ``dead_retries``: attempts to set entries aside that Redis refused (out of memory);
    ``consumers_removed``: idle consumers deleted; ``retained``/``retained_skipped``: chunks
    yielded / malformed entries skipped by :meth:`~ExperienceReceiver.read_retained`;
    ``cached_bytes`` (a gauge): decoded observations in the cache now; ``moved``/``duplicates``:
    agents' batches moved from the inbox into the stream / dropped as copies of a stored one;
    ``move_errors``: move.lua calls refused as a whole; ``duplicates_consumed``: entries dropped
    (and acked) because the learner already consumed their chunk."""

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


class ExperienceReceiver:
    """Reads experience chunks of some shards of one run.

    :meth:`receive` (and :meth:`read_retained`) from one thread; :meth:`ack` and :meth:`set_aside`
    may be called from another. Use one receiver per reader thread (with distinct ``shards`` or
    consumer names). Blocking calls wait at most ``block_ms`` (capped below half the socket
    timeout). Connection errors propagate (nothing is lost: see the module docstring); the next
    call recovers. Out-of-memory replies never do: they are waited out.
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
        self._decoder = EntryDecoder(client, self._keys, config)
        self._started = False
        self._scripts = Scripts(client)
        self._warned_duplicates = False
        self._counts = dict.fromkeys(ReceiverStats._fields, 0)
        # What this receiver holds, so re-reading its pending list never hands an entry out twice.
        self._delivery = Delivery(client, self._keys, config.dead_maxlen,
                                  Backoff(config.retry_base_s, config.retry_cap_s))
        self._retained = RetainedReader(client, self._keys, self._decoder, config.retained_batch,
                                        self._delivery.stored_elsewhere)
        self._oom_backoff = Backoff(config.retry_base_s, config.retry_cap_s)
        self._pending = PendingReader(client, self._scripts, self._keys, config, self._delivery, self._count_trimmed)
        self._ledger = ledger if ledger is not None else Ledger.from_environment("learner")
        self._new = NewEntryReader(client, self._scripts, self._keys, config, self.settings, self._delivery.take,
                                   self._delivery.dead.count_written,
                                   acks=OwedAcks(self._delivery.take_owed, self._delivery.sent))

    def count_dead_letters(self, reason: str, shard: int, count: int) -> None:
        """Count records the janitor's ``move.lua`` calls wrote to ``shard``'s dead-letter stream,
        so ``dead`` covers every entry set aside. Safe from any thread."""
        with self._delivery.lock:
            self._delivery.dead.count_written(reason, shard, count)

    @property
    def dead_by_reason(self) -> dict[str, int]:
        """Entries set aside by :meth:`receive` and :meth:`set_aside`, by reason."""
        return self._delivery.dead.written.by_reason

    @property
    def skipped_by_reason(self) -> dict[str, int]:
        """Malformed entries :meth:`read_retained` skipped, by reason."""
        return self._retained.skipped.by_reason

    def consumed_state(self) -> dict:
        """The consumed window (for the learner's checkpoint). Safe from any thread."""
        with self._delivery.lock:
            return self._delivery.consumed.state_dict()

    def load_consumed(self, state: dict) -> None:
        """Restore :meth:`consumed_state` (a learner resuming from its checkpoint)."""
        with self._delivery.lock:
            self._delivery.consumed.load_state_dict(state)

    def stats(self) -> ReceiverStats:
        decoder, dead, new, pending = self._decoder, self._delivery.dead, self._new, self._pending
        return ReceiverStats(**{**self._counts, "bytes": self._counts["bytes"] + decoder.blob_bytes,
                                "cache_hits": decoder.cache_hits, "cache_misses": decoder.cache_misses,
                                "cached_bytes": decoder.cached_bytes, "dead": dead.written.total,
                                "dead_retries": dead.retries, "retained": self._retained.count,
                                "retained_skipped": self._retained.skipped.total, "moved": new.moved,
                                "duplicates": new.duplicates, "move_errors": new.move_errors,
                                "reread": pending.reread, "claimed": pending.claimed,
                                "consumers_removed": pending.consumers_removed})

    def start(self) -> int:
        """Create missing consumer groups, load the agents' insert script, and take the first page
        of the pending entries (:meth:`receive` returns them first); returns how many. Called by
        the first :meth:`receive` if not called before. Works in a full Redis once the groups exist."""
        groups.create_groups(self.client, self._scripts, self._keys.values())
        before = len(self._delivery.queue)
        self._pending.start()
        self._started = True
        return len(self._delivery.queue) - before

    def load_agent_scripts(self) -> None:
        """:func:`~surreal_redis.hub.experience.groups.load_agent_scripts` for these shards."""
        groups.load_agent_scripts(self.client, self._scripts, self._keys.values())

    def receive(self, max_chunks: int = 256, block_ms: int | None = None) -> list[ReceivedChunk]:
        """Up to ``max_chunks`` chunks (rounded up to a multiple of the number of shards read):
        entries taken back from pending lists first, then new ones.

        Waits up to ``block_ms`` (default ``config.block_ms``; 0: do not wait) when nothing is
        available; returns ``[]`` on timeout, and after waiting out an out-of-memory refusal.
        Malformed entries are set aside and acked here; the returned ones must be passed to
        :meth:`ack` once stored (or to :meth:`set_aside`). Connection errors propagate.
        """
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        wait_ms = self.config.block_ms if block_ms is None else block_ms
        try:
            if not self._started:
                self.start()
            queued = bool(self._delivery.queue)
            self._delivery.settle(acks=queued or not self._new.carries_acks)  # else the read carries them
            if not queued:
                self._refill(max_chunks, wait_ms)
            entries = self._delivery.pop(max_chunks)
            if not entries:
                return []
            try:
                out = self._process(entries)
            except BaseException:
                self._delivery.put_back(entries)  # still held: processed on the next call
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

    def ack(self, received: Iterable[ReceivedChunk], later: bool = False) -> int | None:
        """XACK the given chunks (one round trip; acks whose reply was lost before go along);
        returns how many were still pending. On a connection error the acks are kept and sent
        with the next call (XACK is idempotent), and the error propagates.

        ``later``: the chunks count as consumed at once (the consumed window, the ledger) and their
        XACKs are owed, sent by the reading thread's next :meth:`receive` (on one server ahead of
        its read's wait, in its round trip) or by :meth:`flush_acks`; returns None. No round trip,
        unless acks owed from before are not on their way yet: those are sent first (an error
        raised, the new ones owed), so that only the chunks of the last call may be consumed and
        still pending (a kill -9 hands those to the next learner)."""
        received = list(received)
        if not later:
            return self._delivery.ack_ids(by_shard(self._consume(received)))
        try:
            if self._delivery.owes():  # not sent by a read yet (one in flight carries its own)
                self._delivery.ack_ids({})
        finally:
            self._delivery.owe(by_shard(self._consume(received)))
        return None

    def _consume(self, received: list[ReceivedChunk]) -> list[tuple[int, bytes]]:
        """Record ``received`` as consumed (the consumed window, the ledger); the entries to ack:
        theirs and the copies of their chunks held meanwhile."""
        delivery = self._delivery
        with delivery.lock:
            entries = [(item.shard, item.entry_id) for item in received]
            for item in received:
                entries += delivery.settle_origin(item.origin)
            self._ledger.trained(item.origin for item in received)  # consumed from here on, like the window says
        return entries

    def flush_acks(self) -> int:
        """Send the acks owed now, those a read in flight carries too (one round trip, none when
        nothing is owed); returns how many were still pending. A connection error keeps them owed
        and propagates."""
        return self._delivery.ack_ids({}, in_flight=True)

    def set_aside(self, item: ReceivedChunk, reason: str, detail: str) -> None:
        """Dead-letter (and ack) a chunk that decoded but that the caller cannot use, e.g. shapes
        that do not match its environment. While Redis is out of memory the entry stays pending
        and is set aside by a later :meth:`receive`. Two round trips."""
        keys = self._keys[item.shard]
        entries = stream_entries(self.client.xrange(keys.exp, item.entry_id, item.entry_id))
        delivery = self._delivery
        delivery.dead.add([(reason, detail, item.shard, item.entry_id, entries[0][1] if entries else {})])
        delivery.dead.flush(force=True)
        with delivery.lock:  # set aside once: its copies are dropped like those of a stored chunk
            copies = delivery.settle_origin(item.origin)
            self._ledger.dead([item.origin])
        if copies:
            delivery.ack_ids(by_shard(copies))

    def read_retained(self, max_entries: int | None = None, delivered_only: bool = False) -> Iterator[Chunk]:
        """Every entry retained in this receiver's shard streams, oldest first (shards merged by
        entry id), as decoded chunks: acked entries included, read with XRANGE outside the
        consumer group (nothing is acked, claimed or delivered).

        For an off-policy learner refilling its replay after a restart. Reads up to the newest
        entry of each shard when the call starts, ``config.retained_batch`` entries per round
        trip (lazily, as the iterator is consumed), decoding like :meth:`receive`. A malformed
        entry, or one whose observations were collected meanwhile, is counted
        (``retained_skipped``, ``skipped_by_reason``), logged and skipped (not dead-lettered).
        ``max_entries``: stop after that many entries (good or skipped).

        ``delivered_only``: only what the consumer group was already given (up to its
        last-delivered id), and entries still pending (a dead learner read them, never stored
        them) are acked once yielded, so a restarted learner that refills its replay this way
        then gets every other entry from :meth:`receive`, exactly once.
        """
        return self._retained.read(max_entries, delivered_only)

    # ------------------------------------------------------------ taking entries

    def _lost_connection(self) -> None:
        """Read our own pending list again before anything new (a lost reply may have put
        entries there that we never saw)."""
        if self._started:
            self._pending.reread_own()

    def _refill(self, max_chunks: int, wait_ms: int) -> None:
        """Queue pending entries (``PendingReader.refill``), else new ones (blocking up to
        ``wait_ms``)."""
        self._pending.refill()
        if not self._delivery.queue:
            self._new.read(max_chunks, wait_ms)

    def _count_trimmed(self, shard: int, count: int) -> None:
        self._counts["pending_trimmed"] += count
        log.warning("shard %d: %d entries were trimmed while pending, before anyone stored them "
                    "(retention.max_entries too small for a slow or absent learner)", shard, count)

    def _wait_out_oom(self, exc: BaseException, wait_ms: int) -> None:
        delay = min(self._oom_backoff.next_delay(), wait_ms / 1000)
        log.warning("Redis is out of memory (%s); receiver waits %.2fs", exc, delay)
        time.sleep(delay)

    # ------------------------------------------------------------ decoding

    def _process(self, entries: list[Entry]) -> list[ReceivedChunk]:
        """Decode held entries: good ones are returned (held until acked), malformed ones set
        aside, ones trimmed while pending counted and acked, those past the read's byte budget
        queued again (the next call decodes them first)."""
        delivery = self._delivery
        gone = by_shard((shard, entry_id) for shard, entry_id, fields in entries if not fields)
        good, failures, deferred = self._decoder.decode([e for e in entries if e[2]])
        for shard, ids in gone.items():
            self._count_trimmed(shard, len(ids))
        if gone:
            delivery.ack_later_if_lost(gone)
        if failures:  # recorded before writing: a failed write leaves them pending, set aside later
            self._ledger.dead_entries(fields for *_, fields in failures)
            delivery.dead.add(failures)
            delivery.dead.flush(force=True)
        if deferred:  # past the read's byte budget (receiver.max_read_bytes): still held, decoded next
            delivery.put_back(deferred)
        return self._hand_out(good)

    def _hand_out(self, good: list[Decoded]) -> list[ReceivedChunk]:
        """The decoded entries whose chunk was not consumed yet (``Delivery.hand_out``); nothing
        after this may raise (what it hands out is in flight)."""
        new, consumed = self._delivery.hand_out(good)
        counts = self._counts
        counts["duplicates_consumed"] += len(good) - len(new)
        out = []
        for (shard, entry_id, _), chunk, nbytes, origin in new:
            out.append(ReceivedChunk(chunk, shard, entry_id, nbytes, origin))
            counts["chunks"] += 1
            counts["steps"] += chunk.num_steps
            counts["bytes"] += nbytes
        if consumed:
            log.log(logging.DEBUG if self._warned_duplicates else logging.WARNING,
                    "dropped %d entries whose chunks this learner consumed already (%d so far; delivered "
                    "again after a failover took back their move and ack)", sum(map(len, consumed.values())),
                    counts["duplicates_consumed"])
            self._warned_duplicates = True
            self._delivery.ack_later_if_lost(consumed)
        return out
