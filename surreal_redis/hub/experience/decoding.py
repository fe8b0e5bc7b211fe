"""Raw stream entries -> :class:`Chunk` objects, for the receiver: fetch the payload blobs stored
apart (field ``p``), parse each entry, fetch the observation blobs it references (a bounded cache
of decoded arrays, then one MGET per shard), check every blob before it is decompressed, build
the chunk.

No entry's data can stop this: any exception it provokes makes that entry a failure with a
reason, and the others go on. A blob must hash to its digest (``verify_digests``), declare the
dtype and shape the entry's template gives it, stay under ``max_obs_bytes`` and under the
compression ratio lz4 can reach; only then is it decompressed, and only once decoded cached. A
payload blob (a random id, not a digest) is checked like an inline payload and never cached.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from surreal_redis.chunks import Chunk
from surreal_redis.codec import CodecError, array_header, decode_array, digest
from surreal_redis.connection import RedisClient
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

# An lz4 block never inflates more than ~255x: a blob that declares more is refused unread.
MAX_INFLATION = 256

Entry = tuple[int, bytes, dict]  # (shard, entry id, raw fields)
Failure = tuple[str, str, int, bytes, dict]  # (reason, detail, shard, entry id, raw fields)


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


def failure_reason(exc: BaseException) -> str:
    """The dead-letter reason of an exception raised by one entry's data."""
    if isinstance(exc, WireError):
        return "format"
    if isinstance(exc, CodecError):
        return "codec"
    return "error"  # anything else a hostile entry can provoke (RecursionError, MemoryError, ...)


def _detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


class EntryDecoder:
    """Decodes batches of entries of some shards; keeps parsed templates and decoded observations.

    ``cache_hits``, ``cache_misses`` (blobs fetched), ``blob_bytes`` (their bytes): cumulative;
    ``cached_bytes``: decoded observations in the cache now. Not thread-safe.
    """

    def __init__(self, client: RedisClient, keys: Mapping[int, ShardKeys], limits: ReceiverConfig) -> None:
        self.client, self.keys, self.limits = client, keys, limits
        self._layouts: dict[bytes, Layout] = {}  # parsed chunk templates, one per sender layout
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.cached_bytes = 0
        self.cache_hits = self.cache_misses = self.blob_bytes = 0

    def decode(self, entries: list[Entry]) -> tuple[list[Decoded], list[Failure]]:
        """(decoded good entries, failures). A round trip for the payloads stored apart and one
        for the observation blobs not cached, when there are any; connection errors propagate."""
        parsed: list[tuple[int, bytes, dict, ParsedEntry]] = []
        failures: list[Failure] = []
        payloads, unusable = self._fetch_payloads(entries)
        for position, (shard, entry_id, fields) in enumerate(entries):
            if position in unusable:
                failures.append((*unusable[position], shard, entry_id, fields))
                continue
            try:
                parsed.append((shard, entry_id, fields, parse_entry(fields, self._layouts, payloads.get(position))))
            except Exception as exc:  # one entry's data, whatever it provokes: see the module docstring
                failures.append((failure_reason(exc), _detail(exc), shard, entry_id, fields))
        arrays, bad = self._fetch(parsed)
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
        return good, failures

    def _fetch_payloads(self, entries: list[Entry]) -> tuple[dict[int, bytes], dict[int, tuple[str, str]]]:
        """The payload blobs of the entries with field ``p``, by position in ``entries``, and
        (reason, detail) for the positions whose payload is unusable (format, missing_payload)."""
        wanted: dict[int, dict[str, list[int]]] = {}  # shard -> digest -> positions
        unusable: dict[int, tuple[str, str]] = {}
        for position, (shard, _, fields) in enumerate(entries):
            try:
                d = payload_blob_id(fields)
            except Exception as exc:  # one entry's data: see the module docstring
                unusable[position] = (failure_reason(exc), _detail(exc))
                continue
            if d is not None:
                wanted.setdefault(shard, {}).setdefault(d, []).append(position)
        payloads: dict[int, bytes] = {}
        for digests, blobs in self._mget(wanted):
            for (d, positions), blob in zip(digests.items(), blobs):
                for position in positions:  # its bytes count in its entry's nbytes
                    if blob is None:
                        unusable[position] = ("missing_payload", f"payload blob {d} is gone (collected)")
                    else:
                        payloads[position] = blob
        return payloads, unusable

    def _mget(self, wanted: Mapping[int, dict[str, Any]]) -> list[tuple[dict[str, Any], list]]:
        """(digests, their blobs) per shard of ``wanted`` (shard -> digest -> anything): one MGET
        per shard, in one pipeline; no round trip when nothing is wanted."""
        if not wanted:
            return []
        pipe = self.client.pipeline(transaction=False)
        for shard, digests in wanted.items():
            pipe.execute_command("MGET", *self.keys[shard].obs_keys(list(digests)))  # (cluster pipelines refuse .mget)
        return list(zip(wanted.values(), pipe.execute()))

    def _blob_problem(self, d: str, blob: bytes, spec: tuple[np.dtype, tuple[int, ...]]) -> tuple[str, str] | None:
        """Why a fetched blob cannot be used for ``spec`` (reason, detail), checked before it is
        decompressed; None when it may be decoded."""
        if self.limits.verify_digests and digest(blob) != d:
            return "digest_mismatch", f"observation {d} holds data of digest {digest(blob)}"
        dtype, shape, codec, start = array_header(blob)
        if (dtype, shape) != spec:
            return "format", f"observation {d} is {dtype}{shape}, the template says {spec[0]}{spec[1]}"
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.limits.max_obs_bytes:
            return "too_large", f"observation {d} of {nbytes} bytes exceeds receiver.max_obs_bytes"
        if codec == "lz4" and nbytes > MAX_INFLATION * (len(blob) - start) + 64:
            return "codec", f"observation {d}: {len(blob) - start} lz4 bytes cannot inflate to {nbytes}"
        return None

    def _fetch(self, parsed: list[tuple[int, bytes, dict, ParsedEntry]]) -> tuple[dict, dict]:
        """Decoded arrays of every digest the entries use, and digest -> (reason, detail) for those
        that could not be resolved (checked against the template of the first entry using it)."""
        arrays: dict[str, np.ndarray] = {}
        wanted: dict[int, dict[str, tuple]] = {}
        cache = self._cache
        for shard, _, _, entry in parsed:
            for d, spec in expected_frames(entry).items():
                if d in arrays:
                    continue
                cached = cache.get(d)
                if cached is not None:
                    cache.move_to_end(d)
                    arrays[d] = cached
                    self.cache_hits += 1
                else:
                    wanted.setdefault(shard, {}).setdefault(d, spec)
        bad: dict[str, tuple[str, str]] = {}
        for digests, blobs in self._mget(wanted):
            for (d, spec), blob in zip(digests.items(), blobs):
                self.cache_misses += 1
                if blob is None:
                    bad[d] = ("missing_obs", f"observation {d} is gone (expired or collected)")
                    continue
                self.blob_bytes += len(blob)
                try:
                    problem = self._blob_problem(d, blob, spec)
                    if problem is None:
                        array = decode_array(blob)
                except Exception as exc:  # a hostile blob must not stop the reader
                    problem = (failure_reason(exc), f"observation {d}: {_detail(exc)}")
                if problem is not None:
                    bad[d] = problem
                    continue
                array.setflags(write=False)  # shared by every chunk referencing the digest
                arrays[d] = array
                self._cache_put(d, array)
        return arrays, bad

    def _cache_put(self, d: str, array: np.ndarray) -> None:
        limits = self.limits
        if not limits.cache_entries or array.nbytes > limits.cache_bytes:
            return
        self._cache[d] = array
        self.cached_bytes += array.nbytes
        while len(self._cache) > limits.cache_entries or self.cached_bytes > limits.cache_bytes:
            self.cached_bytes -= self._cache.popitem(last=False)[1].nbytes
