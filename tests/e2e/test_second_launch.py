"""End to end: a second launch of a live run on a shared Redis, from another experiment root, is
refused at every moment of the first run's life (right after it took the run's lease, before its
learner's first report, while a learner killed with SIGKILL is being restarted, with reports every
60 s, and at seeded random moments), before it moves or deletes anything; the first run keeps its
keys and runs on until it is interrupted. Once the first launch exits, its lease is gone."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from surreal_redis.connection import connect
from surreal_redis.embedded import find_redis_server
from surreal_redis.keys import RunKeys
from tests.e2e.test_supervision import CLI, SMOKE, KillableRedis, finish, launch, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

KEYS = RunKeys("smoke")
FIRST = ("tracking.enabled=false", "learner.metrics_every_s=60", "learner.max_restarts=3",
         "checkpoint.every_updates=1", "stop.max_env_steps=10000000", "stop.max_seconds=600")


@pytest.fixture()
def server(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    server = KillableRedis(tmp_path / "redis", appendonly=False).start()
    yield server
    server.stop()


def second_launch(tmp_path: Path, url: str, flag: str | None) -> subprocess.CompletedProcess:
    """The same run name from another experiment root, against the first run's Redis."""
    root = tmp_path / "elsewhere"
    return subprocess.run([*CLI, "launch", SMOKE, "--agents", "1", "--redis-url", url,
                           "-o", f"experiment.root={root}", "-o", "tracking.enabled=false",
                           "-o", "stop.max_env_steps=1", *([flag] if flag else [])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def assert_refused(done: subprocess.CompletedProcess, lease_before: bytes, client, what: str) -> None:
    assert done.returncode == 1, (what, done.stderr[-3000:])
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    message = lines[-1]
    assert message.startswith("Error: run 'smoke' is live:") and "holds the run's lease" in message, (what, message)
    assert "nothing was moved or deleted" in message, (what, message)
    assert client.get(KEYS.lease) == lease_before, what  # the first launch still owns the run
    assert client.exists(KEYS.config) and client.hget(KEYS.control, "state") == b"running", what


def supervising(output: Path) -> bool:
    """The launcher saw the first parameters and supervises (a learner that crashes before is not
    restarted: the run failed to start): its first progress line, with no learner report yet."""
    return "waiting for the learner..." in output.read_text()


def learner_alive(launcher: subprocess.Popen) -> bool:
    """Whether a learner runs now (none while its restart is pending)."""
    return any("learner" in p.cmdline() for p in psutil.Process(launcher.pid).children()
               if p.status() != psutil.STATUS_ZOMBIE)


def learner_child(launcher: subprocess.Popen) -> psutil.Process:
    (learner,) = [p for p in psutil.Process(launcher.pid).children()
                  if "learner" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE]
    return learner


def interrupt_and_finish(client, proc: subprocess.Popen, output: Path) -> str:
    """Ctrl-C the first launch (a stop request could race a restarted learner's start, which marks
    the run running again): it stops its children, saves, exits 130 and releases its lease."""
    proc.send_signal(signal.SIGINT)
    out = finish(proc, output, timeout=120)
    assert proc.returncode == 130, out[-4000:]
    assert "run 'smoke' interrupted" in out, out[-3000:]
    assert client.get(KEYS.lease) is None  # released at the exit
    return out


def test_a_second_launch_is_refused_before_the_first_report_and_during_a_learner_restart(tmp_path, server):
    client = connect(server.url)
    proc, output = launch(tmp_path, server.url, *FIRST)
    try:
        lease = wait_for(lambda: client.get(KEYS.lease), 60, "the first launch's lease", proc, output)
        # Right after the first launch took the run: no learner report yet (it reports every 60 s).
        done = second_launch(tmp_path, server.url, "--fresh")
        assert client.get(KEYS.learner) is None, "the learner reported: this moment is not before its first report"
        assert_refused(done, lease, client, "before the first report")
        wait_for(lambda: supervising(output), 120, "the first parameters", proc, output)
        # A learner killed with SIGKILL: the launcher restarts it after a backoff; launch meanwhile.
        learner = learner_child(proc)
        learner.send_signal(signal.SIGKILL)
        learner.wait(30)
        assert_refused(second_launch(tmp_path, server.url, None), lease, client, "during the learner's restart")
        assert_refused(second_launch(tmp_path, server.url, "--resume"), lease, client, "--resume, restarting")
        wait_for(lambda: "restarting the learner (restart 1 of 3)" in output.read_text(), 60,
                 "the learner's restart", proc, output)
        out = interrupt_and_finish(client, proc, output)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.count("learner crashed") == 1, out[-4000:]  # the one the test caused
    assert not (tmp_path / "elsewhere" / "smoke" / "hub.json").exists()  # the refused launches never announced


def test_second_launches_at_seeded_random_moments_are_refused(tmp_path, server):
    """For each seed, two second launches at moments drawn from it within 10 s (after the lease,
    then after the previous seed's launches), each with a flag and, drawn too, a learner killed
    first (once a learner runs); all are refused, against one first run."""
    client = connect(server.url)
    proc, output = launch(tmp_path, server.url, *FIRST)
    kills = 0
    try:
        lease = wait_for(lambda: client.get(KEYS.lease), 60, "the first launch's lease", proc, output)
        for seed in (1, 5):
            rng = random.Random(seed)
            started = time.monotonic()
            for moment in sorted(rng.uniform(0, 10) for _ in range(2)):
                time.sleep(max(0.0, started + moment - time.monotonic()))
                kill = rng.random() < 0.5
                if kill:  # once the run is supervised (a learner that crashes before is not restarted)
                    wait_for(lambda: supervising(output) and learner_alive(proc), 120, "a learner to kill",
                             proc, output)
                    learner_child(proc).send_signal(signal.SIGKILL)
                    kills += 1
                what = f"seed {seed}, {moment:.1f}s, learner killed: {kill}"
                assert_refused(second_launch(tmp_path, server.url, rng.choice(["--fresh", "--resume", None])),
                               lease, client, what)
        out = interrupt_and_finish(client, proc, output)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert kills and out.count("learner crashed") == kills, out[-4000:]
