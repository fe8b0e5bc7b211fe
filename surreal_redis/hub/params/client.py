"""Agent side of the parameter broadcast: :class:`ParameterClient` polls ``HGET meta version``
(one tiny round trip); only a new version costs a download, read in ``piece``-sized GETRANGE pieces
so that hundreds of agents fetching a big blob at once do not inflate Redis' client output
buffers. A client that rejects a blob (digest, size, codec) keeps its parameters, counts the
rejection and waits, with capped backoff, before downloading that version again.

Read replicas and when the primary is read instead: docs/deployment.md (Parameter fan-out). The
publish script swaps ``meta`` and renames the blob in one atomic step, which replicas apply
atomically too, so a replica that shows version v normally also holds ``blob:<v>``; the digest
catches the rest.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import xxhash

from surreal_redis.codec import CodecError, ParamDict
from surreal_redis.connection import Backoff, RedisClient, RedisSettings, connect
from surreal_redis.hub.params.wire import (
    CODECS,
    DEFAULT_PIECE_BYTES,
    DIGEST_ALGO,
    ParamFetchError,
    ParamInfo,
    decode_params,
    parse_meta,
)
from surreal_redis.keys import ParamKeys, RunKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParameterClientConfig:
    """Settings of :class:`ParameterClient`."""

    max_in_flight: int = 4
    """GETRANGE pieces per pipelined round trip (bounds the server's output buffer per agent to
    about that many pieces)."""
    piece_bytes: int | None = None
    """Overrides the read piece size the publisher recorded (None: use it, and 1 MiB for the first
    reads, which go out with the meta read)."""
    reject_backoff_s: float = 1.0
    """After a version failed verification, wait between this and twice this before downloading it
    again, doubling per further failure up to ``reject_backoff_cap_s`` (seconds, jittered). A newer
    version is fetched at once."""
    reject_backoff_cap_s: float = 60.0
    primary_poll_every_s: float = 5.0
    """With read replicas, ask the primary for the version at least this often (seconds), so a
    replica whose replication stopped delays new parameters at most this."""
    replica_backoff_s: float = 1.0
    """After a replica failed, read from the primary for a backoff like the rejection's (up to
    ``replica_backoff_cap_s``) before trying a replica again."""
    replica_backoff_cap_s: float = 30.0
    min_version_lag: int = 1
    """A poll downloads only a version at least this many above the one held (1: every newer one;
    2 halves the bytes agents download); versions a claim names (``learner.on_policy_sync``) are
    downloaded whatever the lag. With free production on-policy, set ``replay.fifo.max_policy_lag``
    to at least this."""

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


def connect_replicas(urls: Sequence[str], settings: RedisSettings) -> list[RedisClient]:
    """Clients of parameter read replicas (``redis.param_read_urls``), one per URL, built by
    :func:`~surreal_redis.connection.connect` (lazily). Raises ``ValueError`` naming a bad URL."""
    return [connect(url, settings) for url in urls]


class ParameterClient:
    """Agent side: pulls the newest parameters when (and only when) their version changed.

    Not thread-safe; one per process. ``fetch`` never raises for Redis outages or bad blobs: it
    logs a warning and returns ``(None, info)``, and the caller keeps its current parameters.

    ``replicas``: clients of read replicas of ``client``'s server. Polls and downloads go to one
    of them (picked at random; the next one after a failure) and fall back to ``client``. The
    caller owns (and closes) all clients.
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
        undecodable contents), once per attempt; Redis outages do not count."""
        return self._rejections

    def fetch(self, force: bool = False, at_least: int = 0) -> tuple[ParamDict | None, ParamInfo]:
        """Poll the published version; download, verify and decode it if it differs from the one
        loaded last (or always with ``force``, which also skips a rejection's backoff and reads
        from the primary). ``at_least``: a version the caller knows is live (a claim told it): a
        replica that shows less is lagging, so the primary is asked instead; without replicas, an
        ``at_least`` above the version held is downloaded without polling first. It, ``force`` and
        a client holding nothing yet download whatever ``min_version_lag``.

        Returns ``(params, info)`` for a new version (read-only views of the downloaded blob, or
        float32 copies of its float16 leaves: copy before writing; of the dtypes meta's ``spec``
        lists), ``(None, info)`` when nothing changed or not enough (``min_version_lag``), nothing
        is published yet, the version was rejected less than its backoff ago, or the download
        failed (warning logged); ``info`` always describes the parameters this client holds.
        Blocks for one round trip when nothing changed (two when a replica lags, none for a known
        ``at_least``); for a download, one more for meta and the first ``max_in_flight`` pieces,
        then one per ``max_in_flight`` further pieces, all again on the primary if the replica
        could not serve them.
        """
        version = 0
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
        return parse_meta(self._client.hgetall(self._keys.meta))[0]

    def _poll(self, force: bool, at_least: int) -> tuple[RedisClient, int]:
        """(the server to download from, the version published there; 0: none). A replica's
        answer counts only when it is at least the version held, at least ``at_least`` and not 0;
        else (or when the primary is due, or ``force``) the primary is asked. A new version found
        by the periodic primary poll is still downloaded from a replica (:meth:`_download_from`
        falls back), so that check sends no share of the downloads to the primary."""
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
        # The meta read carries the first max_in_flight pieces of the polled version as one range,
        # so a blob of up to that many pieces costs one round trip and needs no join.
        step = self._config.max_in_flight
        head_bytes = step * (self._config.piece_bytes or DEFAULT_PIECE_BYTES)
        pipe = source.pipeline(transaction=False)
        pipe.hgetall(self._keys.meta)
        pipe.getrange(self._keys.blob(version), 0, head_bytes - 1)
        meta, head = pipe.execute()
        info, piece, codec, spec = parse_meta(meta)
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
        buf = b"".join(parts) if len(parts) > 1 else parts[0]
        return decode_params(buf, info, codec, spec), info

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
