"""What an experience receiver holds between taking an entry into its pending list and acking it,
so that no entry is handed out twice.

An entry is *held* from the moment it is taken (queued) until it is acked; re-reading the pending
list or claiming skips what is held. Acks whose reply was lost are *owed* and sent with the next
ack (XACK is idempotent); so are the acks a caller leaves to the reading thread (:meth:`Delivery.owe`),
whose next read carries them: a round trip less for the caller. Origins of the chunks acked are *consumed*
(:class:`~surreal_redis.hub.experience.consumed.ConsumedWindow`): a copy delivered again after a
failover is acked unread; a copy of a chunk handed out and not acked yet (*in flight*) stays
pending until that chunk is acked, then it is acked too.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping

from surreal_redis.connection import CONNECTION_ERRORS, Backoff, RedisClient
from surreal_redis.hub.experience.consumed import ConsumedWindow
from surreal_redis.hub.experience.dead_letters import DeadLetters
from surreal_redis.hub.experience.decoding import Decoded, Entry
from surreal_redis.hub.experience.wire import Origin
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys

ByShard = dict[int, set[bytes]]  # shard -> entry ids


def by_shard(pairs: Iterable[tuple[int, bytes]]) -> ByShard:
    """(shard, entry id) pairs grouped by shard."""
    grouped: ByShard = {}
    for shard, entry_id in pairs:
        grouped.setdefault(shard, set()).add(entry_id)
    return grouped


def _merge(into: ByShard, more: Mapping[int, set[bytes]]) -> None:
    for shard, ids in more.items():
        into.setdefault(shard, set()).update(ids)


class Delivery:
    """The entries one receiver holds, the acks it owes, the origins consumed and in flight.

    Safe from any thread: every method takes :attr:`lock`, an RLock the receiver also holds while
    it reads its pending list or claims, so an ack from the caller's thread never races them.
    ``ack_ids`` and ``settle`` block for one round trip (a pipeline of XACK, one per shard).
    """

    def __init__(self, client: RedisClient, keys: Mapping[int, ShardKeys], dead_maxlen: int,
                 dead_backoff: Backoff) -> None:
        self.client, self.keys = client, keys
        self.lock = threading.RLock()
        self.queue: deque[Entry] = deque()  # taken into our pending list, not yet processed
        self._held: set[tuple[int, bytes]] = set()  # queued, handed out and unacked, or being set aside
        self._unacked: ByShard = {}  # acks whose reply was lost, or left to a read: sent again
        self._sending: ByShard = {}  # acks a read in flight carries (taken from _unacked)
        self.consumed = ConsumedWindow()  # origins of the chunks acked (stored by the caller)
        # origins handed out and not acked -> copies delivered meanwhile, kept pending until then
        self._in_flight: dict[Origin, list[tuple[int, bytes]]] = {}
        self.dead = DeadLetters(client, keys, dead_maxlen, dead_backoff, self.ack_ids, self.lock)

    def holds(self, shard: int, entry_id: bytes) -> bool:
        return (shard, entry_id) in self._held

    def take(self, shard: int, entries: list) -> int:
        """Queue the entries (id, fields) not held yet; returns how many."""
        taken = 0
        with self.lock:
            for entry_id, fields in entries:
                if entry_id is None or (shard, entry_id) in self._held:
                    continue
                self._held.add((shard, entry_id))
                self.queue.append((shard, entry_id, fields or {}))
                taken += 1
        return taken

    def pop(self, count: int) -> list[Entry]:
        """Up to ``count`` queued entries, oldest first (still held)."""
        with self.lock:
            return [self.queue.popleft() for _ in range(min(count, len(self.queue)))]

    def put_back(self, entries: list[Entry]) -> None:
        """Queue popped entries again, first (their processing failed: still held)."""
        with self.lock:
            self.queue.extendleft(reversed(entries))

    def stored_elsewhere(self, entries: ByShard) -> None:
        """Ack entries the caller got some other way (the retained window) and unqueue them, so
        no claim or pending-list read hands them out again."""
        self.ack_ids(entries)
        with self.lock:
            self.queue = deque(e for e in self.queue if e[1] not in entries.get(e[0], ()))

    def hand_out(self, good: list[Decoded]) -> tuple[list[Decoded], ByShard]:
        """Split decoded entries into those to hand out (their origins now in flight) and copies
        of chunks consumed already (to ack, by shard); copies of chunks in flight are in neither."""
        out: list[Decoded] = []
        copies: list[tuple[int, bytes]] = []
        with self.lock:
            for decoded in good:
                shard, entry_id, _ = decoded.entry
                origin = decoded.origin
                if origin is not None and origin in self._in_flight:
                    self._in_flight[origin].append((shard, entry_id))
                elif origin is not None and self.consumed.seen(origin):
                    copies.append((shard, entry_id))
                else:
                    if origin is not None:
                        self._in_flight[origin] = []
                    out.append(decoded)
        return out, by_shard(copies)

    def settle_origin(self, origin: Origin | None) -> list[tuple[int, bytes]]:
        """Record ``origin`` as consumed; returns its copies held pending meanwhile (to ack)."""
        if origin is None:
            return []
        with self.lock:
            self.consumed.add(origin)
            return self._in_flight.pop(origin, [])

    def settle(self, acks: bool = True) -> None:
        """Send the acks owed (unless ``acks`` is false: the caller's next read carries them), and
        set aside what is due."""
        if acks and self._unacked:
            self.ack_ids({})
        self.dead.flush()

    def owe(self, entries: ByShard) -> None:
        """Leave the XACK of ``entries`` to the reading thread: owed until a read carries them
        (:meth:`take_owed`) or an ack or :meth:`settle` sends them. Held until then, so no
        pending-list read hands them out again. No round trip."""
        with self.lock:
            _merge(self._unacked, entries)

    def owes(self) -> bool:
        """Whether acks are owed that no read in flight carries."""
        with self.lock:
            return bool(self._unacked)

    def take_owed(self) -> ByShard:
        """The acks owed, for a read to send ahead of its wait; in flight until :meth:`sent`."""
        with self.lock:
            taken, self._unacked = self._unacked, {}
            _merge(self._sending, taken)
            return taken

    def sent(self, taken: ByShard, acked: bool) -> None:
        """The read carrying ``taken`` (from :meth:`take_owed`) is over: its XACKs went through
        (``acked``: no longer held), or not (owed again)."""
        with self.lock:
            for shard, ids in taken.items():
                left = self._sending.get(shard, set())
                left.difference_update(ids)
                if not left:
                    self._sending.pop(shard, None)
            if acked:
                for shard, ids in taken.items():
                    self._held.difference_update((shard, i) for i in ids)
            else:
                _merge(self._unacked, taken)

    def ack_ids(self, entries: ByShard, in_flight: bool = False) -> int:
        """XACK ``entries`` plus the acks still owed (``in_flight``: and those a read in flight
        carries, say at the stop); returns how many were still pending. On a connection error they
        are all owed, and the error propagates."""
        with self.lock:
            owed = {s: set(ids) for s, ids in self._unacked.items()}
            _merge(owed, entries)
            if in_flight:
                _merge(owed, self._sending)
            if not owed:
                return 0
            pipe = self.client.pipeline(transaction=False)
            for shard, ids in owed.items():
                pipe.xack(self.keys[shard].exp, CONSUMER_GROUP, *ids)
            try:
                acked = sum(pipe.execute())
            except CONNECTION_ERRORS:
                self._unacked = owed
                raise
            self._unacked = {}
            for shard, ids in owed.items():
                self._held.difference_update((shard, i) for i in ids)
            return acked

    def ack_later_if_lost(self, entries: ByShard) -> None:
        """:meth:`ack_ids`, where a connection error only leaves them owed (sent with the next
        ack): for entries nobody waits on."""
        try:
            self.ack_ids(entries)
        except CONNECTION_ERRORS:
            pass
