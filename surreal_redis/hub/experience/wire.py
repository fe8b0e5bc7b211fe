"""The experience stream-entry format shared by the sender and the receiver.

One stream entry holds one chunk (see :class:`surreal_redis.chunks.Chunk`). ``move.lua`` writes
the fields in this fixed order (so Redis stores field names once per stream node):

- ``a``: agent id, ``e``: env index inside the agent's vectorized env (each a non-negative
  decimal integer below 2**31, without sign, spaces or leading zeros);
- ``o``: the digests of every observation leaf the chunk references, comma-separated, each once
  (empty when all leaves are inline), at most 256, each :func:`surreal_redis.keys.is_digest`; the
  template's referenced leaves use every one of them (an entry naming a digest its template never
  uses, which would keep that blob alive for nothing, is refused);
- ``d``: the payload, :mod:`surreal_redis.hub.experience.payload` (a per-sender template, then the arrays);
  or, instead of ``d``, ``p``: the id (:func:`payload_id`, in the grammar of digests, bound to the batch) of
  the blob ``obs:<p>`` holding the payload, which the agent stored itself with SETNX; the blob is collected
  like an observation once its entry is trimmed;
- ``s`` (written by ``move.lua``; optional): the chunk's origin,
  ``<sender tag>:<batch seq>:<index>:<count>`` (:class:`Origin`; the tag, :func:`sender_tag`, keeps
  the sender's uuid secret from the agents that read the stream), so the learner can tell a chunk
  delivered again after a failover from a new one.

The obsref sorted set scores a digest with :func:`id_score` of the newest entry referencing it, so
gc can compare with the first retained entry (move.lua and gc.lua compute the same score).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from surreal_redis.chunks import INITIAL_STATE, Chunk
from surreal_redis.hub.experience import payload as pl
from surreal_redis.keys import DIGEST_CHARS, is_digest

FIELDS = (b"a", b"e", b"o", b"d")
PAYLOAD_FIELD = b"p"  # instead of d: the id of the blob holding the payload
STORED_FIELDS = (b"a", b"e", b"o", PAYLOAD_FIELD)
ORIGIN_FIELD = b"s"
_FIELDS_WITH_ORIGIN = (*FIELDS, ORIGIN_FIELD)
_LAYOUTS = (FIELDS, _FIELDS_WITH_ORIGIN, STORED_FIELDS, (*STORED_FIELDS, ORIGIN_FIELD))
# Entry ids are <ms>-<seq>; the score keeps the order of ids exactly while seq < SEQ_SLOTS - 1 and
# stays monotonic beyond (ms * 1024 < 2**53 until the year 2248, so doubles hold it exactly).
SEQ_SLOTS = 1024
MAX_REFS = 256  # digests per entry: a referenced leaf indexes them with uint8 (insert.lua, move.lua agree)
_ID = re.compile(r"^(\d+)-(\d+)$")
_INDEX = re.compile(rb"0|[1-9][0-9]{0,9}")
_ORIGIN = re.compile(rb"([0-9a-f]{1,64}):([1-9][0-9]{0,14}):([1-9][0-9]?):([1-9][0-9]?)")
MAX_BATCH_CHUNKS = 64  # chunks per insert batch (insert.lua, move.lua)


class WireError(ValueError):
    """A stream entry that does not follow the format above."""


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


def sender_tag(uuid: str) -> str:
    """The sender name ``move.lua`` writes into an entry's origin: ``redis.sha1hex`` of the uuid."""
    return hashlib.sha1(uuid.encode()).hexdigest()


def payload_id(uuid: str, seq: int, position: int) -> str:
    """The blob id of the payload that chunk ``position`` (1-based) of batch ``seq`` of sender
    ``uuid`` stores apart: the first ``DIGEST_CHARS`` hex digits of SHA1 of ``"<uuid>:<seq>:<position>"``,
    which ``move.lua`` checks. Only the sender knows its uuid, so no other agent can name (or store
    first) the blob of that chunk, and an agent cannot reuse a blob under another batch."""
    return hashlib.sha1(f"{uuid}:{seq}:{position}".encode()).hexdigest()[:DIGEST_CHARS]


class Origin(NamedTuple):
    """Where a chunk came from: its sender (:func:`sender_tag` of the uuid each sender draws anew,
    so a restarted agent is a new sender), the seq of its insert batch (1, 2, ... per sender), its
    position in the batch (1-based) and the batch's size (chunks)."""

    sender: str
    seq: int
    position: int
    size: int


def parse_origin(value: bytes) -> Origin:
    """``b"<uuid>:<seq>:<index>:<count>"`` -> :class:`Origin`; WireError when malformed."""
    match = _ORIGIN.fullmatch(value) if isinstance(value, bytes) else None
    if match is None:
        raise WireError(f"entry field s = {value!r:.120} is not <uuid>:<seq>:<index>:<count>")
    sender, seq, position, size = match.groups()
    origin = Origin(sender.decode(), int(seq), int(position), int(size))
    if not origin.position <= origin.size <= MAX_BATCH_CHUNKS:
        raise WireError(f"entry field s = {value!r:.120}: need index <= count <= {MAX_BATCH_CHUNKS}")
    return origin


def entry_origin(fields: Mapping[bytes, bytes]) -> Origin | None:
    """The origin of an entry :func:`parse_entry` accepted (None when it has none)."""
    value = fields.get(ORIGIN_FIELD)
    return None if value is None else parse_origin(value)


# ---------------------------------------------------------------- decoding (receiver side)

class ParsedEntry(NamedTuple):
    """A stream entry with its fields checked and its payload decoded, obs not yet resolved.
    ``nbytes``: its fields and, for a stored payload, the payload blob."""

    agent_id: int
    env_index: int
    digests: list[str]
    payload: pl.Decoded
    nbytes: int
    origin: Origin | None = None


def payload_blob_id(fields: Mapping[bytes, bytes]) -> str | None:
    """The id of the blob holding an entry's payload (field ``p``), or None when the payload is
    inline (field ``d``, or no such field: :func:`parse_entry` refuses that). WireError when the
    fields are not a stored payload's or ``p`` is not a blob id (the grammar of digests)."""
    value = fields.get(PAYLOAD_FIELD) if isinstance(fields, Mapping) else None
    if value is None:
        return None
    if tuple(fields) not in _LAYOUTS:
        raise WireError(f"entry fields {list(fields)!r:.200} are not {list(STORED_FIELDS)!r} (plus optionally "
                        f"{ORIGIN_FIELD!r})")
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else ""
    if not is_digest(text):
        raise WireError(f"entry field p = {value!r:.80} is not a payload blob id (32 lower-case hex digits)")
    return text


def parse_entry(fields: Mapping[bytes, bytes], layouts: dict[bytes, pl.Layout] | None = None,
                payload: bytes | None = None) -> ParsedEntry:
    """Check the fields of one entry and decode its payload; ``layouts`` caches parsed templates.
    ``payload``: for an entry with field ``p``, the bytes of its blob (checked against the digest by
    the caller).

    Raises WireError (wrong fields, bad ids or digests, a stored payload not given) or CodecError
    (payload bytes).
    """
    if not isinstance(fields, Mapping) or tuple(fields) not in _LAYOUTS:
        names = list(fields) if isinstance(fields, Mapping) else fields
        raise WireError(f"entry fields {names!r:.200} are not {list(FIELDS)!r} (or p for d; plus optionally "
                        f"{ORIGIN_FIELD!r})")
    origin = entry_origin(fields)
    ids = []
    for name in (b"a", b"e"):
        value = fields[name]
        if not isinstance(value, bytes) or not _INDEX.fullmatch(value) or int(value) >= 2**31:
            raise WireError(f"entry field {name.decode()} = {value!r:.40} is not a non-negative integer < 2**31")
        ids.append(int(value))
    agent_id, env_index = ids
    refs = fields[b"o"]
    digests = refs.decode("ascii", "replace").split(",") if refs else []
    if len(digests) > MAX_REFS or not all(map(is_digest, digests)):
        raise WireError(f"bad observation digest list {refs[:100]!r}")
    if len(set(digests)) != len(digests):
        raise WireError("the observation digest list names a digest twice")
    nbytes = sum(len(v) for v in fields.values())
    data = fields.get(b"d")
    if data is None:
        stored = payload_blob_id(fields)
        if payload is None:
            raise WireError(f"the payload blob {stored} of this entry was not fetched")
        data, nbytes = payload, nbytes + len(payload)
    decoded = pl.decode(data, {} if layouts is None else layouts)
    _check_references(decoded, len(digests))
    return ParsedEntry(agent_id, env_index, digests, decoded, nbytes, origin)


def _check_references(p: pl.Decoded, count: int) -> None:
    """WireError unless the referenced leaves' indices use each of the ``count`` digests."""
    used: set[int] = set()
    for members in p.layout.ref_groups:
        for group in (pl.OBS, pl.FINAL):
            for i in members:
                used.update(np.unique(p.arrays[group, i]).tolist())
    if used and max(used) >= count:
        raise WireError(f"observation index {max(used)} outside the {count} digests")
    if len(used) != count:
        unused = sorted(set(range(count)) - used)
        raise WireError(f"the digest list names {len(unused)} observations the template never uses "
                        f"(positions {unused[:8]})")


def expected_frames(entry: ParsedEntry) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """digest -> (dtype, shape) the entry's template gives every observation it uses by digest
    (indices past the digest list are left to :func:`build_chunk` to refuse). What a fetched blob
    must declare before it is decompressed."""
    p, digests = entry.payload, entry.digests
    out: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for members in p.layout.ref_groups:
        leaf = p.layout.leaves[members[0]]
        spec = (leaf.dtype, leaf.shape)
        used = np.unique(np.concatenate([p.arrays[group, i] for group in (pl.OBS, pl.FINAL) for i in members]))
        for k in used.tolist():
            if k < len(digests):
                out.setdefault(digests[k], spec)
    return out


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
        table = np.frombuffer(bytearray().join([f.data for f in frames]), leaf.dtype)
        table = table.reshape((len(used), *leaf.shape))
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
