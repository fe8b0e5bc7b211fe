"""Fault injection for the experience path, on real redis-server processes: replies lost after the
server ran the command (a proxy that closes the connection instead of passing the reply on), a
full Redis (small maxmemory), hostile stream entries, a learner restarted within a minute.

Every test ends with exact accounting: each chunk the sender counted as sent is delivered exactly
once, or counted as dropped with a reason (dead letter, trimmed unread, trimmed while pending).
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceivedChunk
from surreal_redis.hub.experience.sender import ExperienceSender


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: fault injection on the experience path (real redis-server; "
                                       "part of the default suite, seconds each)")


class LossyProxy:
    """A unix-socket proxy in front of a redis-server that loses replies.

    :meth:`lose_replies` arms it: the next request (a read from the client) containing ``pattern``
    is forwarded, the server runs it, and its reply is thrown away as the proxy closes that client
    connection, which is what a network failing at the wrong moment looks like to the client.
    ``rate`` loses that fraction of matching requests instead (seeded), ``times`` bounds how many.
    """

    def __init__(self, target: Path, directory: Path, seed: int = 0) -> None:
        self.target, self.path = str(target), directory / "proxy.sock"
        self._rules: list[list] = []  # [pattern, rate, times left]
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.lost = Counter()  # pattern -> replies lost
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(64)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def lose_replies(self, pattern: bytes, times: int = 1, rate: float = 1.0) -> None:
        with self._lock:
            self._rules.append([pattern, rate, times])

    def heal(self) -> None:
        with self._lock:
            self._rules.clear()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _doomed(self, data: bytes) -> bool:
        with self._lock:
            for rule in self._rules:
                pattern, rate, left = rule
                if left > 0 and pattern in data and self._rng.random() < rate:
                    rule[2] -= 1
                    self.lost[pattern] += 1
                    return True
        return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.target)
            state = {"doomed": False, "last_up": time.monotonic()}
            threading.Thread(target=self._upstream, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._downstream, args=(client, server, state), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(1 << 16):
                if self._doomed(data):
                    state["doomed"] = True  # before the server can answer
                state["last_up"] = time.monotonic()
                server.sendall(data)
        except OSError:
            pass
        _close(client, server)

    def _downstream(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        """Pass replies on; once doomed, swallow them until the client has sent the whole
        request (quiet for 0.1 s), then close: the server ran every command, no reply arrives."""
        server.settimeout(0.05)
        try:
            while True:
                try:
                    data = server.recv(1 << 16)
                except TimeoutError:
                    data = None
                if data == b"":
                    break
                if state["doomed"]:
                    if data is None and time.monotonic() - state["last_up"] > 0.1:
                        break
                elif data:
                    client.sendall(data)
        except OSError:
            pass
        _close(client, server)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


@pytest.fixture
def lossy_proxy(redis_server, tmp_path):
    proxy = LossyProxy(redis_server.socket_path, tmp_path)
    yield proxy
    proxy.close()


def noise_frames(rng: np.random.Generator, n: int) -> np.ndarray:
    """Incompressible 84x84 frames (above dedup_min_bytes: they travel by digest), one per env."""
    return rng.integers(0, 256, (n, 84, 84), dtype=np.uint8)


def add_steps(sender: ExperienceSender, start: int, count: int, rng: np.random.Generator, n: int = 2,
              frames=None) -> None:
    """Steps ``start .. start + count - 1`` of ``n`` envs; the reward of step k in env e is
    ``1000 * k + e``, so every chunk is identified by its env and first reward."""
    zeros = np.zeros(n, bool)
    for k in range(start, start + count):
        obs = noise_frames(rng, n) if frames is None else frames(k)
        sender.add({"f": obs}, np.zeros(n), 1000.0 * k + np.arange(n), zeros, zeros)


def identity(item: ReceivedChunk) -> tuple[int, int, float]:
    return item.chunk.agent_id, item.chunk.env_index, float(item.chunk.rewards[0])


def drain(receiver: ExperienceReceiver, rounds: int = 3, errors: tuple = ()) -> list[ReceivedChunk]:
    """Receive and ack until ``rounds`` calls in a row take nothing (no chunk, nothing set aside
    or counted trimmed); ``errors`` raised by a call (a lost reply) are retried as the learner's
    reader thread would."""
    got: list[ReceivedChunk] = []
    empty = 0

    def taken() -> int:
        stats = receiver.stats()
        return stats.chunks + stats.dead + stats.pending_trimmed

    while empty < rounds:
        before = taken()
        try:
            batch = receiver.receive(64, block_ms=0)
        except errors:
            empty = 0
            continue
        empty = 0 if taken() > before else empty + 1
        got += batch
        while batch:
            try:
                receiver.ack(batch)
                break
            except errors:
                continue
    return got


def assert_exactly_once(got: list[ReceivedChunk]) -> set:
    ids = Counter(identity(item) for item in got)
    twice = [key for key, n in ids.items() if n > 1]
    assert not twice, f"chunks delivered more than once: {twice[:5]}"
    return set(ids)
