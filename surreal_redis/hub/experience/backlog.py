"""Reading where a shard stream stands: the consumer group's backlog (backpressure, retention,
metrics) and the observation dedup ratio (metrics, ``status``). Read-only; one round trip each."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import redis

from surreal_redis.codec import CodecError
from surreal_redis.connection import RedisClient, stream_entries
from surreal_redis.hub.experience.wire import (
    WireError,
    parse_entry,
    parse_id,
    payload_blob_id,
    referenced_slots,
)
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys

DEDUP_SAMPLE = 50  # recent entries sampled to estimate the observation slots per entry
DEDUP_PAYLOADS = 8  # payload blobs of those read, at most (the others' slots are not counted)


class Backlog(NamedTuple):
    """Where the learner's consumer group stands on one shard stream.

    ``unread``: entries in the stream not yet delivered to the group, plus the batches still
    queued in the inbox (``queued``, each at least one entry); ``last_delivered``: the group's
    last-delivered id (None when the group does not exist: nothing was delivered).
    """

    length: int
    unread: int
    first_id: bytes | None
    last_delivered: bytes | None
    queued: int = 0


def read_backlog(client: RedisClient, keys: ShardKeys, max_count: int = 10_000) -> Backlog:
    """One round trip (XINFO GROUPS, XLEN, first entry id, LLEN of the inbox).

    Redis >= 7 reports the group's ``lag``, which still counts entries trimmed before delivery, so
    it is capped by the stream length; without it (Redis 6.2), the unread entries are counted with
    an XRANGE of at most ``max_count`` ids (a second round trip).
    """
    pipe = client.pipeline(transaction=False)
    pipe.xinfo_groups(keys.exp)
    pipe.xlen(keys.exp)
    pipe.xrange(keys.exp, count=1)
    pipe.llen(keys.inbox)
    groups, length, first, queued = pipe.execute(raise_on_error=False)
    for reply in (length, queued):
        if isinstance(reply, Exception):
            raise reply
    first_id = first[0][0] if isinstance(first, list) and first else None
    if isinstance(groups, redis.ResponseError) and "no such key" in str(groups).lower():
        groups = []
    elif isinstance(groups, Exception):
        raise groups
    group = next((g for g in groups if g["name"] in (CONSUMER_GROUP, CONSUMER_GROUP.encode())), None)
    if group is None:
        return Backlog(length, length + queued, first_id, None, queued)
    last = group["last-delivered-id"]
    if first_id is None:
        unread = 0
    elif parse_id(first_id) > parse_id(last):
        unread = length  # everything after the last delivered entry is still there, unread
    elif isinstance(group.get("lag"), int):
        unread = min(group["lag"], length)
    else:
        unread = len(stream_entries(client.xrange(keys.exp, min=b"(" + last, count=max_count)))
    return Backlog(length, unread + queued, first_id, last, queued)


def dedup_ratio(client: RedisClient, keys: ShardKeys, length: int) -> tuple[float | None, int]:
    """(observation slots referenced by the retained entries / observation blobs stored, blobs).

    The slots per entry, and the share of entries whose payload is a blob of its own (left out of
    the blobs), are estimated from the newest ``DEDUP_SAMPLE`` entries (reading at most
    ``DEDUP_PAYLOADS`` payload blobs, a second round trip); None when the shard stores no
    observation blobs."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.obsref)
    pipe.xrevrange(keys.exp, count=DEDUP_SAMPLE)
    blobs, recent = pipe.execute()
    stored: dict[int, str] = {}
    for position, (_, fields) in enumerate(recent):
        try:
            d = payload_blob_id(fields)
        except WireError:
            continue
        if d is not None:
            stored[position] = d
    read = list(stored)[:DEDUP_PAYLOADS]
    payloads = dict(zip(read, client.execute_command("MGET", *keys.obs_keys([stored[i] for i in read])))) \
        if read else {}
    slots = []
    for position, (_, fields) in enumerate(recent):
        if position in stored and position not in read:
            continue
        try:
            slots.append(referenced_slots(parse_entry(fields, payload=payloads.get(position))))
        except (WireError, CodecError):
            continue
    if recent:
        blobs = max(0, blobs - round(len(set(stored.values())) / len(recent) * length))  # one blob per entry
    if not blobs or not slots:
        return None, blobs
    return float(np.mean(slots)) * length / blobs, blobs
