"""End to end: `launch` supervising its run while the world breaks it. Redis is killed with
SIGKILL and restarted (with its AOF, or empty); the learner is killed and restarted from its
checkpoint until its restarts run out, and then `--resume` goes on at once. Each test takes a few
tens of seconds on the smoke config."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from surreal_redis.connection import connect
from surreal_redis.embedded import find_redis_server
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.keys import CONSUMER_GROUP, RunKeys

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class KillableRedis:
    """A redis-server on a TCP port with a data folder of its own, which a test can SIGKILL and
    start again on the same port: with ``appendonly`` it reloads its AOF, without it comes back empty."""

    def __init__(self, folder: Path, appendonly: bool) -> None:
        self.folder, self.appendonly, self.port = folder, appendonly, free_port()
        self.process: subprocess.Popen | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> KillableRedis:
        self.process = subprocess.Popen(
            [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--maxmemory", "256mb",
             "--maxmemory-policy", "noeviction", "--logfile", str(self.folder / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.ping():
                    return self
            except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError):
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                pytest.fail(f"redis-server on port {self.port} did not start: "
                            f"{(self.folder / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def launch(tmp_path: Path, url: str, *overrides: str, args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, Path]:
    """``surreal-redis launch`` of the smoke config with one agent, its output in a file."""
    output = tmp_path / f"launch-{time.monotonic_ns()}.out"
    options = [item for override in overrides for item in ("-o", override)]
    with open(output, "w") as out:
        proc = subprocess.Popen([*CLI, "launch", SMOKE, "--agents", "1", "--redis-url", url, *args,
                                 "-o", f"experiment.root={tmp_path}", "-o", "eval.enabled=false", *options],
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, output


def learner_status(client: redis.Redis) -> dict:
    try:
        return json.loads(client.get(RunKeys("smoke").learner) or b"{}")
    except redis.RedisError:
        return {}


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen, output: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"launch exited with {proc.returncode} while waiting for {what}:\n{output.read_text()[-4000:]}")
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{output.read_text()[-4000:]}")


def finish(proc: subprocess.Popen, output: Path, timeout: float) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return output.read_text()


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof", "empty"])
def test_launch_rides_out_a_redis_outage(tmp_path, appendonly):
    """kill -9 of redis-server, restarted 5 s later on the same port: the launcher waits like its
    children do, and the run goes on to its stop condition and exits 0."""
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    server = KillableRedis(tmp_path / "redis", appendonly).start()
    client = connect(server.url)
    # long enough to outlast the 5 s outage: lockstep smoke runs make ~2000 steps/s here
    proc, output = launch(tmp_path, server.url, "tracking.enabled=false", "stop.max_env_steps=30000",
                          "stop.max_seconds=300")
    try:
        wait_for(lambda: learner_status(client).get("iteration", 0) >= 1, 120, "a learner update", proc, output)
        (agent,) = read_agents(client, "smoke", 30)
        assert os.readlink(f"/proc/{agent.pid}/cwd") == str(tmp_path / "smoke" / "logs")  # MUJOCO_LOG.TXT goes there
        held = agent.param_version
        server.kill()
        time.sleep(5)
        assert proc.poll() is None, f"launch exited during the outage:\n{output.read_text()[-4000:]}"
        server.start()
        # Parameter versions never go back: emptied, Redis loses the version; the learner publishes
        # above what the agents report, and the agent moves on to it (it refuses anything lower).
        wait_for(lambda: [a for a in read_agents(connect(server.url), "smoke", 30) if a.param_version > held],
                 120, f"an agent acting with a version above v{held}", proc, output)
        out = finish(proc, output, timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 0, out[-4000:]
    assert "launcher: Redis unavailable" in out and "launcher: Redis reachable again" in out
    assert "exited with code" not in out and "learner crashed" not in out  # the children rode it out too
    assert "run 'smoke' finished (reached" in out, out[-3000:]
    if not appendonly:
        assert "Redis came back without the run's keys" in out
    assert "is below the held" not in (tmp_path / "smoke" / "logs" / "agent-0.log").read_text()


def test_a_crashed_learner_is_restarted_until_its_restarts_run_out_then_resume_goes_on(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    server = KillableRedis(tmp_path / "redis", appendonly=False).start()
    client = connect(server.url)
    proc, output = launch(tmp_path, server.url, "learner.max_restarts=1", "checkpoint.every_updates=1",
                          "stop.max_env_steps=10000000", "stop.max_seconds=600", "tracking.enabled=false")
    exp = RunKeys("smoke").shard(0).exp
    try:
        first = wait_for(lambda: (s := learner_status(client)).get("iteration", 0) >= 2 and s, 120,
                         "two learner updates", proc, output)
        os.kill(first["pid"], signal.SIGKILL)
        second = wait_for(lambda: (s := learner_status(client)).get("pid") not in (None, first["pid"])
                          and s.get("state") == "running" and s, 120, "the restarted learner", proc, output)
        assert (tmp_path / "smoke" / "logs" / "learner.log").read_text().count("resumed from") == 1
        assert second["iteration"] >= 2  # from the checkpoint, not from scratch
        consumers = {c["name"] for c in client.xinfo_consumers(exp, CONSUMER_GROUP)}
        assert consumers == {b"learner"}  # the same consumer: its pending entries are its own again
        os.kill(second["pid"], signal.SIGKILL)
        out = finish(proc, output, timeout=90)
        assert proc.returncode == 1, out[-4000:]
        assert "restarting the learner (restart 1 of 1) from its latest checkpoint" in out
        assert "learner crashed with exit code -9; stopping the run (restarts used: 1 of 1)" in out
        assert "run 'smoke' FAILED (the learner crashed" in out

        # right away, well inside the 30 s a running learner's report stays fresh
        resumed, resumed_output = launch(tmp_path, server.url, "stop.max_env_steps=1", "tracking.enabled=false",
                                         args=("--resume",))
        out = finish(resumed, resumed_output, timeout=120)
        assert resumed.returncode == 0, out[-4000:]
        assert "already running" not in out and "run 'smoke' finished" in out
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()


def test_relaunching_a_run_without_resume_is_refused(tmp_path):
    folder = tmp_path / "smoke"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-0000000001.pt").write_bytes(b"earlier")
    done = subprocess.run([*CLI, "launch", SMOKE, "-o", f"experiment.root={tmp_path}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "already holds a run" in done.stderr and "--resume" in done.stderr and "--fresh" in done.stderr
    assert (folder / "checkpoints" / "ckpt-0000000001.pt").read_bytes() == b"earlier"
