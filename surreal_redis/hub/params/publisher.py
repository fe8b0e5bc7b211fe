"""Learner side of the parameter broadcast: :class:`ParameterPublisher` uploads the blob to its own
``staging:<id>`` key (with a TTL, so a crash leaks nothing); ``lua/publish.lua`` renames that to
``blob:<v>``, swaps ``meta`` to it atomically, expires the replaced blob a grace period later and
announces ``version`` on the ``notify`` channel.

Every Redis step of a publish can be repeated without harm, so the publisher retries each one
itself after a connection error: the blob is written at explicit offsets (SET, then SETRANGE),
and the script answers a re-sent call whose version and digest are already live with success.
A blob of one piece on one server goes up with the script's first call in one MULTI/EXEC round
trip (a refusal while queueing, say out of memory, runs neither).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np
import redis
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry

from surreal_redis.codec import ParamDict, encode_tree
from surreal_redis.connection import RedisClient
from surreal_redis.hub.params.wire import (
    CODEC,
    DEFAULT_PIECE_BYTES,
    MAX_BLOB_BYTES,
    WIRE_DTYPES,
    blob_digest,
    param_spec,
    to_wire,
)
from surreal_redis.keys import ParamKeys, RunKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.redis_cluster import is_cluster, node_client
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

T = TypeVar("T")


class PublishBackpressure(RuntimeError):
    """Redis refused the parameter upload for lack of memory (OOM under ``noeviction``); nothing
    was published and the staged bytes were deleted. Keep training (which frees memory as
    experience is consumed) and publish again later."""


@dataclass(frozen=True)
class PublisherConfig:
    """Settings of :class:`ParameterPublisher`. Times in seconds, sizes in bytes."""

    min_publish_interval: float = 0.0
    """Publishes closer together than this are skipped (``force`` bypasses it), so a fast learner
    does not flood agents with versions."""
    compress_min_bytes: int | None = None
    """lz4 leaves at least this big (None: never; float weights barely compress)."""
    read_piece_bytes: int = DEFAULT_PIECE_BYTES
    """Size of the GETRANGE pieces clients read, recorded in meta (1 MiB keeps server output
    buffers small)."""
    write_piece_bytes: int = 8 << 20
    """Blobs above this are written as a SET and SETRANGEs of this size."""
    grace_s: float = 60.0
    """How long a superseded blob stays readable for agents mid-download."""
    pending_ttl_s: float = 600.0
    """TTL of an uploaded but not yet published blob (a crashed learner leaks nothing)."""
    retries: int = 3
    """How often each Redis step of a publish is re-sent after a connection error (every step is
    idempotent), with backoff from ``retry_base_s`` doubling up to 1 s."""
    retry_base_s: float = 0.05
    wait_replica_ms: int = 0
    """After each publish, block up to this many ms until one replica of the parameters' server has
    it (``WAIT 1``), so a failover right after a publish does not take the version back; 0: off
    (replication stays asynchronous)."""
    dtype: str = "float32"
    """What float32 leaves travel as: float32 or float16 (half the bytes, relative error <= 2**-11;
    agents cast back to float32 on load; the learner and its checkpoints stay float32; on-policy,
    PPO's ratio sees the rounding, APPO's V-trace corrects for it)."""

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


class ParameterPublisher:
    """Learner side (module docstring). Versions continue from whatever ``meta`` holds (a
    restarted learner resumes the sequence), and never fall below what this publisher already
    published (a Redis restarted empty). One publisher per run: a second one makes the script
    refuse with a version error.
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
        # OUTAGE_ERRORS only: others propagate at once
        self._retry = Retry(EqualJitterBackoff(cap=1.0, base=config.retry_base_s), config.retries,
                            OUTAGE_ERRORS)

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

    def publish(self, params: ParamDict, iteration: int, message: str = "", force: bool = False,
                carry_grant: bool = False, grant: int | None = None) -> int | None:
        """Publish ``params`` (name -> array, any shapes) as the next version and return it. With
        ``carry_grant``, the same script moves what agents left unclaimed of the previous version's
        production grant (:mod:`surreal_redis.hub.quota`) to the new version, or with ``grant``
        grants the new version that many env steps instead, and announces it.

        Returns None without touching Redis when the last publish was less than
        ``min_publish_interval`` seconds ago and ``force`` is false. Blocks for the blob upload
        (one round trip per ``write_piece_bytes``) and the script call, plus up to ``retries``
        backoff sleeps per step that hits a connection error.

        Raises ``TypeError`` / ``CodecError`` for unencodable params, ``ValueError`` for a bad
        ``iteration``, ``message`` or ``grant`` (>= 0, only with ``carry_grant``), :class:`PublishBackpressure` when Redis is out of memory,
        :class:`ScriptError` if another publisher moved the version, other Redis errors unchanged.
        """
        if (not force and self._last_publish is not None
                and time.monotonic() - self._last_publish < self._config.min_publish_interval):
            return None
        if grant is not None:
            if isinstance(grant, bool) or not isinstance(grant, int) or grant < 0:
                raise ValueError(f"grant must be an integer >= 0 or None, got {grant!r}")
            if not carry_grant:
                raise ValueError(f"grant={grant} needs carry_grant: it replaces the carried grant")
        return self._publish(params, iteration, message, carry_grant, grant)

    def republish(self, params: ParamDict, iteration: int, above: int = 0, message: str = "republish") -> int:
        """Publish ``params`` above every version seen: ``meta``'s, this publisher's last one and
        ``above`` (say, the highest agents report), for when agents keep rejecting the live blob or
        ``meta`` moved behind this publisher's back. Ignores ``min_publish_interval``; blocks and
        raises like :meth:`publish`.
        """
        if isinstance(above, bool) or not isinstance(above, (int, np.integer)) or above < 0:
            raise ValueError(f"above must be an integer >= 0, got {above!r}")
        self._version = None
        seen = max(self._floor, self.version, int(above))
        self._floor = seen
        version = self._publish(params, iteration, message)
        log.info("republished parameters as v%d (above v%d)", version, seen)
        return version

    def _publish(self, params: ParamDict, iteration: int, message: str, carry_grant: bool = False,
                 grant: int | None = None) -> int:
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
        upload_along = len(blob) <= self._config.write_piece_bytes and not is_cluster(self._client)
        try:
            if not upload_along:
                self._upload(blob)
            new = self._swap_in(blob, fields, carry_grant, grant, upload_along)
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

    def _upload_and_call(self, blob: bytes, keys: list, args: list) -> None:
        """SET the one-piece ``blob`` (with the leak-guard TTL) and run the publish script, one
        MULTI/EXEC; the script's error reply raised as :meth:`Scripts.call` raises it. A script
        the server lacks is loaded and run alone (the blob is staged by then)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self._staging, blob, px=int(self._config.pending_ttl_s * 1000))
        pipe.evalsha(self._scripts.sha("publish"), len(keys), *keys, *args)
        _, reply = pipe.execute(raise_on_error=False)
        if isinstance(reply, redis.exceptions.NoScriptError):
            self._scripts.call("publish", keys=keys, args=args)
        else:
            self._scripts.checked("publish", reply)

    def _swap_in(self, blob: bytes, fields: list, carry_grant: bool, grant: int | None = None,
                 upload_along: bool = False) -> int:
        """Run the publish script until it takes the staged blob (3 tries), the first try with
        the upload when ``upload_along`` (:meth:`_upload_and_call`); the new version."""
        tries_left = 3
        while True:
            prev = self.version
            new = max(prev, self._floor) + 1
            keys = [self._keys.meta, self._staging, self._keys.blob(new), self._keys.blob(prev),
                    *([self._keys.quota] if carry_grant else [])]
            args = [new, prev, len(blob), self._config.read_piece_bytes, *fields,
                    int(self._config.grace_s * 1000), self._keys.notify, "" if grant is None else grant]
            try:
                if upload_along:
                    upload_along = False  # a retry after a refusal finds the blob staged
                    self._retrying(partial(self._upload_and_call, blob, keys, args))
                else:
                    self._retrying(partial(self._scripts.call, "publish", keys=keys, args=args))
                if self._config.wait_replica_ms:
                    self._wait_for_replica(new)
                return new
            except ScriptError as exc:
                # The script wrote nothing. A lost staging key (Redis restarted mid-publish): upload
                # again; meta behind our last version (restarted empty): go on; ahead: refuse.
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
        """WAIT 1 on the server holding ``meta``; no replica in time is only logged."""
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
        """``step()`` (idempotent), re-sent up to ``retries`` times after an outage error with
        backoff; blocks for the tries and sleeps; the last error propagates."""
        return self._retry.call_with_retry(step, self._retry_failed, with_failure_count=True)

    def _retry_failed(self, exc: Exception, failures: int) -> None:
        if failures <= self._config.retries:  # the last failure propagates instead
            log.warning("parameter publish: Redis unavailable (%s); retry %d of %d", exc, failures,
                        self._config.retries)
