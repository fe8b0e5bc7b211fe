"""The experience stream-entry format shared by the sender and the receiver.

One stream entry holds one chunk (see :class:`surreal_redis.experience.Chunk`). The insert script
writes the fields in this fixed order (so Redis stores field names once per stream node):

- ``a``: agent id (decimal), ``e``: env index inside the agent's vectorized env (decimal);
- ``o``: the digests of every observation leaf the chunk references, comma-separated, each once
  (empty when all leaves are inline), at most 256;
- ``d``: the payload, :mod:`surreal_redis.hub.payload` (a per-sender template, then the arrays).

The obsref sorted set scores a digest with :func:`id_score` of the newest entry referencing it, so
gc can compare with the first retained entry (insert.lua and gc.lua compute the same score).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import redis

from surreal_redis.codec import Tree
from surreal_redis.experience import Chunk
from surreal_redis.hub import payload as pl
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys
from surreal_redis.scripts import ScriptError

FIELDS = (b"a", b"e", b"o", b"d")
INITIAL_STATE = "initial_state"
# Entry ids are <ms>-<seq>; the score keeps the order of ids exactly while seq < SEQ_SLOTS - 1 and
# stays monotonic beyond (ms * 1024 < 2**53 until the year 2248, so doubles hold it exactly).
SEQ_SLOTS = 1024
_DIGESTS = re.compile(rb"^[0-9a-f]{32}(?:,[0-9a-f]{32}){0,255}$")
_ID = re.compile(r"^(\d+)-(\d+)$")


class WireError(ValueError):
    """A stream entry that does not follow the format above."""


def tree_leaves(tree: Tree) -> list[Any]:
    """Leaves of a dict/list/tuple tree, depth first, dicts in insertion order."""
    if isinstance(tree, Mapping):
        return [leaf for value in tree.values() for leaf in tree_leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for value in tree for leaf in tree_leaves(value)]
    return [tree]


def tree_map(tree: Tree, fn: Callable[[int, Any], Any]) -> Tree:
    """A copy of ``tree`` with leaf number i (depth-first ordinal) replaced by ``fn(i, leaf)``."""
    counter = iter(range(1 << 62))

    def walk(node: Tree) -> Tree:
        if isinstance(node, Mapping):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(value) for value in node)
        return fn(next(counter), node)

    return walk(tree)


def parse_id(entry_id: bytes | str) -> tuple[int, int]:
    """``b"1700000000000-3"`` -> ``(1700000000000, 3)``; WireError when malformed."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    match = _ID.match(text)
    if not match:
        raise WireError(f"bad stream entry id {entry_id!r}")
    return int(match.group(1)), int(match.group(2))


def id_score(entry_id: bytes | str) -> int:
    """obsref score of an entry id: ``ms * 1024 + min(seq, 1023)`` (monotonic in the id)."""
    ms, seq = parse_id(entry_id)
    return ms * SEQ_SLOTS + min(seq, SEQ_SLOTS - 1)


# ---------------------------------------------------------------- decoding (receiver side)

class ParsedEntry(NamedTuple):
    """A stream entry with its fields checked and its payload decoded, obs not yet resolved."""

    agent_id: int
    env_index: int
    digests: list[str]
    payload: pl.Decoded
    nbytes: int


def parse_entry(fields: Mapping[bytes, bytes], layouts: dict[bytes, pl.Layout] | None = None) -> ParsedEntry:
    """Check the fields of one entry and decode its payload; ``layouts`` caches parsed templates.

    Raises WireError (wrong fields, bad digests) or CodecError (payload bytes).
    """
    if not isinstance(fields, Mapping) or tuple(fields) != FIELDS:
        names = list(fields) if isinstance(fields, Mapping) else fields
        raise WireError(f"entry fields {names!r} are not {list(FIELDS)!r}")
    try:
        agent_id, env_index = int(fields[b"a"]), int(fields[b"e"])
    except ValueError as exc:
        raise WireError(f"bad entry header: {exc}") from None
    refs = fields[b"o"]
    if refs and not _DIGESTS.match(refs):
        raise WireError(f"bad observation digest list {refs[:100]!r}")
    digests = refs.decode().split(",") if refs else []
    decoded = pl.decode(fields[b"d"], {} if layouts is None else layouts)
    nbytes = sum(len(v) for v in fields.values())
    return ParsedEntry(agent_id, env_index, digests, decoded, nbytes)


def referenced_slots(entry: ParsedEntry) -> int:
    """Observation rows the entry references by digest (T+1 per referenced leaf)."""
    return sum(entry.payload.steps + 1 for leaf in entry.payload.layout.leaves if leaf.ref)


def _resolve_refs(p: pl.Decoded, digests: list[str], arrays: Mapping[str, np.ndarray]) -> dict:
    """(group, leaf) -> stacked observations of every referenced leaf, read-only.

    The frames of leaves of one (dtype, shape) are copied once into a table; a leaf whose
    indices form a consecutive range (a frame stack, within an episode) is a view of it, any
    other a gathered copy. Leaves may thus share memory.
    """
    out = {}
    for members in p.layout.ref_groups:
        leaf = p.layout.leaves[members[0]]
        columns = {(group, i): p.arrays[group, i] for group in (pl.OBS, pl.FINAL) for i in members}
        used = np.unique(np.concatenate(list(columns.values()))).tolist()
        if used and used[-1] >= len(digests):
            raise WireError(f"observation index {used[-1]} outside the {len(digests)} digests")
        frames = [arrays[digests[k]] for k in used]
        for k, frame in zip(used, frames):
            if frame.dtype != leaf.dtype or frame.shape != leaf.shape:
                raise WireError(f"observation {digests[k]} is {frame.dtype}{frame.shape}, the template "
                                f"says {leaf.dtype}{leaf.shape}")
        table = np.frombuffer(bytearray().join(frames), leaf.dtype).reshape((len(used), *leaf.shape))
        table.setflags(write=False)
        position = None if used == list(range(len(used))) else {k: n for n, k in enumerate(used)}
        for key, column in columns.items():
            rows = column.tolist() if position is None else [position[k] for k in column.tolist()]
            first = rows[0] if rows else 0
            if rows == list(range(first, first + len(rows))):
                out[key] = table[first:first + len(rows)]
            else:
                out[key] = table[rows]
                out[key].setflags(write=False)
    return out


def build_chunk(entry: ParsedEntry, arrays: Mapping[str, np.ndarray]) -> Chunk:
    """The Chunk of a parsed entry; ``arrays`` maps every digest of the entry to its decoded array.

    Raises WireError when the payload is inconsistent (step count, flags, indices, shapes).
    The arrays of the chunk are writable and its own, except the observation leaves referenced
    by digest: read-only, and possibly sharing memory with each other (see :func:`_resolve_refs`).
    """
    p = entry.payload
    layout, steps, a = p.layout, p.steps, p.arrays
    if steps < 1:
        raise WireError("chunk has no steps")
    terminated, truncated = a[pl.TERMINATED, 0], a[pl.TRUNCATED, 0]
    ended = (terminated | truncated).nonzero()[0].tolist()
    if len(ended) != p.finals:
        raise WireError(f"{p.finals} final observations for {len(ended)} episodes that ended")
    resolved = _resolve_refs(p, entry.digests, arrays) if layout.ref_groups else {}
    obs_leaves = [resolved.get((pl.OBS, i), a[pl.OBS, i]) for i in range(len(layout.leaves))]
    final_leaves = [resolved.get((pl.FINAL, i), a[pl.FINAL, i]) for i in range(len(layout.leaves))]
    obs = layout.build_obs(obs_leaves)
    final_obs = {t: layout.build_obs([leaf[row] for leaf in final_leaves]) for row, t in enumerate(ended)}
    versions = a[pl.VERSION, 0]
    if versions.shape[0] != steps:
        versions = versions.repeat(steps)
    extras: dict[str, Any] = {name: a[pl.EXTRAS, i] for i, (name, _, _) in enumerate(layout.extras)}
    if layout.build_state is not None:
        extras[INITIAL_STATE] = layout.build_state([a[pl.STATE, i] for i in range(len(layout.state_leaves))])
    return Chunk(entry.agent_id, entry.env_index, obs, a[pl.ACTIONS, 0], a[pl.REWARDS, 0], terminated,
                 truncated, final_obs, versions, extras)


# ---------------------------------------------------------------- backlog (backpressure, janitor)

class Backlog(NamedTuple):
    """Where the learner's consumer group stands on one shard stream.

    ``unread``: entries in the stream not yet delivered to the group; ``last_delivered``: the
    group's last-delivered id (None when the group does not exist: nothing was delivered).
    """

    length: int
    unread: int
    first_id: bytes | None
    last_delivered: bytes | None


def read_backlog(client: redis.Redis, keys: ShardKeys, max_count: int = 10_000) -> Backlog:
    """One round trip (XINFO GROUPS, XLEN, first entry id); blocks only for that round trip.

    Redis >= 7 reports the group's ``lag``, but it still counts entries trimmed before delivery, so
    it is capped by the entries after the last-delivered id. Without a usable lag (Redis 6.2), the
    unread entries are counted with an XRANGE of at most ``max_count`` ids.
    """
    pipe = client.pipeline(transaction=False)
    pipe.xinfo_groups(keys.exp)
    pipe.xlen(keys.exp)
    pipe.xrange(keys.exp, count=1)
    groups, length, first = pipe.execute(raise_on_error=False)
    if isinstance(length, Exception):
        raise length
    first_id = first[0][0] if isinstance(first, list) and first else None
    if isinstance(groups, redis.ResponseError) and "no such key" in str(groups).lower():
        groups = []
    elif isinstance(groups, Exception):
        raise groups
    group = next((g for g in groups if g["name"] in (CONSUMER_GROUP, CONSUMER_GROUP.encode())), None)
    if group is None:
        return Backlog(length, length, first_id, None)
    last = group["last-delivered-id"]
    if first_id is None:
        unread = 0
    elif parse_id(first_id) > parse_id(last):
        unread = length  # everything after the last delivered entry is still there, unread
    elif isinstance(group.get("lag"), int):
        unread = min(group["lag"], length)
    else:
        after = client.xrange(keys.exp, min=b"(" + last, count=max_count)
        unread = len(after)
    return Backlog(length, unread, first_id, last)


# ---------------------------------------------------------------- insert protocol (sender side)

@dataclass
class Batch:
    """One insert.lua call: chunks (stream fields a, e, o, d), the digests they reference (each
    once), those whose blobs this call uploads, and its size in bytes (fields and blobs)."""

    seq: int
    chunks: list[tuple[bytes, ...]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    upload: list[str] = field(default_factory=list)
    nbytes: int = 0

    def keys_order(self) -> list[str]:
        """The digests in insert.lua's KEYS order: uploads first, then the referenced others."""
        uploading = set(self.upload)
        return self.upload + [d for d in self.digests if d not in uploading]


def split_batches(chunks: list[tuple[tuple[bytes, ...], list[str]]], max_chunks: int, max_obs: int,
                  max_bytes: int, upload_size: Callable[[str], int | None],
                  next_seq: Callable[[], int]) -> list[Batch]:
    """Group (fields, digests) chunks, in order, into calls of at most ``max_chunks`` chunks,
    ``max_obs`` distinct digests and ``max_bytes`` bytes (a single bigger chunk goes alone).

    ``upload_size(d)``: the size of digest d's blob if it must be uploaded (not known to be
    stored), else None. The first batch referencing such a digest uploads it; later ones only
    reference it (the pipeline runs them in order). A single chunk over ``max_obs`` raises
    ValueError.
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
            sizes = {d: upload_size(d) for d in new if d not in uploaded}
            ups = [d for d, n in sizes.items() if n is not None]
            nbytes = size + sum(sizes[d] for d in ups)
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
    """One command in RESP, built with a single join. (hiredis' pack_command, which redis-py
    uses, spends ~2.5 µs per KB of arguments: 2 ms for a 0.8 MB insert, 30x this.)"""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        parts += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(parts)


def send_commands(client: redis.Redis, commands: list[bytes]) -> list[Any]:
    """Send packed commands in one write on one pooled connection and read their replies in
    order; an error reply becomes its exception in the list. Connection errors disconnect and
    propagate (the outcome of the commands is then unknown). Blocks for one round trip."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(commands)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


class Outcome(enum.Enum):
    """What to do with an insert.lua reply."""

    DONE = "stored now or before (DUP)"
    MISSING = "re-upload the missing observations, then retry"
    RELOAD = "load the script (NOSCRIPT), then retry"
    BACKOFF = "Redis is out of memory, busy or unreachable: wait, then retry"


_TRANSIENT = ("OOM", "BUSY", "LOADING", "MISCONF", "READONLY", "TRYAGAIN", "MASTERDOWN")
# redis-py strips the error code from these, so they are told apart by class.
_TRANSIENT_TYPES = (redis.exceptions.OutOfMemoryError, redis.exceptions.BusyLoadingError,
                    redis.exceptions.ReadOnlyError, redis.exceptions.TryAgainError,
                    redis.exceptions.MasterDownError, redis.ConnectionError, redis.TimeoutError)


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
