"""Setting entries aside for the receiver: each malformed or unusable entry is recorded, with its
reason, in its shard's dead-letter stream (``sr:{run.sN}:dead``) and then acked. A full Redis
refuses the record: the entry then stays pending and is tried again after a capped backoff.

A record names the entry, it does not copy it: its id, reason and detail (a blob refused unread
is named by key and size there), the entry's size in bytes (``size``) and a preview of each of
its fields (``f.<name>``: the first ``PREVIEW_BYTES``), so a record holds at most
``RECORD_BYTES`` whatever an agent sent, and the stream at most about ``dead_maxlen`` of them
(``move.lua``'s records of inbox items are smaller still). The janitor trims the stream first
under memory pressure (``retention.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import redis
from redis.typing import EncodableT, FieldT

from surreal_redis.connection import CONNECTION_ERRORS, Backoff, RedisClient
from surreal_redis.hub.experience.decoding import Failure, ReasonLog
from surreal_redis.keys import ShardKeys

log = logging.getLogger(__name__)

PREVIEW_BYTES = 256  # of each field of an entry set aside
MAX_FIELDS = 8  # fields previewed (a stream entry move.lua writes has 5 or 6)
DETAIL_BYTES = 1000
# the most a record holds: id, reason, size, detail and the previews, with their field names
RECORD_BYTES = 4096


def dead_record(reason: str, detail: str, entry_id: bytes, fields: dict) -> dict[FieldT, EncodableT]:
    """The dead-letter record of one entry: a reference and previews, never a copy (at most
    ``RECORD_BYTES``)."""
    record: dict[FieldT, EncodableT] = {b"id": bytes(entry_id)[:64], b"reason": reason[:64],
                                        b"detail": detail[:DETAIL_BYTES],
                                        b"size": sum(len(k) + len(v) for k, v in fields.items())}
    for name, value in list(fields.items())[:MAX_FIELDS]:
        record[b"f." + bytes(name)[:32]] = bytes(value)[:PREVIEW_BYTES]
    return record


class DeadLetters:
    """Entries waiting to be set aside, and the counts of those that were.

    ``ack(by_shard)`` acks written entries (the receiver's, which also forgets them); ``lock`` is
    the receiver's, held while entries move. ``retries``: attempts Redis refused; ``written``:
    the records written, by reason.
    """

    def __init__(self, client: RedisClient, keys: Mapping[int, ShardKeys], maxlen: int, backoff: Backoff,
                 ack: Callable[[dict[int, set[bytes]]], int], lock: threading.RLock) -> None:
        self.client, self.keys, self.maxlen = client, keys, maxlen
        self._backoff, self._ack, self._lock = backoff, ack, lock
        self._waiting: list[Failure] = []
        self._due = 0.0
        self.written = ReasonLog(log)
        self.retries = 0

    def add(self, failures: list[Failure]) -> None:
        """Queue entries to set aside (tried by the next :meth:`flush`)."""
        with self._lock:
            self._waiting.extend(failures)

    def flush(self, force: bool = False) -> None:
        """Write the waiting entries (one XADD each), then ack those written. Those refused for
        memory (or a connection error) wait for the next try after a capped backoff (``force``:
        try now). Other errors (e.g. no permission) raise."""
        with self._lock:
            if not self._waiting or (not force and time.monotonic() < self._due):
                return
            waiting, self._waiting = self._waiting, []
            pipe = self.client.pipeline(transaction=False)
            for reason, detail, shard, entry_id, fields in waiting:
                pipe.xadd(self.keys[shard].dead, dead_record(reason, detail, entry_id, fields), maxlen=self.maxlen,
                          approximate=True)
            try:
                replies = pipe.execute(raise_on_error=False)
            except CONNECTION_ERRORS as exc:
                replies = [exc] * len(waiting)  # maybe written: a retry may write a second record
            written: dict[int, set[bytes]] = {}
            refused = None
            for failure, reply in zip(waiting, replies):
                if isinstance(reply, (redis.exceptions.OutOfMemoryError, *CONNECTION_ERRORS)):
                    self._waiting.append(failure)
                    refused = reply
                elif isinstance(reply, Exception):
                    raise reply  # a setup error, not data to route around
                else:
                    reason, detail, shard, entry_id, _ = failure
                    written.setdefault(shard, set()).add(entry_id)
                    self.written(reason, "shard %d entry %s set aside (%s: %s)", shard, entry_id, reason, detail,
                                 first="shard %d entry %s set aside (%s: %s); further '%s' entries are logged "
                                 "at debug level")
            if refused is not None:
                self.retries += 1
                delay = self._backoff.next_delay()
                self._due = time.monotonic() + delay
                log.warning("%d entries wait to be set aside (%s); next try in %.1fs", len(self._waiting),
                            refused, delay)
            else:
                self._backoff.reset()
            if written:
                try:
                    self._ack(written)
                except CONNECTION_ERRORS:
                    pass  # the receiver keeps the acks it owes and sends them with the next one

    def count_written(self, reason: str, shard: int, count: int) -> None:
        """Count ``count`` records a script wrote to ``shard``'s dead-letter stream itself
        (``move.lua``: inbox items that are not batches)."""
        self.written(reason, "shard %d: %d inbox items set aside (%s; see the dead-letter stream)", shard, count,
                     reason, count=count)
