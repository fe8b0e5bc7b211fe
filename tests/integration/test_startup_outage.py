"""A learner or agent started while its Redis is not up yet (restarting, its pod not ready, a
launcher restarting it during an outage) waits with capped backoff instead of exiting: each such
exit costs one of the launcher's ``max_restarts``."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from surreal_redis.connection import EmbeddedRedis, connect, find_redis_server
from surreal_redis.hub.run.control import RunControl

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_learner_started_before_its_redis_waits_for_it_then_runs(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    learner = subprocess.Popen([*CLI, "learner", "--config", "smoke", "--redis-url", url,
                                "-o", f"experiment.root={tmp_path}", "-o", "tracking.enabled=false"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(4)  # two or more failed attempts
        assert learner.poll() is None, learner.communicate()[0][-3000:]
        with EmbeddedRedis(port=port) as server:
            client = connect(server.url)
            deadline = time.monotonic() + 90
            while not RunControl(client, "smoke").learner_status() and time.monotonic() < deadline:
                assert learner.poll() is None, learner.communicate()[0][-3000:]
                time.sleep(0.5)
            assert RunControl(client, "smoke").learner_status(), "the learner never reported"
            learner.send_signal(signal.SIGINT)
            out = learner.communicate(timeout=60)[0]
    finally:
        if learner.poll() is None:
            learner.kill()
    assert "learner start: Redis unavailable" in out and "retrying in" in out


def test_a_learner_stopped_while_it_waits_for_redis_exits_130(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    learner = subprocess.Popen([*CLI, "learner", "--config", "smoke", "--redis-url", url,
                                "-o", f"experiment.root={tmp_path}", "-o", "tracking.enabled=false"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(3)
        learner.send_signal(signal.SIGTERM)
        out = learner.communicate(timeout=30)[0]
    finally:
        if learner.poll() is None:
            learner.kill()
    assert learner.returncode == 130, out[-3000:]
    assert "stopped while waiting for Redis" in out
