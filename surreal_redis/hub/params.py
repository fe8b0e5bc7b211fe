"""Parameter broadcast: the learner publishes versioned blobs, agents pull only what changed.

Wire layout (key names from :class:`surreal_redis.keys.ParamKeys`):

- ``blob:<v>``: the parameters as :func:`surreal_redis.codec.encode_tree` bytes (pickle-free,
  optionally lz4 per leaf). The publisher uploads them to its own ``staging:<id>`` key (with a TTL,
  so a crash leaks nothing); ``lua/publish.lua`` renames that to ``blob:<v>``, and expires it a
  grace period after the next version replaces it.
- ``meta``: hash ``version nbytes chunk digest codec spec iteration time message``, swapped
  atomically by the publish script, which also announces ``version`` on the ``notify`` channel.

Agents poll ``HGET meta version`` (one tiny round trip); only a new version costs a download, read
in ``chunk``-sized GETRANGE pieces so that hundreds of agents fetching a big blob at once do not
inflate Redis' client output buffers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np
import redis

from surreal_redis.codec import CodecError, ParamDict, decode_tree, encode_tree
from surreal_redis.keys import ParamKeys, RunKeys
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

CODEC = "srt1"  # the encode_tree format; "+lz4" is appended when leaves may be compressed
_DIGEST_ALGO = "sha256"  # fastest strong hash here (SHA-NI): ~2x blake2b on a 10 MB blob
MAX_BLOB_BYTES = 512 * 1024 * 1024  # Redis proto-max-bulk-len: the largest string a key can hold
DEFAULT_CHUNK_BYTES = 1 << 20  # 1 MiB reads keep Redis' client output buffers small (research §4)


class ParamFetchError(RuntimeError):
    """A parameter download that cannot be used: blob missing or expired, wrong size, digest
    mismatch, unknown codec or malformed metadata."""


@dataclass(frozen=True)
class ParamInfo:
    """What is known about one parameter version. ``version`` 0 means "nothing published yet";
    ``time`` is the publish time in unix seconds; ``nbytes`` is the encoded blob size."""

    version: int
    iteration: int
    time: float
    digest: str
    nbytes: int

    @classmethod
    def nothing(cls) -> ParamInfo:
        return cls(version=0, iteration=0, time=0.0, digest="", nbytes=0)


@dataclass(frozen=True)
class PublisherConfig:
    """Settings of :class:`ParameterPublisher`. Times in seconds, sizes in bytes.

    - ``min_publish_interval``: publishes closer together than this are skipped (``force``
      bypasses it), so a fast learner does not flood agents with versions.
    - ``compress_min_bytes``: lz4 leaves at least this big (None: never; float weights barely
      compress, so the default is off).
    - ``chunk_bytes``: read piece size recorded in meta for the clients (1 MiB keeps server
      output buffers small).
    - ``write_piece_bytes``: blobs above this are written as SET + APPENDs of this size.
    - ``grace_s``: how long a superseded blob stays readable for agents mid-download.
    - ``pending_ttl_s``: TTL of an uploaded but not yet published blob (a crashed learner leaks
      nothing); the publish script removes it.
    """

    min_publish_interval: float = 0.0
    compress_min_bytes: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    write_piece_bytes: int = 8 << 20
    grace_s: float = 60.0
    pending_ttl_s: float = 600.0

    def __post_init__(self) -> None:
        if self.min_publish_interval < 0:
            raise ValueError(f"min_publish_interval must be >= 0, got {self.min_publish_interval}")
        if self.compress_min_bytes is not None and self.compress_min_bytes < 0:
            raise ValueError(f"compress_min_bytes must be >= 0 or None, got {self.compress_min_bytes}")
        if self.chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be >= 1024, got {self.chunk_bytes}")
        if self.write_piece_bytes < 1024:
            raise ValueError(f"write_piece_bytes must be >= 1024, got {self.write_piece_bytes}")
        if self.grace_s <= 0 or self.pending_ttl_s <= 0:
            raise ValueError(f"grace_s and pending_ttl_s must be > 0, got {self.grace_s}, {self.pending_ttl_s}")


@dataclass(frozen=True)
class ParameterClientConfig:
    """Settings of :class:`ParameterClient`: ``max_in_flight`` GETRANGE chunks per pipelined round
    trip (bounds the server's output buffer per agent to about ``max_in_flight`` chunks);
    ``chunk_bytes`` overrides the chunk size the publisher recorded (None: use it, and 1 MiB for
    the first reads, which go out with the meta read before that size is known)."""

    max_in_flight: int = 4
    chunk_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.chunk_bytes is not None and self.chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be >= 1024 or None, got {self.chunk_bytes}")


def param_spec(params: ParamDict) -> dict[str, list]:
    """``{name: [dtype, shape]}`` of a parameter dict; raises ``TypeError`` naming a bad entry."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of name -> numpy array, got {type(params).__name__}")
    spec = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"parameter names must be non-empty strings, got {name!r}")
        if not isinstance(value, np.ndarray):
            raise TypeError(f"parameter {name!r} is a {type(value).__name__}, not a numpy array")
        spec[name] = [value.dtype.name, list(value.shape)]
    return spec


class ParameterPublisher:
    """Learner side: uploads the encoded parameters to its staging key, then ``lua/publish.lua``
    renames that to ``blob:<v+1>`` and swaps ``meta`` to it.

    Versions continue from whatever ``meta`` holds (a restarted learner resumes the sequence),
    and never fall below what this publisher already published (a Redis restarted empty).
    One publisher per run: a second one makes the script refuse with a version error.
    """

    def __init__(self, client: redis.Redis, run: str, config: PublisherConfig) -> None:
        self._client = client
        self._keys: ParamKeys = RunKeys(run).params
        self._config = config
        self._scripts = Scripts(client)
        self._staging = self._keys.staging(uuid.uuid4().hex)
        self._version: int | None = None  # read from meta on first use
        self._last_publish: float | None = None
        self._floor = 0

    @property
    def version(self) -> int:
        """The last published version (0 if none). Blocks for one HGET the first time."""
        if self._version is None:
            self._version = int(self._client.hget(self._keys.meta, "version") or 0)
        return self._version

    def continue_after(self, version: int) -> None:
        """Make the next version at least ``version + 1`` (a learner resumed from a checkpoint on a
        fresh Redis keeps counting where it left off)."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        self._floor = max(self._floor, int(version))

    def publish(self, params: ParamDict, iteration: int, message: str = "", force: bool = False) -> int | None:
        """Publish ``params`` (name -> array, any shapes) as the next version and return it.

        Returns None without touching Redis when the last publish was less than
        ``min_publish_interval`` seconds ago and ``force`` is false. Blocks for the blob upload
        (one round trip per ``write_piece_bytes``) and the script call. Raises ``TypeError`` /
        ``CodecError`` for unencodable params, ``ValueError`` for a bad ``iteration`` or
        ``message``, :class:`ScriptError` if the script refuses (another publisher moved the
        version; the next call re-reads it) and Redis errors unchanged.
        """
        now = time.monotonic()
        if (not force and self._last_publish is not None
                and now - self._last_publish < self._config.min_publish_interval):
            return None
        if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) or iteration < 0:
            raise ValueError(f"iteration must be an integer >= 0, got {iteration!r}")
        if not isinstance(message, str):
            raise ValueError(f"message must be a string, got {message!r}")
        spec = param_spec(params)
        blob = encode_tree(params, self._config.compress_min_bytes)
        if len(blob) > MAX_BLOB_BYTES:
            raise ValueError(f"encoded parameters are {len(blob)} bytes, above Redis' {MAX_BLOB_BYTES}-byte limit")
        digest = f"{_DIGEST_ALGO}:{hashlib.sha256(blob).hexdigest()}"
        codec = CODEC + ("+lz4" if self._config.compress_min_bytes is not None else "")
        try:
            self._upload(blob)
            for attempt in (1, 2):
                prev = self.version
                new = max(prev, self._floor) + 1
                try:
                    self._scripts.call(
                        "publish",
                        keys=[self._keys.meta, self._staging, self._keys.blob(new), self._keys.blob(prev)],
                        args=[new, prev, len(blob), self._config.chunk_bytes, digest, codec,
                              json.dumps(spec, separators=(",", ":")), int(iteration), repr(time.time()),
                              message, int(self._config.grace_s * 1000), self._keys.notify],
                    )
                    break
                except ScriptError:
                    # The script wrote nothing. Meta behind our own last version means a Redis that
                    # restarted empty: re-read and retry once (the staged blob is still there).
                    # Meta ahead of it means another publisher: refuse, as documented.
                    self._version = None
                    if attempt == 2 or self.version >= self._floor:
                        raise
        except redis.RedisError:
            self._version = None  # unsure what meta holds now: re-read it next time
            raise
        self._version = new
        self._floor = new  # a Redis that lost its meta (restart) must not take the versions back
        self._last_publish = now
        log.debug("published parameters v%d (%d bytes, iteration %d)", new, len(blob), iteration)
        return new

    def _upload(self, blob: bytes) -> None:
        piece = self._config.write_piece_bytes
        view = memoryview(blob)
        self._client.set(self._staging, view[:piece], px=int(self._config.pending_ttl_s * 1000))
        # APPENDs in pieces pace replication and bound the query buffer; APPEND keeps the TTL.
        for start in range(piece, len(blob), piece):
            self._client.append(self._staging, view[start:start + piece])


class ParameterClient:
    """Agent side: pulls the newest parameters when (and only when) their version changed.

    Not thread-safe; one per process. ``fetch`` never raises for Redis outages or bad blobs: it
    logs a warning and returns ``(None, info)``, and the caller keeps its current parameters.
    """

    def __init__(self, client: redis.Redis, run: str, config: ParameterClientConfig) -> None:
        self._client = client
        self._keys: ParamKeys = RunKeys(run).params
        self._config = config
        self._info = ParamInfo.nothing()
        self._failures = 0

    @property
    def info(self) -> ParamInfo:
        """What the last successful fetch loaded (version 0 before any)."""
        return self._info

    def fetch(self, force: bool = False) -> tuple[ParamDict | None, ParamInfo]:
        """Poll the published version; download, verify and decode it if it differs from the one
        loaded last (or always with ``force``).

        Returns ``(params, info)`` for a new version (the arrays are read-only views of the
        downloaded blob: copy before writing), ``(None, info)`` when nothing changed,
        nothing is published yet, or the download failed (warning logged); ``info`` always
        describes the parameters this client holds. Blocks for one round trip when nothing
        changed; for a download, one more for meta and the first ``max_in_flight`` chunks (read
        as one range), then one per ``max_in_flight`` further chunks.
        """
        try:
            raw = self._client.hget(self._keys.meta, "version")
            if raw is None or (not force and int(raw) == self._info.version):
                self._recovered()
                return None, self._info
            params, info = self._download(int(raw))
        except (redis.RedisError, ParamFetchError, CodecError, ValueError) as exc:
            self._failed(exc)
            return None, self._info
        self._recovered()
        self._info = info
        return params, info

    def fetch_info(self) -> ParamInfo:
        """The newest published version's info (version 0 if none). One HGETALL; Redis errors
        propagate, malformed metadata raises :class:`ParamFetchError`."""
        return _parse_meta(self._client.hgetall(self._keys.meta))[0]

    def _download(self, version: int) -> tuple[ParamDict, ParamInfo]:
        # The meta read carries the first max_in_flight chunks of the polled version as one range
        # (GETRANGE stops at the end), so a blob of up to that many chunks costs one round trip
        # and arrives in one piece: no copy to join pieces (the same reply bytes in flight).
        step = self._config.max_in_flight
        head_bytes = step * (self._config.chunk_bytes or DEFAULT_CHUNK_BYTES)
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(self._keys.meta)
        pipe.getrange(self._keys.blob(version), 0, head_bytes - 1)
        meta, head = pipe.execute()
        info, chunk, codec, spec = _parse_meta(meta)
        if info.version == 0:
            raise ParamFetchError("parameter metadata vanished between poll and download")
        if codec not in (CODEC, CODEC + "+lz4"):
            raise ParamFetchError(f"v{info.version}: unknown parameter codec {codec!r}")
        key = self._keys.blob(info.version)
        hasher = hashlib.sha256()  # each piece is hashed while it is still in the CPU cache
        parts: list[bytes] = []

        def take(part: bytes, start: int, size: int) -> None:
            if len(part) != max(0, min(size, info.nbytes - start)):
                raise ParamFetchError(
                    f"v{info.version}: blob {key} is missing, expired or not {info.nbytes} bytes"
                    f" (got {len(part)} bytes at offset {start})")
            if part:
                hasher.update(part)
                parts.append(part)

        if info.version == version:  # else a newer version was published since the poll: read it all
            take(head, 0, head_bytes)
        chunk = self._config.chunk_bytes or chunk
        starts = range(sum(map(len, parts)), info.nbytes, chunk)
        for first in range(0, len(starts), step):
            batch = starts[first:first + step]
            pipe = self._client.pipeline(transaction=False)
            for start in batch:
                pipe.getrange(key, start, min(start + chunk, info.nbytes) - 1)
            for start, part in zip(batch, pipe.execute()):
                take(part, start, chunk)
        buf = b"".join(parts) if len(parts) > 1 else parts[0]
        got = f"{_DIGEST_ALGO}:{hasher.hexdigest()}"
        if got != info.digest:
            raise ParamFetchError(f"v{info.version}: digest mismatch (meta {info.digest}, blob {got})")
        tree = decode_tree(buf, copy=False)  # read-only views: consumers copy into their own tensors
        if not isinstance(tree, dict):
            raise ParamFetchError(f"v{info.version}: blob holds a {type(tree).__name__}, not a parameter dict")
        params = {name: np.asarray(value) for name, value in tree.items()}
        if param_spec(params) != spec:
            raise ParamFetchError(f"v{info.version}: decoded parameters do not match the published spec")
        return params, info

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        # One warning per streak of failures: an outage must not flood the log every poll.
        if self._failures == 1:
            log.warning("parameter fetch failed, keeping v%d: %s", self._info.version, exc)
        else:
            log.debug("parameter fetch failed again (%d in a row): %s", self._failures, exc)

    def _recovered(self) -> None:
        if self._failures:
            log.info("parameter fetch works again after %d failed attempts", self._failures)
            self._failures = 0


def _parse_meta(meta: dict[bytes, bytes]) -> tuple[ParamInfo, int, str, dict]:
    """(info, chunk, codec, spec) from a raw meta hash; empty meta gives version 0."""
    if not meta:
        return ParamInfo.nothing(), 0, "", {}
    try:
        fields = {k.decode(): v.decode() for k, v in meta.items()}
        info = ParamInfo(version=int(fields["version"]), iteration=int(fields["iteration"]),
                         time=float(fields["time"]), digest=fields["digest"], nbytes=int(fields["nbytes"]))
        chunk, codec, spec = int(fields["chunk"]), fields["codec"], json.loads(fields["spec"])
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ParamFetchError(f"malformed parameter metadata {meta!r}: {exc!r}") from None
    if not (0 < info.nbytes <= MAX_BLOB_BYTES and chunk >= 1024 and isinstance(spec, dict)):
        raise ParamFetchError(f"implausible parameter metadata: nbytes {info.nbytes}, chunk {chunk}")
    return info, chunk, codec, spec

