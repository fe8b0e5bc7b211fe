"""Raw stream entries -> :class:`Chunk` objects, for the receiver: fetch the payload blobs stored
apart (field ``p``), parse each entry, fetch the observation blobs it references (a bounded cache
of decoded arrays, then the rest), check every blob before it is decompressed, build the chunk.

Sizes before bytes: every blob's size is read first (``lua/sizes.lua``), and only blobs within
their limit are fetched (GETRANGE of at most that size): a payload blob within
``max_payload_bytes``, an observation blob within what its template's dtype and shape allow
(and ``max_obs_bytes`` decoded). Any other is set aside by its key and size, never fetched. A
read fetches at most ``max_read_bytes`` (observations counted at their template's size before
they are fetched); the entries past it are handed back, deferred, for the next read.

No entry's data can stop this: any exception it provokes makes that entry a failure with a
reason, and the others go on; an exception that is no Redis error while the entries are decoded
together makes each decode alone. A blob must hash to its digest (``verify_digests``), declare
the dtype and shape the entry's template gives it and stay under the compression ratio lz4 can
reach; only then is it decompressed, and only once decoded cached. A payload blob (a random id,
not a digest) is checked like an inline payload and never cached.
"""
from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import redis

from surreal_redis.chunks import Chunk
from surreal_redis.codec import CodecError, array_header, decode_array, digest, max_encoded_bytes
from surreal_redis.connection import CONNECTION_ERRORS, RedisClient
from surreal_redis.hub.experience import payload as pl
from surreal_redis.hub.experience.payload import Layout
from surreal_redis.hub.experience.receiver_config import ReceiverConfig
from surreal_redis.hub.experience.wire import (
    Origin,
    ParsedEntry,
    WireError,
    build_chunk,
    expected_frames,
    parse_entry,
    payload_blob_id,
)
from surreal_redis.keys import ShardKeys
from surreal_redis.scripts import ScriptError, Scripts

# An lz4 block never inflates more than ~255x: a blob that declares more is refused unread.
MAX_INFLATION = 256

Entry = tuple[int, bytes, dict]  # (shard, entry id, raw fields)
Failure = tuple[str, str, int, bytes, dict]  # (reason, detail, shard, entry id, raw fields)
DEFERRED = -2  # what _fetch_blobs answers for a blob past the read's budget

log = logging.getLogger(__name__)


class ReasonLog:
    """Counts failures (``total``, ``by_reason``) and logs each reason's first at WARNING (as
    ``first``, which takes ``args`` then the reason, if given), later ones at DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger, self.total, self.by_reason = logger, 0, dict[str, int]()

    def __call__(self, reason: str, message: str, *args: object, first: str = "", count: int = 1) -> None:
        self.total += count
        if reason in self.by_reason:
            self.logger.debug(message, *args)
        else:
            self.logger.warning(first or message, *args, *([reason] if first else []))
        self.by_reason[reason] = self.by_reason.get(reason, 0) + count


class Decoded(NamedTuple):
    """A good entry: the entry, its chunk, its size (``ParsedEntry.nbytes``) and its origin
    (``ParsedEntry.origin``: None for an entry written without one), parsed once here."""

    entry: Entry
    chunk: Chunk
    nbytes: int
    origin: Origin | None


class PayloadTooLarge(CodecError):
    """A payload declares more decoded bytes than ``max_payload_bytes``."""


def failure_reason(exc: BaseException) -> str:
    """The dead-letter reason of an exception raised by one entry's data."""
    if isinstance(exc, PayloadTooLarge):
        return "too_large"
    if isinstance(exc, WireError):
        return "format"
    if isinstance(exc, CodecError):
        return "codec"
    return "error"  # anything else a hostile entry can provoke (RecursionError, MemoryError, ...)


def _detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


def _refused(key: str, size: int, limit: int, what: str) -> str:
    """The dead letter's detail of a blob never fetched: its key and size, not its bytes."""
    held = "holds no string" if size < 0 else f"holds {size} bytes, over the {limit} of {what}"
    return f"blob {key} {held}; not fetched"


class EntryDecoder:
    """Decodes batches of entries of some shards; keeps parsed templates and decoded observations.

    ``cache_hits``, ``cache_misses`` (blobs fetched), ``blob_bytes`` (their bytes): cumulative;
    ``cached_bytes``: decoded observations in the cache now. Not thread-safe.
    """

    def __init__(self, client: RedisClient, keys: Mapping[int, ShardKeys], limits: ReceiverConfig) -> None:
        self.client, self.keys, self.limits = client, keys, limits
        self._scripts = Scripts(client)
        self._layouts: dict[bytes, Layout] = {}  # parsed chunk templates, one per sender layout
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.cached_bytes = 0
        self.cache_hits = self.cache_misses = self.blob_bytes = 0

    def decode(self, entries: list[Entry]) -> tuple[list[Decoded], list[Failure], list[Entry]]:
        """(decoded good entries, failures, deferred entries): :meth:`decode_together`, where an
        exception that is no Redis error (a MemoryError, say) makes each entry decode alone, so
        the one that provokes it is a failure (reason ``error``) and the others are delivered."""
        try:
            return self.decode_together(entries)
        except (redis.RedisError, ScriptError, *CONNECTION_ERRORS):
            raise
        except Exception as exc:  # one entry's data, whatever it provokes: see the module docstring
            if len(entries) == 1:
                return [], [(failure_reason(exc), _detail(exc), *entries[0])], []
            log.warning("decoding %d entries together failed (%s); decoding each alone", len(entries), _detail(exc))
            alone = [self.decode([entry]) for entry in entries]
            return ([d for result in alone for d in result[0]], [f for result in alone for f in result[1]],
                    [e for result in alone for e in result[2]])

    def decode_together(self, entries: list[Entry]) -> tuple[list[Decoded], list[Failure], list[Entry]]:
        """(decoded good entries, failures, deferred entries). Deferred: the entries past the
        read's byte budget (``max_read_bytes``), in their order, untouched: decode them in a later
        call (the first entry is never deferred). A round trip for the payloads stored apart and
        one for the observation blobs not cached, when there are any (more when a blob's bytes
        did not fit one reply); connection errors propagate."""
        parsed: list[tuple[int, bytes, dict, ParsedEntry]] = []
        failures: list[Failure] = []
        payloads, unusable, cut = self._fetch_payloads(entries)
        taken = sum(map(len, payloads.values()))
        for position, (shard, entry_id, fields) in enumerate(entries[:cut]):
            if position in unusable:
                failures.append((*unusable[position], shard, entry_id, fields))
                continue
            try:
                size = self._declared(fields, payloads.get(position))
                if parsed and taken + size > self.limits.max_read_bytes:
                    cut = position  # decoded by a later read
                    break
                taken += size
                parsed.append((shard, entry_id, fields, parse_entry(fields, self._layouts, payloads.get(position))))
            except Exception as exc:  # one entry's data, whatever it provokes: see the module docstring
                failures.append((failure_reason(exc), _detail(exc), shard, entry_id, fields))
        parsed, frames, deferred = self._within_budget(parsed, taken, failures)
        arrays, bad = self._fetch(frames)
        good: list[Decoded] = []
        for shard, entry_id, fields, entry in parsed:
            failed = next((bad[d] for d in entry.digests if d in bad), None)
            if failed is not None:
                failures.append((*failed, shard, entry_id, fields))
                continue
            try:
                chunk = build_chunk(entry, arrays)
            except Exception as exc:  # one entry's data, whatever it provokes: see the module docstring
                failures.append((failure_reason(exc), _detail(exc), shard, entry_id, fields))
                continue
            good.append(Decoded((shard, entry_id, fields), chunk, entry.nbytes, entry.origin))
        return good, failures, deferred + entries[cut:]

    def _declared(self, fields: dict, payload: bytes | None) -> int:
        """The bytes an entry's payload declares it decodes to (``payload``: its blob, if stored
        apart), read before it is decoded; CodecError (reason ``too_large``) over
        ``max_payload_bytes``, since a small lz4 body may declare up to 255 times its size."""
        data = payload if payload is not None else fields.get(b"d")
        try:
            size = pl.declared_nbytes(data, self._layouts) if isinstance(data, bytes) else 0
        except CodecError:
            return 0  # parse_entry says what is wrong (the fields first)
        if size > self.limits.max_payload_bytes:
            raise PayloadTooLarge(f"payload declares {size} decoded bytes, over the {self.limits.max_payload_bytes} "
                                  "of receiver.max_payload_bytes; not decoded")
        return size

    def _fetch_payloads(self, entries: list[Entry]) -> tuple[dict[int, bytes], dict[int, tuple[str, str]], int]:
        """The payload blobs of the entries with field ``p``, by position in ``entries``;
        (reason, detail) for the positions whose payload is unusable (format, missing_payload,
        too_large: over ``max_payload_bytes``, never fetched); and the position of the first entry
        whose payload did not fit the read's budget (``len(entries)`` when all did): that entry
        and the ones after it are left for a later read."""
        wanted: dict[int, dict[str, list[int]]] = {}  # shard -> blob id -> positions
        unusable: dict[int, tuple[str, str]] = {}
        for position, (shard, _, fields) in enumerate(entries):
            try:
                d = payload_blob_id(fields)
            except Exception as exc:  # one entry's data: see the module docstring
                unusable[position] = (failure_reason(exc), _detail(exc))
                continue
            if d is not None:
                wanted.setdefault(shard, {}).setdefault(d, []).append(position)
        limit = self.limits.max_payload_bytes
        payloads: dict[int, bytes] = {}
        cut = len(entries)
        fetched = self._fetch_blobs({shard: dict.fromkeys(ids, limit) for shard, ids in wanted.items()},
                                    self.limits.max_read_bytes)
        for shard, replies in fetched.items():
            for d, reply in replies.items():
                for position in wanted[shard][d]:  # its bytes count in its entry's nbytes
                    if reply is None:
                        unusable[position] = ("missing_payload", f"payload blob {d} is gone (collected)")
                    elif reply == DEFERRED:
                        cut = min(cut, position)
                    elif isinstance(reply, int):
                        unusable[position] = ("too_large", _refused(self.keys[shard].obs(d), reply, limit,
                                                                    "receiver.max_payload_bytes"))
                    else:
                        payloads[position] = reply
        return {p: b for p, b in payloads.items() if p < cut}, unusable, cut

    def _within_budget(self, parsed: list[tuple[int, bytes, dict, ParsedEntry]], taken: int,
                       failures: list[Failure]) -> tuple[list, dict[int, dict[str, tuple]], list[Entry]]:
        """The parsed entries whose observations still fit the read's budget after ``taken``
        bytes (counting each digest not cached at its template's largest blob, before any is
        fetched; the first entry always fits), the (shard -> digest -> spec) of the blobs they
        need, and the entries deferred to a later read. An entry whose template cannot be read
        is added to ``failures``."""
        budget, cache = self.limits.max_read_bytes, self._cache
        kept: list[tuple[int, bytes, dict, ParsedEntry]] = []
        frames: dict[int, dict[str, tuple]] = {}
        for index, item in enumerate(parsed):
            shard, entry_id, fields, entry = item
            try:
                specs = expected_frames(entry)
            except Exception as exc:  # one entry's data: see the module docstring
                failures.append((failure_reason(exc), _detail(exc), shard, entry_id, fields))
                continue
            new = {d: spec for d, spec in specs.items() if d not in cache and d not in frames.get(shard, ())}
            need = sum(max_encoded_bytes(*spec) for spec in new.values())
            if kept and taken + need > budget:
                return kept, frames, [(s, i, f) for s, i, f, _ in parsed[index:]]
            taken += need
            kept.append(item)
            frames.setdefault(shard, {}).update(specs)
        return kept, frames, []

    def _fetch_blobs(self, wanted: Mapping[int, Mapping[str, int]],
                     budget: int) -> dict[int, dict[str, bytes | int | None]]:
        """shard -> blob id -> its bytes, None (no such key), its size (over its limit, or -1: not
        a string; never fetched) or DEFERRED (past ``budget``), for ``wanted``: shard -> blob id
        -> size limit, in order of need. Two round trips, each one pipeline over the shards: the
        sizes (``sizes.lua``, one call per shard), then GETRANGE of at most that many bytes of each
        blob within its limit, in order, while the bytes taken stay within ``budget`` (the first
        blob always goes; once one does not fit, none after it is fetched). No round trip when
        nothing is wanted."""
        calls = [(shard, list(limits)) for shard, limits in wanted.items() if limits]
        if not calls:
            return {}
        sha = self._scripts.get("sizes").sha
        pipe = self.client.pipeline(transaction=False)
        for shard, ids in calls:
            keys = self.keys[shard].obs_keys(ids)
            pipe.execute_command("EVALSHA", sha, len(keys), *keys)
        out: dict[int, dict[str, bytes | int | None]] = {}
        for (shard, ids), sizes in zip(calls, pipe.execute(raise_on_error=False)):
            if isinstance(sizes, redis.exceptions.NoScriptError):
                sizes = self._scripts.call("sizes", self.keys[shard].obs_keys(ids), [])  # loads it there
            elif isinstance(sizes, Exception):
                raise sizes
            out[shard] = dict(zip(ids, sizes))
        taken, full = 0, False
        pipe = self.client.pipeline(transaction=False)
        fetching: list[tuple[int, str]] = []
        for shard, ids in calls:
            for d in ids:
                size = out[shard][d]
                if not isinstance(size, int) or size < 0 or size > wanted[shard][d]:
                    continue  # gone, or refused unread
                if full or (taken and taken + size > budget):
                    full, out[shard][d] = True, DEFERRED
                elif size == 0:
                    out[shard][d] = b""
                else:  # never more than the size read: a blob stored again meanwhile cannot grow
                    taken += size
                    fetching.append((shard, d))
                    pipe.getrange(self.keys[shard].obs(d), 0, size - 1)
        if fetching:
            for (shard, d), blob in zip(fetching, pipe.execute()):
                out[shard][d] = blob if blob else None  # empty: collected meanwhile
        return out

    def _blob_problem(self, d: str, blob: bytes, spec: tuple[np.dtype, tuple[int, ...]]) -> tuple[str, str] | None:
        """Why a fetched blob cannot be used for ``spec`` (reason, detail), checked before it is
        decompressed; None when it may be decoded."""
        if self.limits.verify_digests and digest(blob) != d:
            return "digest_mismatch", f"observation {d} holds data of digest {digest(blob)}"
        dtype, shape, codec, start = array_header(blob)
        if (dtype, shape) != spec:
            return "format", f"observation {d} is {dtype}{shape}, the template says {spec[0]}{spec[1]}"
        nbytes = math.prod(shape) * dtype.itemsize
        if codec == "lz4" and nbytes > MAX_INFLATION * (len(blob) - start) + 64:
            return "codec", f"observation {d}: {len(blob) - start} lz4 bytes cannot inflate to {nbytes}"
        return None

    def _fetch(self, frames: Mapping[int, Mapping[str, tuple]]) -> tuple[dict, dict]:
        """Decoded arrays of every digest in ``frames`` (shard -> digest -> (dtype, shape) the
        template of the first entry using it gives), and digest -> (reason, detail) for those that
        could not be resolved. A blob is fetched only when its template is within
        ``max_obs_bytes`` and its size within what that template allows (``max_encoded_bytes``)."""
        arrays: dict[str, np.ndarray] = {}
        wanted: dict[int, dict[str, int]] = {}
        specs: dict[str, tuple] = {}
        bad: dict[str, tuple[str, str]] = {}
        cache = self._cache
        for shard, digests in frames.items():
            for d, spec in digests.items():
                if d in arrays or d in bad:
                    continue
                cached = cache.get(d)
                if cached is not None:
                    cache.move_to_end(d)
                    arrays[d] = cached
                    self.cache_hits += 1
                    continue
                nbytes = math.prod(spec[1]) * spec[0].itemsize
                if nbytes > self.limits.max_obs_bytes:
                    bad[d] = ("too_large", f"observation {d} of {nbytes} bytes exceeds receiver.max_obs_bytes "
                                           "(not fetched)")
                    continue
                specs[d] = spec
                wanted.setdefault(shard, {})[d] = max_encoded_bytes(*spec)
        while wanted:
            later: dict[int, dict[str, int]] = {}
            for shard, replies in self._fetch_blobs(wanted, self.limits.max_read_bytes).items():
                for d, blob in replies.items():
                    if blob == DEFERRED:
                        later.setdefault(shard, {})[d] = wanted[shard][d]
                    else:
                        self._resolve(d, blob, specs[d], self.keys[shard].obs(d), arrays, bad)
            wanted = later
        return arrays, bad

    def _resolve(self, d: str, blob: bytes | int | None, spec: tuple, key: str, arrays: dict, bad: dict) -> None:
        """Check and decode one :meth:`_fetch_blobs` reply for digest ``d`` into ``arrays`` (and the cache),
        or record why it is unusable in ``bad``."""
        self.cache_misses += 1
        if blob is None:
            bad[d] = ("missing_obs", f"observation {d} is gone (expired or collected)")
            return
        if isinstance(blob, int):
            bad[d] = ("too_large", _refused(key, blob, max_encoded_bytes(*spec), f"its template {spec[0]}{spec[1]}"))
            return
        self.blob_bytes += len(blob)
        try:
            problem = self._blob_problem(d, blob, spec)
            if problem is None:
                array = decode_array(blob)
        except Exception as exc:  # a hostile blob must not stop the reader
            problem = (failure_reason(exc), f"observation {d}: {_detail(exc)}")
        if problem is not None:
            bad[d] = problem
            return
        array.setflags(write=False)  # shared by every chunk referencing the digest
        arrays[d] = array
        self._cache_put(d, array)

    def _cache_put(self, d: str, array: np.ndarray) -> None:
        limits = self.limits
        if not limits.cache_entries or array.nbytes > limits.cache_bytes:
            return
        self._cache[d] = array
        self.cached_bytes += array.nbytes
        while len(self._cache) > limits.cache_entries or self.cached_bytes > limits.cache_bytes:
            self.cached_bytes -= self._cache.popitem(last=False)[1].nbytes
