"""Parameter broadcast: the learner publishes versioned blobs, agents pull only what changed.

Wire layout (key names from :class:`surreal_redis.keys.ParamKeys`):

- ``blob:<v>``: the parameters as :func:`surreal_redis.codec.encode_tree` bytes (pickle-free,
  optionally lz4 per leaf). The publisher uploads them to its own ``staging:<id>`` key (with a TTL,
  so a crash leaks nothing); ``lua/publish.lua`` renames that to ``blob:<v>``, and expires it a
  grace period after the next version replaces it. A published blob never changes.
- ``meta``: hash ``version nbytes piece digest codec spec iteration time message``, swapped
  atomically by the publish script, which also announces ``version`` on the ``notify`` channel.
  ``spec`` (JSON ``{name: [dtype, shape]}``) tells the shapes without a download, with the dtypes
  the learner holds: with ``hub.publisher.dtype: float16`` the blob carries float32 leaves as
  float16, ``codec`` ends in ``+float16``, and clients cast those leaves back to the spec's float32.

Agents poll ``HGET meta version`` (one tiny round trip); only a new version costs a download, read
in ``piece``-sized GETRANGE pieces so that hundreds of agents fetching a big blob at once do not
inflate Redis' client output buffers.

Every Redis step of a publish can be repeated without harm, so the publisher retries each one
itself (a few times, with capped backoff) after a connection error: the blob is written at explicit
offsets (SET, then SETRANGE), and the script answers a re-sent call whose version and digest are
already live with success (its first reply was lost). A digest guards each blob against
corruption; a client that rejects a blob keeps its parameters, counts the rejection and waits,
with capped backoff, before downloading that version again, and the learner can
:meth:`~ParameterPublisher.republish` above it.

Fan-out: a :class:`ParameterClient` may be given read replicas of the learner's Redis. It polls
and downloads there, and reads the primary instead whenever a replica cannot be trusted to be
current: its version is not above the one held (a lagging replica must neither take an agent back
nor hide a newer version the caller knows of), its blob is missing or corrupt, it is unreachable
(then replicas rest for a capped backoff), or ``primary_poll_every_s`` passed since the primary was
last asked (a replica whose replication link broke keeps serving its old version). The publish
script swaps ``meta`` and renames the blob in one atomic step, which replicas apply atomically
too, so a replica that shows version v normally also holds ``blob:<v>``; the digest catches the rest.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np
import redis
import xxhash

from surreal_redis.codec import CodecError, ParamDict, decode_tree, encode_tree
from surreal_redis.connection import (
    OUTAGE_ERRORS,
    Backoff,
    RedisClient,
    RedisSettings,
    as_text,
    connect,
    node_client,
)
from surreal_redis.keys import ParamKeys, RunKeys
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

CODEC = "srt1"  # the encode_tree format; "+lz4" is appended when leaves may be compressed
# The digest guards against corruption, not forgery: only the learner's Redis user can write
# parameter keys (acl.py). XXH3-128 hashes ~30 GB/s here against sha256's ~1 GB/s, which cost
# as much as the download of the blob itself.
DIGEST_ALGO = "xxh3_128"
MAX_BLOB_BYTES = 512 * 1024 * 1024  # Redis proto-max-bulk-len: the largest string a key can hold
DEFAULT_PIECE_BYTES = 1 << 20  # 1 MiB reads keep Redis' client output buffers small (research §4)
WIRE_DTYPES = ("float32", "float16")  # PublisherConfig.dtype: what float32 leaves travel as
# every codec a client can read: the encode_tree format, "+lz4" when leaves may be compressed,
# "+float16" when float32 leaves travel as float16 (older clients refuse it as unknown)
CODECS = frozenset(CODEC + lz4 + wire for lz4 in ("", "+lz4") for wire in ("", "+float16"))

T = TypeVar("T")


class ParamFetchError(RuntimeError):
    """A parameter download that cannot be used: blob missing or expired, wrong size, digest
    mismatch, unknown codec or malformed metadata."""


class PublishBackpressure(RuntimeError):
    """Redis refused the parameter upload for lack of memory (an OOM reply under ``noeviction``).

    Nothing was published and the staged bytes were deleted; the previous version stays live.
    Treat it like backpressure: keep training (which frees memory as experience is consumed and
    trimmed) and publish again later."""


def blob_digest(blob: bytes | memoryview) -> str:
    """``"xxh3_128:<hex>"`` of ``blob``, as recorded in ``meta``."""
    return f"{DIGEST_ALGO}:{xxhash.xxh3_128_hexdigest(blob)}"


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
    - ``read_piece_bytes``: size of the GETRANGE pieces clients read, recorded in meta (1 MiB
      keeps server output buffers small).
    - ``write_piece_bytes``: blobs above this are written as a SET and SETRANGEs of this size.
    - ``grace_s``: how long a superseded blob stays readable for agents mid-download.
    - ``pending_ttl_s``: TTL of an uploaded but not yet published blob (a crashed learner leaks
      nothing); the publish script removes it.
    - ``retries``: how often each Redis step of a publish is re-sent after a connection error
      (every step is idempotent), with backoff from ``retry_base_s`` doubling up to 1 s.
    - ``wait_replica_ms``: after each publish, block up to this many ms until one replica of the
      parameters' server has it (``WAIT 1``), so a failover right after a publish does not take
      the version back; 0: off (replication stays asynchronous; docs/deployment.md, Redis Cluster).
    - ``dtype``: what float32 leaves travel as, ``float32`` or ``float16`` (half the bytes per
      download; see :func:`to_wire`). Other dtypes (float64 normalizer statistics, integers) and
      float32 leaves with a finite value beyond float16's range (65504) travel unchanged. Clients
      cast the float16 leaves back to float32 on load, so agents and evals run inference in
      float32 with weights rounded to float16 (relative error <= 2**-11; docs/benchmarks.md, Scale,
      gives the logit differences measured). The learner's own weights and its checkpoints stay
      float32. On-policy consequence: an agent's recorded behaviour log-prob comes from the
      rounded weights, not the learner's, so PPO's ratio at the first epoch is not exactly 1 (it
      treats the rounding as a tiny policy lag) and APPO's V-trace importance weights correct for
      it like for any lag.
    """

    min_publish_interval: float = 0.0
    compress_min_bytes: int | None = None
    read_piece_bytes: int = DEFAULT_PIECE_BYTES
    write_piece_bytes: int = 8 << 20
    grace_s: float = 60.0
    pending_ttl_s: float = 600.0
    retries: int = 3
    retry_base_s: float = 0.05
    wait_replica_ms: int = 0
    # what float32 leaves travel as: float32 or float16 (half the bytes; agents cast back to
    # float32 on load and act in float32 with the rounded weights; the learner and its checkpoints
    # stay float32; on-policy, PPO's ratio sees the rounding, APPO's V-trace corrects for it)
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in WIRE_DTYPES:
            raise ValueError(f"publisher dtype must be one of {', '.join(WIRE_DTYPES)}, got {self.dtype!r}")
        if self.wait_replica_ms < 0:
            raise ValueError(f"wait_replica_ms must be >= 0, got {self.wait_replica_ms}")
        if self.min_publish_interval < 0:
            raise ValueError(f"min_publish_interval must be >= 0, got {self.min_publish_interval}")
        if self.compress_min_bytes is not None and self.compress_min_bytes < 0:
            raise ValueError(f"compress_min_bytes must be >= 0 or None, got {self.compress_min_bytes}")
        if self.read_piece_bytes < 1024:
            raise ValueError(f"read_piece_bytes must be >= 1024, got {self.read_piece_bytes}")
        if self.write_piece_bytes < 1024:
            raise ValueError(f"write_piece_bytes must be >= 1024, got {self.write_piece_bytes}")
        if self.grace_s <= 0 or self.pending_ttl_s <= 0:
            raise ValueError(f"grace_s and pending_ttl_s must be > 0, got {self.grace_s}, {self.pending_ttl_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not 0 < self.retry_base_s <= 1.0:
            raise ValueError(f"retry_base_s must be in (0, 1], got {self.retry_base_s}")


@dataclass(frozen=True)
class ParameterClientConfig:
    """Settings of :class:`ParameterClient`.

    - ``max_in_flight``: GETRANGE pieces per pipelined round trip (bounds the server's output
      buffer per agent to about ``max_in_flight`` pieces).
    - ``piece_bytes``: overrides the read piece size the publisher recorded (None: use it, and
      1 MiB for the first reads, which go out with the meta read before that size is known).
    - ``reject_backoff_s`` / ``reject_backoff_cap_s``: after a version failed verification
      (digest mismatch, wrong size, missing blob, undecodable), wait between this and twice this
      before downloading that same version again, doubling after each further failure up to the
      cap (seconds, jittered). A newer version is fetched at once.
    - ``primary_poll_every_s``: with read replicas, ask the primary for the version at least this
      often (seconds), so a replica whose replication stopped delays new parameters by at most
      this much. Ignored without replicas (every poll goes to the primary then).
    - ``replica_backoff_s`` / ``replica_backoff_cap_s``: after a replica failed (unreachable or
      erroring), read from the primary for between this and twice this before trying a replica
      again, doubling per further failure up to the cap (seconds, jittered).
    - ``min_version_lag``: a poll downloads only a version at least this many versions above
      the one held (or any, while none is held); 1: every newer version. 2 halves the bytes
      agents download and leaves them up to 2 publishes behind (plus the poll period). A version
      the caller asks for (``fetch(at_least=...)``: agents producing on grants load the version
      a claim names) is downloaded whatever the lag, so the lag only acts on free production.
      There, on-policy runs drop chunks more than ``replay.fifo.max_policy_lag`` versions old:
      set that to at least this lag.
    """

    max_in_flight: int = 4
    piece_bytes: int | None = None
    reject_backoff_s: float = 1.0
    reject_backoff_cap_s: float = 60.0
    primary_poll_every_s: float = 5.0
    replica_backoff_s: float = 1.0
    replica_backoff_cap_s: float = 30.0
    # a poll downloads only a version at least this many above the one held (1: every newer
    # one); versions a claim names (learner.on_policy_sync) are downloaded whatever the lag. With
    # free production on-policy, set replay.fifo.max_policy_lag to at least this
    min_version_lag: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.min_version_lag, bool) or not isinstance(self.min_version_lag, int) \
                or self.min_version_lag < 1:
            raise ValueError(f"min_version_lag must be an integer >= 1, got {self.min_version_lag!r}")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.piece_bytes is not None and self.piece_bytes < 1024:
            raise ValueError(f"piece_bytes must be >= 1024 or None, got {self.piece_bytes}")
        if not 0 < self.reject_backoff_s <= self.reject_backoff_cap_s:
            raise ValueError(f"need 0 < reject_backoff_s <= reject_backoff_cap_s, got "
                             f"{self.reject_backoff_s}, {self.reject_backoff_cap_s}")
        if self.primary_poll_every_s <= 0:
            raise ValueError(f"primary_poll_every_s must be > 0, got {self.primary_poll_every_s}")
        if not 0 < self.replica_backoff_s <= self.replica_backoff_cap_s:
            raise ValueError(f"need 0 < replica_backoff_s <= replica_backoff_cap_s, got "
                             f"{self.replica_backoff_s}, {self.replica_backoff_cap_s}")


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


def to_wire(params: ParamDict, dtype: str) -> ParamDict:
    """``params`` as a publisher with ``PublisherConfig.dtype`` ``dtype`` sends them: every
    float32 leaf cast to ``dtype``, except one holding a finite value that ``dtype`` cannot
    represent (beyond float16's 65504: it would arrive as inf), which stays float32 like every
    other dtype. New arrays for the cast leaves, the same objects for the others; ``params`` is
    not changed. Raises ``ValueError`` naming a bad ``dtype``."""
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return dict(params)
    wire: ParamDict = {}
    for name, value in params.items():
        if value.dtype == np.float32:
            with np.errstate(over="ignore"):  # an overflow is seen below and kept float32
                cast = value.astype(dtype)
            if np.array_equal(np.isinf(cast), np.isinf(value)):
                wire[name] = cast
                continue
            log.debug("parameter %r has values beyond %s's range: sent as float32", name, dtype)
        wire[name] = value
    return wire


def from_wire(tree: ParamDict, spec: dict[str, list]) -> ParamDict:
    """The parameters a client returns for a ``+float16`` blob: each leaf that ``spec`` (meta's
    ``{name: [dtype, shape]}``) lists as float32 and that arrived as float16 cast back to float32
    (a new array); leaves already of their spec's dtype unchanged. Raises :class:`ParamFetchError`
    for a leaf missing from ``spec`` or of another dtype than the spec's and not float16 for float32."""
    out: ParamDict = {}
    for name, value in tree.items():
        want = spec.get(name)
        if not isinstance(want, list) or not want:
            raise ParamFetchError(f"parameter {name!r} is not in the published spec")
        if value.dtype.name == want[0]:
            out[name] = value
        elif want[0] == "float32" and value.dtype == np.float16:
            out[name] = value.astype(np.float32)
        else:
            raise ParamFetchError(f"parameter {name!r} arrived as {value.dtype.name}, the spec says {want[0]}")
    return out


class ParameterPublisher:
    """Learner side: uploads the encoded parameters to its staging key, then ``lua/publish.lua``
    renames that to ``blob:<v+1>`` and swaps ``meta`` to it.

    Versions continue from whatever ``meta`` holds (a restarted learner resumes the sequence),
    and never fall below what this publisher already published (a Redis restarted empty).
    One publisher per run: a second one makes the script refuse with a version error.
    """

    def __init__(self, client: RedisClient, run: str, config: PublisherConfig) -> None:
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
            self._version = int(self._retrying(lambda: self._client.hget(self._keys.meta, "version")) or 0)
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
        (one round trip per ``write_piece_bytes``) and the script call, plus up to ``retries``
        backoff sleeps (well under a few seconds) per step that hits a connection error.

        Raises ``TypeError`` / ``CodecError`` for unencodable params, ``ValueError`` for a bad
        ``iteration`` or ``message``, :class:`PublishBackpressure` when Redis is out of memory,
        :class:`ScriptError` if the script refuses (another publisher moved the version; the
        next call re-reads it) and other Redis errors (connection errors once the retries are
        spent) unchanged.
        """
        if (not force and self._last_publish is not None
                and time.monotonic() - self._last_publish < self._config.min_publish_interval):
            return None
        return self._publish(params, iteration, message)

    def republish(self, params: ParamDict, iteration: int, above: int = 0, message: str = "republish") -> int:
        """Publish ``params`` as a version above every one seen: the version in ``meta`` (even one
        another writer put there), this publisher's own last one and ``above`` (say, the highest
        version agents report). For when the live blob is unusable (agents keep rejecting it) or
        ``meta`` moved behind this publisher's back. Ignores ``min_publish_interval``; blocks
        and raises like :meth:`publish`.
        """
        if isinstance(above, bool) or not isinstance(above, (int, np.integer)) or above < 0:
            raise ValueError(f"above must be an integer >= 0, got {above!r}")
        self._version = None
        seen = max(self._floor, self.version, int(above))
        self._floor = seen
        version = self._publish(params, iteration, message)
        log.info("republished parameters as v%d (above v%d)", version, seen)
        return version

    def _publish(self, params: ParamDict, iteration: int, message: str) -> int:
        now = time.monotonic()
        if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) or iteration < 0:
            raise ValueError(f"iteration must be an integer >= 0, got {iteration!r}")
        if not isinstance(message, str):
            raise ValueError(f"message must be a string, got {message!r}")
        spec = json.dumps(param_spec(params), separators=(",", ":"))  # the dtypes clients load
        blob = encode_tree(to_wire(params, self._config.dtype), self._config.compress_min_bytes)
        if len(blob) > MAX_BLOB_BYTES:
            raise ValueError(f"encoded parameters are {len(blob)} bytes, above Redis' {MAX_BLOB_BYTES}-byte limit")
        codec = CODEC + ("+lz4" if self._config.compress_min_bytes is not None else "")
        if self._config.dtype != "float32":
            codec += "+" + self._config.dtype
        fields = [blob_digest(blob), codec, spec, int(iteration), repr(time.time()), message]
        try:
            self._upload(blob)
            new = self._swap_in(blob, fields)
        except redis.exceptions.OutOfMemoryError as exc:
            self._version = None
            self._discard_staging()
            raise PublishBackpressure(f"Redis is out of memory; parameters not published: {exc}") from exc
        except redis.RedisError:
            self._version = None  # unsure what meta holds now: re-read it next time
            raise
        self._version = new
        self._floor = new  # a Redis that lost its meta (restart) must not take the versions back
        self._last_publish = now
        log.debug("published parameters v%d (%d bytes, iteration %d)", new, len(blob), iteration)
        return new

    def _upload(self, blob: bytes) -> None:
        """SET the first piece (with the leak-guard TTL), then SETRANGE the others at their
        offsets: a re-sent piece lands where it belongs (an APPEND would duplicate it), and
        SETRANGE keeps the TTL, whose presence the script checks."""
        piece = self._config.write_piece_bytes
        view = memoryview(blob)
        ttl_ms = int(self._config.pending_ttl_s * 1000)
        self._retrying(lambda: self._client.set(self._staging, view[:piece], px=ttl_ms))
        for start in range(piece, len(blob), piece):
            self._retrying(partial(self._client.setrange, self._staging, start, view[start:start + piece]))

    def _swap_in(self, blob: bytes, fields: list) -> int:
        """Run the publish script until it takes the staged blob (at most 3 tries); the new version."""
        tries_left = 3
        while True:
            prev = self.version
            new = max(prev, self._floor) + 1
            keys = [self._keys.meta, self._staging, self._keys.blob(new), self._keys.blob(prev)]
            args = [new, prev, len(blob), self._config.read_piece_bytes, *fields,
                    int(self._config.grace_s * 1000), self._keys.notify]
            try:
                self._retrying(partial(self._scripts.call, "publish", keys=keys, args=args))
                if self._config.wait_replica_ms:
                    self._wait_for_replica(new)
                return new
            except ScriptError as exc:
                # The script wrote nothing. A lost staging key means Redis restarted mid-publish:
                # upload again. Meta behind our own last version means a Redis that restarted
                # empty: re-read it and go on. Meta ahead of it means another publisher: refuse.
                tries_left -= 1
                if tries_left == 0:
                    raise
                if "STAGING" in str(exc):
                    self._upload(blob)
                    continue
                self._version = None
                if self.version >= self._floor:
                    raise

    def _wait_for_replica(self, version: int) -> None:
        """WAIT 1 on the server holding ``meta``; a replica that does not answer in time is logged
        (the version stays published)."""
        node = node_client(self._client, self._keys.meta)
        acked = node.execute_command("WAIT", 1, self._config.wait_replica_ms)
        if int(acked) < 1:
            log.warning("v%d: no replica acknowledged the publish within %d ms", version,
                        self._config.wait_replica_ms)

    def _discard_staging(self) -> None:
        try:
            self._client.delete(self._staging)  # DEL frees memory and is allowed under OOM
        except redis.RedisError as exc:
            log.warning("could not delete the staged parameter blob (its TTL will): %s", exc)

    def _retrying(self, step: Callable[[], T]) -> T:
        """``step()``, re-sent up to ``retries`` times after connection errors (it must be
        idempotent); blocks for the backoff sleeps; the last error propagates."""
        backoff = Backoff(self._config.retry_base_s, 1.0)
        while True:
            try:
                return step()
            except OUTAGE_ERRORS as exc:
                if backoff.failures >= self._config.retries:
                    raise
                delay = backoff.next_delay()
                log.warning("parameter publish: Redis unavailable (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)


def connect_replicas(urls: Sequence[str], settings: RedisSettings) -> list[RedisClient]:
    """Clients of parameter read replicas (``redis.param_read_urls``) for :class:`ParameterClient`,
    one per URL, built like :func:`~surreal_redis.connection.connect` (which connects on first use:
    an unreachable replica costs nothing here). Raises ``ValueError`` naming a bad URL."""
    return [connect(url, settings) for url in urls]


class ParameterClient:
    """Agent side: pulls the newest parameters when (and only when) their version changed.

    Not thread-safe; one per process. ``fetch`` never raises for Redis outages or bad blobs: it
    logs a warning and returns ``(None, info)``, and the caller keeps its current parameters.
    A version that failed verification is counted in :attr:`rejections` and downloaded again only
    after a capped backoff (``reject_backoff_s`` doubling to ``reject_backoff_cap_s``).

    ``replicas``: clients of read replicas of ``client``'s server (which the learner publishes
    to). Polls and downloads then go to one of them (picked at random; the next one after a
    failure) and fall back to ``client`` as the module docstring describes; a version read from a
    replica is loaded only if it is above the one held. The caller owns (and closes) all clients.
    """

    def __init__(self, client: RedisClient, run: str, config: ParameterClientConfig,
                 replicas: Sequence[RedisClient] = ()) -> None:
        self._client = client
        self._keys: ParamKeys = RunKeys(run).params
        self._config = config
        self._info = ParamInfo.nothing()
        self._failures = 0
        self._rejections = 0
        self._rejected_version = 0  # the version whose download failed last, 0 if none
        self._retry_at = 0.0  # time.monotonic() after which that version may be downloaded again
        self._reject_backoff = Backoff(config.reject_backoff_s, config.reject_backoff_cap_s)
        self._replicas = list(replicas)
        self._replica = random.randrange(len(self._replicas)) if self._replicas else 0
        self._replica_backoff = Backoff(config.replica_backoff_s, config.replica_backoff_cap_s)
        self._replica_retry_at = 0.0  # time.monotonic() before which replicas are not asked
        self._primary_due = time.monotonic() + config.primary_poll_every_s
        self.replica_downloads = 0
        """Versions loaded from a replica."""
        self.primary_downloads = 0
        """Versions loaded from the primary (every one without replicas)."""
        self.replica_fallbacks = 0
        """Downloads a replica could not serve (blob missing or bad, older meta, error) that went
        to the primary instead."""

    @property
    def info(self) -> ParamInfo:
        """What the last successful fetch loaded (version 0 before any)."""
        return self._info

    @property
    def rejections(self) -> int:
        """Downloads rejected so far (digest or size mismatch, missing blob, malformed meta,
        undecodable contents), counted once per attempt; Redis outages do not count. A rising
        count while the published version stays the same means the live blob is unusable."""
        return self._rejections

    def fetch(self, force: bool = False, at_least: int = 0) -> tuple[ParamDict | None, ParamInfo]:
        """Poll the published version; download, verify and decode it if it differs from the one
        loaded last (or always with ``force``, which also skips a rejection's backoff and reads
        from the primary). ``at_least``: a version the caller knows is live (a claim told it): a
        replica that shows less is lagging, so the primary is asked instead; without replicas, an
        ``at_least`` above the version held is downloaded without polling first.
        ``min_version_lag`` (config) > 1: a polled version less than that many above the one held
        is not downloaded (``(None, info)``); an ``at_least`` above the one held, ``force`` and a
        client holding nothing yet download whatever the lag.

        Returns ``(params, info)`` for a new version (the arrays are read-only views of the
        downloaded blob, or float32 copies of its float16 leaves: copy before writing; of the
        dtypes meta's ``spec`` lists), ``(None, info)`` when nothing changed or not enough
        (``min_version_lag``), nothing is published yet, the version was rejected less than its backoff ago, or the
        download failed (warning logged); ``info`` always describes the parameters this client
        holds. Blocks for one round trip when nothing changed (two when a replica lags, none for
        a known ``at_least``); for a download, one more for meta and the first ``max_in_flight``
        pieces (read as one range),
        then one per ``max_in_flight`` further pieces, all again on the primary if the replica
        could not serve them.
        """
        version = 0  # unknown until the poll parsed
        try:
            source, version = self._poll(force, at_least)
            if version == 0:
                self._recovered()
                return None, self._info
            if not force and version == self._info.version:
                self._recovered()
                return None, self._info
            held = self._info.version
            if (not force and held > 0 and at_least <= held
                    and held < version < held + self._config.min_version_lag):
                self._recovered()  # newer, but fewer than min_version_lag versions newer: not yet
                return None, self._info
            if not force and version == self._rejected_version and time.monotonic() < self._retry_at:
                return None, self._info
            if not force and version < self._info.version:
                # Versions never go back: a learner that started over on an emptied Redis publishes
                # from v1 again. Refused and counted like a damaged blob, so that learner sees the
                # rejections in the heartbeats and republishes above every version agents hold.
                raise ParamFetchError(f"published version {version} is below the held v{self._info.version}")
            params, info = self._download_from(source, version)
            if not force and info.version < self._info.version:  # meta went back after the poll
                raise ParamFetchError(f"published version {info.version} is below the held v{self._info.version}")
        except redis.RedisError as exc:
            self._failed(exc)
            return None, self._info
        except (ParamFetchError, CodecError, ValueError) as exc:
            self._rejected(version, exc)
            return None, self._info
        self._recovered()
        self._info = info
        return params, info

    def fetch_info(self) -> ParamInfo:
        """The newest published version's info (version 0 if none), read on the primary. One
        HGETALL; Redis errors propagate, malformed metadata raises :class:`ParamFetchError`."""
        return _parse_meta(self._client.hgetall(self._keys.meta))[0]

    def _poll(self, force: bool, at_least: int) -> tuple[RedisClient, int]:
        """(the server to download from, the version published there; 0: none). A replica's
        answer counts only when it is at least the version held, at least ``at_least`` and not 0;
        else (or when the primary is due, or ``force``) the primary is asked. A new version that
        only the periodic primary poll found is still downloaded from a replica, which must hold
        at least that version (else :meth:`_download_from` reads the primary): the check on the
        replicas must not send one download in every ``primary_poll_every_s`` of every agent to
        the primary (at 1024 agents, a tenth of the parameter bytes)."""
        if not self._replicas and not force and at_least > self._info.version:
            return self._client, at_least  # the download reads meta anyway: no poll needed
        now = time.monotonic()
        replica_usable = bool(self._replicas) and not force and now >= self._replica_retry_at
        if replica_usable and now < self._primary_due:
            replica = self._replicas[self._replica]
            try:
                raw = replica.hget(self._keys.meta, "version")
                version = 0 if raw is None else _parse_version(raw)
            except (redis.RedisError, ParamFetchError) as exc:
                self._replica_failed(exc)
            else:
                self._replica_backoff.reset()
                if version >= max(self._info.version, at_least, 1):
                    return replica, version
            replica_usable = False  # it failed or lags: the primary serves this one
        self._primary_due = now + self._config.primary_poll_every_s
        raw = self._client.hget(self._keys.meta, "version")
        version = 0 if raw is None else _parse_version(raw)
        if replica_usable and version > self._info.version:
            return self._replicas[self._replica], version
        return self._client, version

    def _download_from(self, source: RedisClient, version: int) -> tuple[ParamDict, ParamInfo]:
        """Download ``version`` (or a newer one published since) from ``source``; from a replica,
        only a version at least ``version``, else the primary's."""
        if source is not self._client:
            try:
                result = self._download(source, version, floor=version)
            except redis.RedisError as exc:
                self._replica_failed(exc)
            except (ParamFetchError, CodecError, ValueError) as exc:
                log.info("parameter v%d unusable on a replica (%s); reading the primary", version, exc)
            else:
                self.replica_downloads += 1
                return result
            self.replica_fallbacks += 1
        result = self._download(self._client, version)
        self.primary_downloads += 1
        return result

    def _replica_failed(self, exc: Exception) -> None:
        """Rest the replicas for a backoff delay and try the next one after it."""
        delay = self._replica_backoff.next_delay()
        self._replica_retry_at = time.monotonic() + delay
        failing = self._replica
        self._replica = (self._replica + 1) % len(self._replicas)
        log.warning("parameter replica %d failed (%s); reading the primary for %.1fs", failing, exc, delay)

    def _download(self, source: RedisClient, version: int, floor: int = 0) -> tuple[ParamDict, ParamInfo]:
        """Read, verify and decode the version ``source``'s meta names (polled: ``version``);
        raises :class:`ParamFetchError` if that is below ``floor``."""
        # The meta read carries the first max_in_flight pieces of the polled version as one range
        # (GETRANGE stops at the end), so a blob of up to that many pieces costs one round trip
        # and arrives in one piece: no copy to join pieces (the same reply bytes in flight).
        step = self._config.max_in_flight
        head_bytes = step * (self._config.piece_bytes or DEFAULT_PIECE_BYTES)
        pipe = source.pipeline(transaction=False)
        pipe.hgetall(self._keys.meta)
        pipe.getrange(self._keys.blob(version), 0, head_bytes - 1)
        meta, head = pipe.execute()
        info, piece, codec, spec = _parse_meta(meta)
        if info.version == 0:
            raise ParamFetchError("parameter metadata vanished between poll and download")
        if info.version < floor:
            raise ParamFetchError(f"meta went back from v{version} to v{info.version} after the poll")
        if codec not in CODECS:
            raise ParamFetchError(f"v{info.version}: unknown parameter codec {codec!r}")
        if not info.digest.startswith(f"{DIGEST_ALGO}:"):
            raise ParamFetchError(f"v{info.version}: unknown digest {info.digest!r} (expected {DIGEST_ALGO})")
        key = self._keys.blob(info.version)
        hasher = xxhash.xxh3_128()  # each piece is hashed while it is still in the CPU cache
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
        piece = self._config.piece_bytes or piece
        starts = range(sum(map(len, parts)), info.nbytes, piece)
        for first in range(0, len(starts), step):
            batch = starts[first:first + step]
            pipe = source.pipeline(transaction=False)
            for start in batch:
                pipe.getrange(key, start, min(start + piece, info.nbytes) - 1)
            for start, part in zip(batch, pipe.execute()):
                take(part, start, piece)
        got = f"{DIGEST_ALGO}:{hasher.hexdigest()}"
        if got != info.digest:
            raise ParamFetchError(f"v{info.version}: digest mismatch (meta {info.digest}, blob {got})")
        # The blob is byte for byte what the publisher encoded, so the contents match meta's spec
        # (written by the same script call from the same parameters) without a second check.
        buf = b"".join(parts) if len(parts) > 1 else parts[0]
        tree = decode_tree(buf, copy=False)  # read-only views: consumers copy into their own tensors
        if not isinstance(tree, dict):
            raise ParamFetchError(f"v{info.version}: blob holds a {type(tree).__name__}, not a parameter dict")
        params = {name: np.asarray(value) for name, value in tree.items()}
        if codec.endswith("+float16"):  # float32 leaves travelled as float16: float32 again
            try:
                listed = json.loads(spec)
            except ValueError:
                listed = None
            if not isinstance(listed, dict):
                raise ParamFetchError(f"v{info.version}: malformed parameter spec {spec[:80]!r}")
            params = from_wire(params, listed)
        return params, info

    def _rejected(self, version: int, exc: Exception) -> None:
        self._rejections += 1
        if version != self._rejected_version:
            self._rejected_version = version
            self._reject_backoff.reset()
        delay = self._reject_backoff.next_delay()
        self._retry_at = time.monotonic() + delay
        log.warning("parameter v%d rejected (%d rejections so far), keeping v%d; next try in %.1fs: %s",
                    version, self._rejections, self._info.version, delay, exc)

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


def _parse_version(raw: bytes | str) -> int:
    try:
        version = int(raw)
    except ValueError:
        version = -1
    if version < 1:
        raise ParamFetchError(f"malformed published parameter version {raw!r}")
    return version


def _parse_meta(meta: dict[bytes | str, bytes | str]) -> tuple[ParamInfo, int, str, str]:
    """(info, read piece size, codec, spec JSON text) from a raw meta hash; empty meta gives
    version 0."""
    if not meta:
        return ParamInfo.nothing(), 0, "", ""
    try:
        fields = {as_text(k): as_text(v) for k, v in meta.items()}
        info = ParamInfo(version=int(fields["version"]), iteration=int(fields["iteration"]),
                         time=float(fields["time"]), digest=fields["digest"], nbytes=int(fields["nbytes"]))
        piece, codec, spec = int(fields["piece"]), fields["codec"], fields.get("spec", "")
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ParamFetchError(f"malformed parameter metadata {meta!r}: {exc!r}") from None
    if not (0 < info.nbytes <= MAX_BLOB_BYTES and piece >= 1024):
        raise ParamFetchError(f"implausible parameter metadata: nbytes {info.nbytes}, piece {piece}")
    return info, piece, codec, spec
