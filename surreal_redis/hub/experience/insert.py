"""The sender's insert protocol, the one Python face of ``lua/insert.lua``: grouping chunks into
bounded calls, packing each call's KEYS and ARGV (and the payloads stored beside it) into one
write, and reading the replies back per call (done, re-upload, reload, back off)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster

from surreal_redis.connection import RedisClient
from surreal_redis.keys import ShardKeys
from surreal_redis.redis_cluster import node_client, refresh_topology
from surreal_redis.scripts import ScriptError

SEQ_WINDOW = 1024  # insert.lua takes seqs below floor + SEQ_WINDOW only (it remembers that many)


class HubUnavailableError(RuntimeError):
    """Redis refused or could not take an insert for longer than the configured wait."""


@dataclass
class Batch:
    """One insert.lua call: chunks (stream fields a, e, o, d), the digests they reference (each
    once), those whose blobs this call uploads, and its size in bytes (fields and blobs). ``seq``
    is fixed for the batch's life (resends reuse it). ``direct``: the payload blobs the sender
    still has to store itself beside the call (not counted in ``nbytes``)."""

    seq: int
    chunks: list[tuple[bytes, ...]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    upload: list[str] = field(default_factory=list)
    nbytes: int = 0
    direct: list[str] = field(default_factory=list)

    def keys_order(self) -> list[str]:
        """The digests in insert.lua's KEYS order: uploads first, then the referenced others."""
        uploading = set(self.upload)
        return self.upload + [d for d in self.digests if d not in uploading]


class StoredDigests:
    """Observation digests a sender knows to be stored, so their blobs need not travel again: two
    generations, the older dropped when the newer holds more than ``size / 2`` (so at least the
    ``size / 2`` most recently used are remembered; cheaper than an exact LRU)."""

    def __init__(self, size: int) -> None:
        self._half = size // 2
        self._new: dict[str, None] = {}
        self._old: dict[str, None] = {}

    def add(self, digests: list[str]) -> None:
        self._new.update(dict.fromkeys(digests))
        if len(self._new) > self._half:
            self._old, self._new = self._new, {}

    def __contains__(self, d: str) -> bool:
        if d in self._new:
            return True
        if d in self._old:
            self._new[d] = None  # still in use: keep it in the newer generation
            return True
        return False

    def discard(self, d: str) -> None:
        """Forget ``d`` (gc collected its blob: the next batch using it uploads it)."""
        self._new.pop(d, None)
        self._old.pop(d, None)


def split_batches(chunks: list[tuple[tuple[bytes, ...], list[str]]], max_chunks: int, max_obs: int,
                  max_bytes: int, upload_size: Callable[[str], int | None],
                  next_seq: Callable[[], int]) -> list[Batch]:
    """Group (fields, digests) chunks, in order, into calls of at most ``max_chunks`` chunks,
    ``max_obs`` distinct digests and ``max_bytes`` bytes (a single bigger chunk goes alone).

    ``upload_size(d)``: the size of digest d's blob if it must be uploaded, else None; only the
    first batch referencing it uploads it. A single chunk over ``max_obs`` raises ValueError.
    """
    batches: list[Batch] = []
    uploaded: set[str] = set()
    current: set[str] = set()
    for fields, digests in chunks:
        if len(digests) > max_obs:
            raise ValueError(f"a chunk references {len(digests)} observation keys, more than {max_obs}")
        size = sum(len(f) for f in fields)
        for attempt in range(2):
            if attempt or not batches:
                batches.append(Batch(next_seq()))
                current = set()
            batch = batches[-1]
            new = [d for d in dict.fromkeys(digests) if d not in current]
            ups = {d: n for d in new if d not in uploaded and (n := upload_size(d)) is not None}
            nbytes = size + sum(ups.values())
            fits = (len(batch.chunks) < max_chunks and len(batch.digests) + len(new) <= max_obs
                    and (not batch.chunks or batch.nbytes + nbytes <= max_bytes))
            if fits:
                break
        batch.chunks.append(fields)
        batch.digests.extend(new)
        batch.upload.extend(ups)
        batch.nbytes += nbytes
        current.update(new)
        uploaded.update(ups)
    return batches


def pack_command(*args: bytes | str | int) -> bytes:
    """One command in RESP, built with a single join (redis-py's packing, through hiredis, costs
    many times more on the large arguments of an insert)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        parts += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(parts)


def insert_command(sha: str, keys: ShardKeys, sender: str, floor: int, batch: Batch,
                   blob: Callable[[str], bytes]) -> bytes:
    """The EVALSHA of ``insert.lua`` (script ``sha``) for one batch, KEYS and ARGV as the header
    of ``lua/insert.lua`` says (``floor``: the lowest seq in flight; ``blob(d)``: an upload's bytes)."""
    head = (keys.inbox, keys.pinned, keys.seen)
    obs_keys = keys.obs_keys(batch.keys_order())
    args: list[bytes | str | int] = [sender, batch.seq, floor, len(batch.chunks), len(batch.upload)]
    args += [blob(d) for d in batch.upload]
    for fields in batch.chunks:
        args += fields
    return pack_command("EVALSHA", sha, len(head) + len(obs_keys), *head, *obs_keys, *args)


def insert_pipeline(sha: str, keys: ShardKeys, sender: str, floor: int, batches: list[Batch],
                    blob: Callable[[str], bytes], payloads: Mapping[str, bytes], wait_replica_ms: int) -> list[bytes]:
    """The packed commands of one insert attempt: per batch, the pins (SADD) and SETNX of
    ``Batch.direct`` (bytes in ``payloads``), then its :func:`insert_command`; with
    ``wait_replica_ms``, a final ``WAIT 1 <ms>``. Read the replies with :func:`split_replies`."""
    commands = []
    for batch in batches:
        if batch.direct:
            # Pinned first: gc spares a pinned blob, and move.lua scores every pin, so a blob
            # whose insert never comes (the agent died) is still collected.
            commands.append(pack_command("SADD", keys.pinned, *batch.direct))
            commands += [pack_command("SETNX", keys.obs(d), payloads[d]) for d in batch.direct]
        commands.append(insert_command(sha, keys, sender, floor, batch, blob))
    if wait_replica_ms:
        commands.append(pack_command("WAIT", 1, wait_replica_ms))
    return commands


class BatchReplies(NamedTuple):
    """One batch's replies in an :func:`insert_pipeline`: the SETNX of each payload stored apart
    (in ``Batch.direct`` order: 1 stored now, 0 there already, or an error) and insert.lua's."""

    stored_apart: list[Any]
    insert: Any


def split_replies(batches: list[Batch], replies: list[Any]) -> list[BatchReplies]:
    """The replies of an :func:`insert_pipeline` of ``batches``, per batch (the SADD's are left
    out: an error there, e.g. OOM, refuses the SETNX and the call as well)."""
    out, position = [], 0
    for batch in batches:
        stored_apart: list[Any] = []
        if batch.direct:
            stored_apart = replies[position + 1:position + 1 + len(batch.direct)]
            position += 1 + len(batch.direct)
        out.append(BatchReplies(stored_apart, replies[position]))
        position += 1
    return out


def is_replicated(reply: Any) -> bool:
    """Whether a ``WAIT 1`` reply says a replica acknowledged every write before it."""
    return isinstance(reply, int) and reply >= 1


def send_commands(client: RedisClient, commands: list[bytes], key: str | None = None) -> list[Any]:
    """Send packed commands in one write on one pooled connection and read their replies in
    order; an error reply becomes its exception in the list. Connection errors disconnect and
    propagate (the outcome is then unknown). Blocks for one round trip. On Redis Cluster every
    command must touch ``key``'s slot, whose primary they go to (a MOVED reply or a connection
    error refreshes the slot map for the next call)."""
    cluster = isinstance(client, RedisCluster)
    if isinstance(client, RedisCluster):  # again, for mypy's narrowing
        if key is None:
            raise ValueError("send_commands on a cluster needs the key whose slot the commands touch")
        node = node_client(client, key)
    else:
        node = client
    pool = node.connection_pool
    try:
        conn = pool.get_connection()  # connects (and may fail) here
    except BaseException as exc:
        if cluster:
            refresh_topology(client, exc)
        raise
    try:
        conn.send_packed_command(commands)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
    except BaseException as exc:
        conn.disconnect()
        if cluster:
            refresh_topology(client, exc)
        raise
    finally:
        pool.release(conn)
    if cluster and any(isinstance(r, redis.exceptions.AskError) for r in replies):
        refresh_topology(client, next(r for r in replies if isinstance(r, redis.exceptions.AskError)))
    return replies


class Outcome(enum.Enum):
    """What to do with an insert.lua reply."""

    DONE = "stored now or before (DUP)"
    MISSING = "re-upload the missing observations, then retry"
    RELOAD = "load the script (NOSCRIPT), then retry"
    BACKOFF = "Redis is out of memory, busy or unreachable: wait, then retry"


_TRANSIENT = ("OOM", "BUSY", "LOADING", "MISCONF", "READONLY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN",
              "MOVED", "ASK")
# redis-py strips the error code from these, so they are told apart by class.
_TRANSIENT_TYPES = (redis.exceptions.OutOfMemoryError, redis.exceptions.BusyLoadingError,
                    redis.exceptions.ReadOnlyError, redis.exceptions.TryAgainError,
                    redis.exceptions.MasterDownError, redis.ConnectionError, redis.TimeoutError,
                    # cluster: the slot moved (resharding, failover) or has no primary right now
                    redis.exceptions.AskError, redis.exceptions.ClusterDownError)


def is_oom(error: BaseException | None) -> bool:
    """Whether ``error`` is Redis refusing a write for maxmemory (noeviction)."""
    return isinstance(error, redis.exceptions.OutOfMemoryError) or str(error).startswith("OOM")


def classify_reply(reply: Any) -> tuple[Outcome, Any]:
    """(outcome, detail) of one insert.lua pipeline reply: detail is ``"OK"``/``"DUP"``, the list
    of missing digests, or the error. Script errors (bad arguments, permissions) raise ScriptError."""
    if isinstance(reply, list) and reply and reply[0] in (b"OK", b"DUP"):
        return Outcome.DONE, reply[0].decode()
    if isinstance(reply, list) and reply and reply[0] == b"MISSING":
        return Outcome.MISSING, [d.decode() for d in reply[1:]]
    if isinstance(reply, redis.exceptions.NoScriptError):
        return Outcome.RELOAD, reply
    if isinstance(reply, _TRANSIENT_TYPES) or (
            isinstance(reply, redis.ResponseError) and str(reply).startswith(_TRANSIENT)):
        return Outcome.BACKOFF, reply
    raise ScriptError(f"insert.lua: {type(reply).__name__}: {reply}")
