"""A learner or agent started while its Redis is not up yet (restarting, its pod not ready, a
launcher restarting it during an outage) waits with capped backoff instead of exiting: each such
exit costs one of the launcher's ``max_restarts``."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server
from surreal_redis.hub.run.control import RunControl

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Output:
    """A process's merged output, read line by line on a thread: a test waits for a line to
    appear (the learner is waiting for Redis now) instead of sleeping for a start-up time that a
    loaded machine exceeds."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._fresh: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self._fresh.put(line)
        self._fresh.put(None)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        """True once a line holding ``text`` was printed; False at the output's end or the timeout."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._fresh.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                return False
            self.lines.append(line)
            if text in line:
                return True
        return False

    def rest(self, timeout_s: float) -> str:
        """Everything printed, after the output ends (at most ``timeout_s`` more)."""
        self.wait_for("\0never printed\0", timeout_s)
        return "".join(self.lines)


def test_a_learner_started_before_its_redis_waits_for_it_then_runs(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    learner = subprocess.Popen([*CLI, "learner", "--config", "smoke", "--redis-url", url,
                                "-o", f"experiment.root={tmp_path}", "-o", "tracking.enabled=false"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(learner)
    try:
        for _ in range(2):  # two failed attempts
            assert output.wait_for("retrying in", 120), "".join(output.lines)[-3000:]
        assert learner.poll() is None, output.rest(30)[-3000:]
        with EmbeddedRedis(port=port) as server:
            client = connect(server.url)
            deadline = time.monotonic() + 90
            while not RunControl(client, "smoke").learner_status() and time.monotonic() < deadline:
                assert learner.poll() is None, output.rest(30)[-3000:]
                time.sleep(0.5)
            assert RunControl(client, "smoke").learner_status(), "the learner never reported"
            learner.send_signal(signal.SIGINT)
            learner.wait(timeout=60)
            out = output.rest(30)
    finally:
        if learner.poll() is None:
            learner.kill()
    assert "learner start: Redis unavailable" in out and "retrying in" in out


def test_a_learner_stopped_while_it_waits_for_redis_exits_130(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    learner = subprocess.Popen([*CLI, "learner", "--config", "smoke", "--redis-url", url,
                                "-o", f"experiment.root={tmp_path}", "-o", "tracking.enabled=false"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(learner)
    try:
        assert output.wait_for("retrying in", 120), "".join(output.lines)[-3000:]  # waiting for Redis now
        learner.send_signal(signal.SIGTERM)
        learner.wait(timeout=30)
        out = output.rest(30)
    finally:
        if learner.poll() is None:
            learner.kill()
    assert learner.returncode == 130, out[-3000:]
    assert "stopped while waiting for Redis" in out
