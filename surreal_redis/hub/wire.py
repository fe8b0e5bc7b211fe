"""The experience stream-entry format shared by the sender and the receiver.

One stream entry holds one chunk (see :class:`surreal_redis.experience.Chunk`). The insert script
writes the fields in this fixed order (so Redis stores field names once per stream node):

- ``a``: agent id (decimal), ``e``: env index inside the agent's vectorized env (decimal);
- ``o``: the digests of every observation leaf the chunk references, comma-separated, each once
  (empty when all leaves are inline);
- ``d``: the payload, a :func:`surreal_redis.codec.encode_tree` tree::

      obs            obs tree; an inline leaf is [T+1, ...], a referenced leaf is int32 [T+1],
                     indices into ``o``
      ref            int32 [R], depth-first ordinals of the referenced leaves of ``obs``
      actions        [T, ...]
      rewards        float32 [T]
      terminated     bool [T]
      truncated      bool [T]
      policy_version int64 [T]
      extras         {name: [T, ...]} plus optional "initial_state" (no time axis)
      final_t        int32 [F], steps whose episode ended (only when F > 0)
      final_obs      same layout as ``obs`` with F rows instead of T+1 (only when F > 0)

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

from surreal_redis.codec import Tree, decode_tree
from surreal_redis.experience import Chunk
from surreal_redis.keys import CONSUMER_GROUP, ShardKeys
from surreal_redis.scripts import ScriptError

FIELDS = (b"a", b"e", b"o", b"d")
INITIAL_STATE = "initial_state"
# Entry ids are <ms>-<seq>; the score keeps the order of ids exactly while seq < SEQ_SLOTS - 1 and
# stays monotonic beyond (ms * 1024 < 2**53 until the year 2248, so doubles hold it exactly).
SEQ_SLOTS = 1024
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
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
    payload: dict[str, Any]
    nbytes: int


def parse_entry(fields: Mapping[bytes, bytes]) -> ParsedEntry:
    """Check the fields of one entry and decode its payload.

    Raises WireError (wrong fields, bad digests) or CodecError (payload bytes).
    """
    if not isinstance(fields, Mapping) or tuple(fields) != FIELDS:
        names = list(fields) if isinstance(fields, Mapping) else fields
        raise WireError(f"entry fields {names!r} are not {list(FIELDS)!r}")
    try:
        agent_id, env_index = int(fields[b"a"]), int(fields[b"e"])
        digests = fields[b"o"].decode("ascii").split(",") if fields[b"o"] else []
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"bad entry header: {exc}") from None
    bad = [d for d in digests if not _DIGEST.match(d)]
    if bad:
        raise WireError(f"bad observation digest {bad[0]!r}")
    payload = decode_tree(fields[b"d"])
    if not isinstance(payload, dict):
        raise WireError(f"payload is a {type(payload).__name__}, not a dict")
    nbytes = sum(len(v) for v in fields.values())
    return ParsedEntry(agent_id, env_index, digests, payload, nbytes)


def _array(payload: Mapping[str, Any], name: str, dtype: str, length: int | None) -> np.ndarray:
    value = payload.get(name)
    if not isinstance(value, np.ndarray) or value.ndim < 1 or value.dtype != np.dtype(dtype):
        raise WireError(f"payload {name!r} must be a {dtype} array with a time axis, got {value!r:.80}")
    if length is not None and value.shape[0] != length:
        raise WireError(f"payload {name!r} has {value.shape[0]} rows, expected {length}")
    return value


def _resolve(tree: Tree, refs: set[int], rows: int, digests: list[str],
             arrays: Mapping[str, np.ndarray], what: str) -> Tree:
    """Replace referenced leaves (int32 index rows) by the stacked observation arrays."""

    def leaf(i: int, value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray) or value.ndim < 1 or value.shape[0] != rows:
            raise WireError(f"{what} leaf {i} must have {rows} rows, got {value!r:.80}")
        if i not in refs:
            return value
        if value.dtype != np.int32 or value.ndim != 1:
            raise WireError(f"{what} leaf {i} must be int32 digest indices, got {value.dtype}{value.shape}")
        if value.min() < 0 or value.max() >= len(digests):
            raise WireError(f"{what} leaf {i} indexes digests outside 0..{len(digests) - 1}")
        frames = [arrays[digests[k]] for k in value.tolist()]
        if any(f.shape != frames[0].shape or f.dtype != frames[0].dtype for f in frames):
            raise WireError(f"{what} leaf {i} references observations of different shapes or dtypes")
        return np.stack(frames)

    if rows < 1:
        raise WireError(f"{what} has no rows")

    return tree_map(tree, leaf)


def build_chunk(entry: ParsedEntry, arrays: Mapping[str, np.ndarray]) -> Chunk:
    """The Chunk of a parsed entry; ``arrays`` maps every digest of the entry to its decoded array.

    Raises WireError when the payload is inconsistent (shapes, dtypes, indices, final obs).
    """
    p = entry.payload
    rewards = _array(p, "rewards", "float32", None)
    steps = rewards.shape[0]
    if steps < 1:
        raise WireError("chunk has no steps")
    terminated = _array(p, "terminated", "bool", steps)
    truncated = _array(p, "truncated", "bool", steps)
    versions = _array(p, "policy_version", "int64", steps)
    actions = p.get("actions")
    if not isinstance(actions, np.ndarray) or actions.ndim < 1 or actions.shape[0] != steps:
        raise WireError(f"payload 'actions' must be an array of {steps} rows, got {actions!r:.80}")
    refs = set(_array(p, "ref", "int32", None).tolist())
    obs = _resolve(p.get("obs"), refs, steps + 1, entry.digests, arrays, "obs")
    extras = p.get("extras")
    if not isinstance(extras, dict):
        raise WireError(f"payload 'extras' must be a dict, got {type(extras).__name__}")
    for name, value in extras.items():
        if name != INITIAL_STATE and not (isinstance(value, np.ndarray) and value.ndim >= 1
                                          and value.shape[0] == steps):
            raise WireError(f"extras {name!r} must be an array of {steps} rows")
    ended = np.flatnonzero(terminated | truncated).tolist()
    final_obs: dict[int, Tree] = {}
    if "final_t" in p:
        final_t = _array(p, "final_t", "int32", None).tolist()
        stacked = _resolve(p.get("final_obs"), refs, len(final_t), entry.digests, arrays, "final_obs")
        final_obs = {t: tree_map(stacked, lambda _i, leaf, r=row: leaf[r]) for row, t in enumerate(final_t)}
    if sorted(final_obs) != ended:
        raise WireError(f"final_obs given for steps {sorted(final_obs)}, episodes ended at steps {ended}")
    return Chunk(entry.agent_id, entry.env_index, obs, actions, rewards, terminated, truncated,
                 final_obs, versions, extras)


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
    once, in KEYS order) and those still to upload before the call."""

    seq: int
    chunks: list[tuple[bytes, ...]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    upload: list[str] = field(default_factory=list)


def split_batches(chunks: list[tuple[tuple[bytes, ...], list[str]]], max_chunks: int, max_obs: int,
                  next_seq: Callable[[], int]) -> list[Batch]:
    """Group (fields, digests) chunks, in order, into calls of at most ``max_chunks`` chunks and
    ``max_obs`` distinct digests. A single chunk over ``max_obs`` raises ValueError."""
    batches: list[Batch] = []
    seen: set[str] = set()
    for fields, digests in chunks:
        if len(digests) > max_obs:
            raise ValueError(f"a chunk references {len(digests)} observation keys, more than {max_obs}")
        new = [d for d in digests if d not in seen]
        if not batches or len(batches[-1].chunks) >= max_chunks or len(seen) + len(new) > max_obs:
            batches.append(Batch(next_seq()))
            seen = set()
            new = list(dict.fromkeys(digests))
        batch = batches[-1]
        batch.chunks.append(fields)
        batch.digests.extend(new)
        seen.update(new)
    return batches


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
