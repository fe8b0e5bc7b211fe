"""Redis connections: URL -> client with explicit timeouts (:func:`connect`), ``BLOCK`` durations
inside the socket timeout (:func:`block_ms`), and explicit retries of idempotent calls.

Retry policy: a client from :func:`connect` never repeats a command by itself. A command whose
reply was lost may have run (an ``XREADGROUP ... >`` has then moved entries into the consumer's
pending list), so only the caller knows whether running it again is safe. Idempotent calls go
through :func:`retry_idempotent`; long-running loops ride out errors with
:class:`~surreal_redis.outage.OutageGuard`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import EqualJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

log = logging.getLogger(__name__)

ENV_URL = "SURREAL_REDIS_URL"
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)

RedisClient = redis.Redis | RedisCluster
"""What :func:`connect` returns: a standalone client, or a cluster client for ``redis+cluster://``."""


class _ClientOptions(TypedDict):
    """The options :func:`connect` gives both kinds of client."""

    protocol: int
    decode_responses: bool
    socket_timeout: float
    socket_connect_timeout: float
    retry: Retry
    health_check_interval: float


StreamEntry = tuple[bytes, dict[bytes, bytes]]
"""One stream entry as a client from :func:`connect` (RESP2, bytes replies) returns it: (id, fields)."""
StreamRead = list[tuple[bytes, list[StreamEntry]]]
"""An XREAD / XREADGROUP reply of such a client: (stream name, entries) per stream with entries."""


def stream_entries(reply: object) -> list[StreamEntry]:
    """An XRANGE / XREVRANGE reply typed as :func:`connect`'s clients return it; None: ``[]``."""
    return cast(list[StreamEntry], reply or [])


def stream_read(reply: object) -> StreamRead:
    """An XREAD / XREADGROUP reply (see :func:`stream_entries`); None (nothing new): ``[]``."""
    return cast(StreamRead, reply or [])


def string_list(reply: object) -> list[bytes]:
    """An array of strings (ZRANGE without scores, SMEMBERS, ...; see :func:`stream_entries`)."""
    return cast(list[bytes], reply or [])


def as_text(reply: bytes | str, errors: str = "strict") -> str:
    """A reply as text (redis-py types replies as bytes or str)."""
    return reply.decode(errors=errors) if isinstance(reply, bytes) else reply


def as_bytes(reply: bytes | str) -> bytes:
    """A reply as bytes (see :func:`as_text`)."""
    return reply if isinstance(reply, bytes) else reply.encode()


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis. Times are in seconds."""

    url: str | None = None
    """redis://, rediss://, unix://, or redis+cluster:// / rediss+cluster:// URL (Redis Cluster:
    ``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]``); None: ``$SURREAL_REDIS_URL``, or
    an embedded server."""
    socket_timeout: float = 10.0
    """Seconds a command may wait for its reply; blocking reads use at most half of it."""
    connect_timeout: float = 5.0
    retries: int = 3
    """Retries of an idempotent call wrapped in :func:`retry_idempotent` after a connection or
    timeout error (with backoff); the client itself never retries (see the module docstring)."""
    backoff_base: float = 0.05
    backoff_cap: float = 2.0
    health_check_interval: float = 30.0
    """Seconds of idleness after which a connection is checked with PING before use."""

    def __post_init__(self) -> None:
        if self.socket_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("socket_timeout and connect_timeout must be > 0")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not 0 < self.backoff_base <= self.backoff_cap:
            raise ValueError("need 0 < backoff_base <= backoff_cap")


def resolve_url(url: str | None) -> str | None:
    """``url`` if given, else ``$SURREAL_REDIS_URL``, else None."""
    return url or os.environ.get(ENV_URL) or None


def connect(url: str, settings: RedisSettings | None = None) -> RedisClient:
    """A client for ``redis://``, ``rediss://`` or ``unix://`` URLs, or a
    :class:`redis.cluster.RedisCluster` for ``redis+cluster://`` / ``rediss+cluster://`` ones:
    RESP2, bytes replies, explicit timeouts, no automatic retries (module docstring). A cluster
    client refreshes its slot map after a connection error or a MOVED reply, so the next call goes
    to the promoted replica after a failover. Raises ``ValueError`` naming an unsupported URL.
    """
    settings = settings or RedisSettings()
    common = _ClientOptions(
        protocol=2, decode_responses=False, socket_timeout=settings.socket_timeout,
        socket_connect_timeout=settings.connect_timeout,
        retry=Retry(NoBackoff(), 0),  # redis-py's default would repeat every command 3 times
        health_check_interval=settings.health_check_interval)
    if url.startswith(CLUSTER_SCHEMES):
        address = parse_cluster_url(url)
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in address.nodes],
                            username=address.username, password=address.password, ssl=address.ssl,
                            **common)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"unsupported Redis URL {url!r}: use redis://, rediss://, unix://, "
                         "redis+cluster:// or rediss+cluster://")
    return redis.Redis.from_url(url, retry_on_error=[], **common)


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed ``redis+cluster://`` URL: startup nodes (host, port), credentials, TLS."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    ssl: bool


def parse_cluster_url(url: str) -> ClusterAddress:
    """``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][/]`` (``rediss+cluster://``: TLS)
    -> :class:`ClusterAddress`. A cluster has no databases and no unix sockets, so a path other
    than ``/`` or ``/0`` or a ``db=`` parameter is refused; so is a missing port. Raises
    ``ValueError`` naming the URL and the bad part."""
    if not url.startswith(CLUSTER_SCHEMES):
        raise ValueError(f"not a cluster URL {url!r}: use redis+cluster://HOST:PORT[,HOST:PORT...]")
    scheme, rest = url.split("://", 1)
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    if "?" in netloc:
        netloc, _, query = netloc.partition("?")
    if path not in ("", "0") or "db" in parse_qs(query):
        raise ValueError(f"cluster URL {url!r} names a database: Redis Cluster has only database 0")
    credentials, _, hosts = netloc.rpartition("@")
    username = password = None
    if credentials:
        user, has_password, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    nodes = []
    for item in hosts.split(","):
        parts = urlsplit(f"//{item}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise ValueError(f"cluster URL {url!r}: node {item!r} must be HOST:PORT")
        nodes.append((parts.hostname, port))
    return ClusterAddress(tuple(nodes), username, password, scheme == "rediss+cluster")


def block_ms(requested_ms: int, settings: RedisSettings) -> int:
    """A ``BLOCK`` duration no longer than half the socket timeout (so reads never time out)."""
    return max(1, min(int(requested_ms), int(settings.socket_timeout * 1000 / 2) - 1))


class Backoff(EqualJitterBackoff):
    """redis-py's :class:`~redis.backoff.EqualJitterBackoff` (the n-th delay drawn uniformly from
    ``[c/2, c]`` seconds, ``c = min(cap, base * 2**n)``) plus the failure count: ``next_delay()``
    counts a failure and returns the seconds to sleep; ``reset()`` after a success.
    """

    def __init__(self, base: float = 0.05, cap: float = 5.0) -> None:
        if not 0 < base <= cap:
            raise ValueError(f"need 0 < base <= cap, got base={base} cap={cap}")
        super().__init__(cap=cap, base=base)
        self.failures = 0
        """Failures since the last :meth:`reset`."""

    def next_delay(self) -> float:
        self.failures += 1
        return self.compute(self.failures)

    def reset(self) -> None:
        self.failures = 0


T = TypeVar("T")


def retry_idempotent(fn: Callable[[], T], settings: RedisSettings | None = None) -> T:
    """``fn()``, called again after a connection or timeout error up to ``settings.retries`` times
    with capped jittered backoff; the last error propagates. Only for calls that are safe to repeat
    when their reply was lost (reads, XACK, SET of the same value, a script deduplicated by a
    sequence number). Blocks for the attempts and sleeps."""
    settings = settings or RedisSettings()

    def failed(exc: Exception, failures: int) -> None:
        if failures <= settings.retries:
            log.debug("idempotent call failed (%s); retry %d of %d", exc, failures, settings.retries)

    retry = Retry(EqualJitterBackoff(cap=settings.backoff_cap, base=settings.backoff_base),
                  settings.retries, CONNECTION_ERRORS)
    return retry.call_with_retry(fn, failed, with_failure_count=True)
