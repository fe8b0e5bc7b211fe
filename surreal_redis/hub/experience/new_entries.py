"""Reading new entries for the learner's consumer: move the agents' batches from the shard inboxes
into the streams (``move.lua``), read what the group has not delivered yet (``XREADGROUP ... >``)
without blocking, and when nothing came wait for a batch on one shard's inbox at a time. Each read
is announced on the shard's ``reads`` channel, for the senders waiting on its backlog.

On one server the acks owed, the wait, the moves, the read and the announcements go in one
pipelined round trip: Redis runs a client's pipelined commands in order, so those after a blocking
BLMOVE run once it returns, and the acks ahead of it at once. Each round trip wakes the prefetch
thread, which then takes the GIL from the update running beside it. On a cluster each call goes
to its own node, one by one."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import redis
from redis.typing import KeyT, StreamIdT

from surreal_redis.connection import RedisClient, RedisSettings, StreamRead, block_ms, stream_read
from surreal_redis.hub.experience.delivery import ByShard
from surreal_redis.hub.experience.inbox import Moved, move_call, move_inbox, moved_from
from surreal_redis.hub.experience.receiver_config import ReceiverConfig
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.redis_cluster import is_cluster, keyed_command, refresh_topology
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

MOVE_CALLS = 8  # move.lua calls per shard and read: at most 8 x move_items batches a round

READ_NEWS = "read"
"""The message of a ``reads`` announcement: a wake-up call (waiting senders look at their backlog)."""

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


class Look(NamedTuple):
    """One pipelined look: the read's reply, whether it was announced, the shards to move again,
    and the error of the wait or of an ack ahead of it (raised once the read is taken)."""

    read: StreamRead
    announced: bool
    again: list[int]
    failed_wait: Exception | None = None
    acked: bool = True  # the acks sent along went through (an error reply leaves them owed)


class OwedAcks(NamedTuple):
    """Where a read takes the acks its receiver owes (``take()``, by shard) and says how they
    fared (``sent(taken, acked)``): :class:`~surreal_redis.hub.experience.delivery.Delivery`'s."""

    take: Callable[[], ByShard]
    sent: Callable[[ByShard, bool], None]


class NewEntryReader:
    """Moves and reads new entries of some shards for one consumer (the receiver's reading
    thread only).

    ``take(shard, entries)`` queues what a read returned; ``count_dead(reason, shard, count)``
    counts the dead letters ``move.lua`` wrote; ``acks``: on one server each look sends the acks
    owed along (:attr:`carries_acks`). Counts: ``moved`` (batches moved into the
    streams), ``duplicates`` (copies of a stored batch dropped), ``move_errors`` (calls refused).
    """

    def __init__(self, client: RedisClient, scripts: Scripts, keys: Mapping[int, ShardKeys], config: ReceiverConfig,
                 settings: RedisSettings, take: Callable[[int, list], int],
                 count_dead: Callable[[str, int, int], None], acks: OwedAcks) -> None:
        self.client, self.scripts, self.keys, self.config, self.settings = client, scripts, keys, config, settings
        self._take, self._count_dead, self._acks = take, count_dead, acks
        self._shard_of = {k.exp.encode(): s for s, k in keys.items()}
        self._rotation = itertools.cycle(list(keys))  # the shard whose inbox the next wait watches
        self.announce = True  # reads announced on each shard's reads channel
        self._move_loaded = False  # move.lua loaded by this reader (a server that lost it since: NOSCRIPT)
        # The last read emptied the inboxes and took all the streams held (the next read waits on
        # an inbox first, instead of finding nothing first: a round trip less per batch)
        self._drained = False
        self.moved = self.duplicates = self.move_errors = 0

    @property
    def carries_acks(self) -> bool:
        """Whether a :meth:`read` sends the acks owed along (one server; a cluster's go apart)."""
        return not is_cluster(self.client)

    def read(self, max_chunks: int, wait_ms: int) -> None:
        """Move the inboxes into the streams, then read new entries without blocking; while that
        finds nothing and ``wait_ms`` are not over (capped below half the socket timeout), wait
        for a batch in the next shard's inbox, in rotation (:data:`BLOCK_SLICE_MS`), and go again.

        Once a look left nothing behind (inboxes empty, the read short of its count), the next
        one waits first, in the same round trip: one round trip per batch, or per wait when none
        comes (every wait is followed by a look: the learner's janitor also moves inboxes, and a
        batch it moved wakes no wait). A shard whose inbox one move did not empty is moved on
        after the read (up to :data:`MOVE_CALLS` calls in all); what that moves is read next time."""
        streams: dict[KeyT, StreamIdT] = {keys.exp: ">" for keys in self.keys.values()}
        count = -(-max_chunks // len(streams))
        block = block_ms(wait_ms, self.settings) if wait_ms > 0 else 0
        deadline = time.monotonic() + block / 1000
        wait_first, self._drained = self._drained and block > 0, False
        moved_on = False
        while True:
            look = self._move_and_read(streams, count,
                                       max(1, int((deadline - time.monotonic()) * 1000)) if wait_first else 0)
            if look is None:  # the primary waited on was demoted: the next read goes to its successor
                return
            if look.read or look.failed_wait is not None:
                break
            if look.again and not moved_on:  # e.g. move.lua was not loaded yet: move, then read at once
                moved_on = True
                self._move_inboxes(look.again, MOVE_CALLS - 1)
                wait_first = False
                continue
            if time.monotonic() >= deadline:
                self._drained = not look.again
                return
            wait_first = True
        for name, entries in look.read:
            self._take(self._shard_of[bytes(name)], entries)
        self._drained = (look.failed_wait is None and not look.again
                         and all(len(entries) < count for _, entries in look.read))
        if not look.announced:
            for name, _ in look.read:
                self._announce_read(self._shard_of[bytes(name)])
        self._move_inboxes(look.again, MOVE_CALLS - 1)  # after the take: its errors must not strand what was read
        if look.failed_wait is not None:
            raise look.failed_wait

    def _move_and_read(self, streams: Mapping[KeyT, StreamIdT], count: int, wait_ms: int = 0) -> Look | None:
        """With ``wait_ms`` > 0 first a wait for a batch in the next shard's inbox (up to that
        long, :meth:`_wait_call`), then one move per shard, the read and (on one server) its
        announcements. None when the primary waited on was demoted (nothing read)."""
        if is_cluster(self.client):
            if wait_ms and not self._wait_for_batch(wait_ms):
                return None
            again = self._move_inboxes(list(self.keys), 1)
            return Look(xreadgroup(self.client, self.config.consumer, streams, count), False, again)
        if not self._move_loaded:  # so that the first pipeline moves before it reads
            self.scripts.load("move")
            self._move_loaded = True
        owed = self._acks.take()
        try:
            look = self._pipelined_look(streams, count, wait_ms, owed)
        except BaseException:
            self._acks.sent(owed, False)
            raise
        self._acks.sent(owed, look is not None and look.acked)
        return look

    def _pipelined_look(self, streams: Mapping[KeyT, StreamIdT], count: int, wait_ms: int,
                        owed: ByShard) -> Look | None:
        """:meth:`_move_and_read` on one server: the acks ``owed`` ahead of the wait, all in one
        pipeline."""
        cfg, shards = self.config, list(self.keys)
        sha = self.scripts.sha("move")
        pipe = self.client.pipeline(transaction=False)
        for shard, ids in owed.items():  # ahead of the wait: they run at once
            pipe.xack(self.keys[shard].exp, CONSUMER_GROUP, *ids)
        if wait_ms:
            pipe.blmove(*self._wait_call(wait_ms))  # type: ignore[arg-type]
        for shard in shards:
            script_keys, args = move_call(self.keys[shard], cfg.move_items, cfg.seen_ttl_s, cfg.dead_maxlen,
                                          cfg.max_payload_bytes)
            pipe.evalsha(sha, len(script_keys), *script_keys, *args)
        pipe.xreadgroup(CONSUMER_GROUP, self.config.consumer, dict(streams), count=count)
        announce = self.announce
        if announce:
            for shard in shards:
                pipe.execute_command("PUBLISH", self.keys[shard].reads, READ_NEWS)
        replies = pipe.execute(raise_on_error=False)  # connection errors raise: nothing to take, acks owed
        ack_replies, replies = replies[:len(owed)], replies[len(owed):]
        woke = replies.pop(0) if wait_ms else None
        failed_wait = woke if isinstance(woke, Exception) else None
        read = replies[len(shards)]
        if self._demoted(failed_wait):
            if isinstance(read, Exception):
                return None  # the commands after the wait met a replica: nothing moved or read, acks owed
            failed_wait = None
        failed_ack = next((reply for reply in ack_replies if isinstance(reply, Exception)), None)
        again = []
        for shard, reply in zip(shards, replies):
            try:
                moved = moved_from(self.scripts.checked("move", reply))
            except ScriptError as exc:
                self._move_refused(shard, exc)
            except (redis.exceptions.NoScriptError, redis.exceptions.OutOfMemoryError, *OUTAGE_ERRORS):
                again.append(shard)  # the one-by-one path loads the script, or raises after the take
            else:
                if not self._count_moved(shard, moved).done:
                    again.append(shard)
        if isinstance(read, Exception):
            raise read
        for news in replies[len(shards) + 1:]:
            if isinstance(news, redis.exceptions.NoPermissionError):
                self._stop_announcing(news)
            if isinstance(news, Exception):  # announced again once the read is taken (errors raise there)
                announce = False
        return Look(stream_read(read), announce, again, failed_wait or failed_ack, acked=failed_ack is None)

    def _wait_call(self, left_ms: int) -> tuple[KeyT, KeyT, float, str, str]:
        """BLMOVE's arguments for a wait on the next shard's inbox, in rotation, of at most
        ``left_ms`` (:data:`BLOCK_SLICE_MS` with several shards). LMOVE of a list's last item onto
        its own tail changes nothing: it only wakes the waiter."""
        inbox = self.keys[next(self._rotation)].inbox
        slice_ms = left_ms if len(self.keys) == 1 else min(left_ms, BLOCK_SLICE_MS)
        return inbox, inbox, max(1, slice_ms) / 1000, "RIGHT", "RIGHT"  # fractional seconds (Redis >= 6)

    def _demoted(self, exc: Exception | None) -> bool:
        """Whether ``exc`` says the primary a wait blocked on was demoted (a failover released its
        blocked clients); the client then learns the new topology."""
        if not isinstance(exc, redis.ResponseError) or not str(exc).startswith("UNBLOCKED"):
            return False
        log.warning("shard inbox wait: %s; reading from the new primary", exc)
        refresh_topology(self.client, exc)
        return True

    def _wait_for_batch(self, left_ms: int) -> bool:
        """Block until a batch is in the next shard's inbox or the slice of ``left_ms`` is over;
        False when the primary blocked on was demoted (nothing read: the next read goes to its
        successor)."""
        try:
            self.client.blmove(*self._wait_call(left_ms))  # type: ignore[arg-type]
        except redis.ResponseError as exc:
            if not self._demoted(exc):
                raise
            return False
        return True

    def _announce_read(self, shard: int) -> None:
        """PUBLISH :data:`READ_NEWS` on the shard's ``reads`` channel, for the senders waiting on
        its backlog. A user not allowed to publish there is told once, and the senders keep polling."""
        if not self.announce:
            return
        keys = self.keys[shard]
        try:  # on the node just read from, alive (redis-py sends keyless PUBLISH to its default node)
            keyed_command(self.client, keys.exp, "PUBLISH", keys.reads, READ_NEWS)
        except redis.exceptions.NoPermissionError as exc:
            self._stop_announcing(exc)

    def _stop_announcing(self, exc: Exception) -> None:
        if self.announce:
            self.announce = False
            log.warning("reads are not announced (%s); waiting senders poll the backlog instead. "
                        "Run `surreal-redis acl` again to let this user publish them", exc)

    def _move_inboxes(self, shards: list[int], calls: int) -> list[int]:
        """Move the given shards' queued batches into their streams, at most ``calls`` calls per
        shard; the shards whose inbox is not empty after them. A call the script refuses (it wrote
        nothing) is counted and logged, and reading goes on: what is already in the streams still
        reaches the learner."""
        cfg, again = self.config, []
        for shard in shards:
            keys = self.keys[shard]
            for _ in range(calls):
                try:
                    moved = move_inbox(self.scripts, keys, cfg.move_items, cfg.seen_ttl_s, cfg.dead_maxlen,
                                       cfg.max_payload_bytes)
                except ScriptError as exc:
                    self._move_refused(shard, exc)
                    break
                if self._count_moved(shard, moved).done:
                    break
            else:
                again.append(shard)
        return again

    def _count_moved(self, shard: int, moved: Moved) -> Moved:
        self.moved += moved.taken - moved.duplicates - moved.malformed - moved.failed
        self.duplicates += moved.duplicates
        for reason, count in moved.set_aside.items():
            self._count_dead(reason, shard, count)
        return moved

    def _move_refused(self, shard: int, exc: ScriptError) -> None:
        self.move_errors += 1
        log.log(logging.ERROR if self.move_errors % 1000 == 1 else logging.DEBUG,
                "shard %d: moving the inbox failed (%d calls so far), its batches stay queued: %s",
                shard, self.move_errors, exc)
