"""Chaos run: the smoke PPO job under ``surreal-redis launch`` against a standalone redis-server
(AOF, ``appendfsync always``: a kill -9 loses nothing it acknowledged), with a seeded random
schedule of faults: Redis kill -9 and restart (within a second; after a minute in the long run),
Redis SIGSTOP for 3-8 s, the learner and agents kill -9 (the launcher restarts them), maxmemory
lowered to just above what Redis uses for a few seconds, and (as root) partitions: Redis runs in
one network namespace of a lab (tests/support/netns.py), the launch with all its processes in
another, and the link between them is cut for 3-8 s (in the long run also for 60-70 s); the test
itself reads Redis over its unix socket, which no cut reaches. Where namespaces cannot be built
the schedule has no partitions and the test says so. Every process records the experience
ledger (``SURREAL_LEDGER_DIR``); at the end every acknowledged chunk is classified
(tests/chaos/ledger.py) and the table printed (``-s``), written to ``chaos-table.txt`` in the
test's tmp dir and put in the assertion message.

The short run (~2 min) is in the default suite; the long one (30 min, more faults, Redis down for
a minute) runs with ``SURREAL_LONG_TESTS=1``. ``SURREAL_CHAOS_SEED=<n>`` replays a schedule
(on a machine that can build namespaces or one that cannot, not across the two). The launch may
restart the learner as often as the schedule kills it and each agent as often as the schedule
kills the agent it kills most, no more: an outage or a cut that crashed a process would use up
its restarts and fail the run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.netns import NetnsLab, netns_unavailable

from surreal_redis.connection import CONNECTION_ERRORS, connect
from surreal_redis.embedded import find_redis_server
from surreal_redis.hub.experience.ledger import LEDGER_DIR_ENV
from surreal_redis.hub.run.control import RunControl

from .harness import (
    AGENTS,
    CLI,
    LONG,
    PROBE,
    RUN,
    SMOKE,
    Fault,
    FaultLog,
    chaos_seed,
    launch_overrides,
    quietly,
    recover_and_stop,
    stream_origins,
    wait_for,
)
from .ledger import account, reported_trims

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAXMEMORY = 256 << 20
DEFAULT_SEED = 20261201
SEED = chaos_seed(DEFAULT_SEED)


KINDS = ("redis_kill", "redis_stop", "learner_kill", "agent_kill", "maxmemory", "partition")
NO_LAB = netns_unavailable()
REDIS_PORT = 6379  # inside the lab's hub namespace


def make_schedule(rng: random.Random, long: bool, kinds_allowed: tuple[str, ...] = KINDS) -> list[Fault]:
    """Every kind at least once (short: 8 faults in ~60 s; long: ~60 faults in ~25 min, some of
    them Redis down or the launch cut off for 60-75 s)."""
    count = 60 if long else 8
    kinds = list(kinds_allowed) + [rng.choice(kinds_allowed) for _ in range(count - len(kinds_allowed))]
    rng.shuffle(kinds)
    faults = []
    for kind in kinds:
        gap = rng.uniform(8, 20) if long else rng.uniform(3, 6)
        if kind == "redis_kill":
            slow = long and rng.random() < 0.25
            faults.append(Fault(kind, gap, rng.uniform(60, 75) if slow else rng.uniform(0.1, 0.9)))
        elif kind == "redis_stop":
            faults.append(Fault(kind, gap, rng.uniform(3, 8)))
        elif kind == "maxmemory":
            faults.append(Fault(kind, gap, rng.uniform(3, 6)))
        elif kind == "partition":
            slow = long and rng.random() < 0.25
            faults.append(Fault(kind, gap, rng.uniform(60, 70) if slow else rng.uniform(3, 8)))
        elif kind == "agent_kill":
            faults.append(Fault(kind, gap, agent=rng.randrange(AGENTS)))
        else:
            faults.append(Fault(kind, gap))
    return faults


class ChaosRedis:
    """A redis-server on a unix socket with AOF fsynced on every write, killed, frozen and
    restarted (same argv, same directory: it reloads its AOF) by the test. With a ``lab`` it runs
    in the lab's ``hub`` namespace and also listens there on TCP (``run_url``, what the launch
    uses); ``url``, the socket, is the test's own way in."""

    def __init__(self, folder: Path, lab: NetnsLab | None = None) -> None:
        binary = find_redis_server()
        if binary is None:
            pytest.skip("no redis-server binary found")
        folder.mkdir(parents=True, exist_ok=True)
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.lab = lab
        if lab is None:
            listen = ["--port", "0"]
            self.run_url = self.url
        else:
            address = lab.host("hub").address
            listen = ["--port", str(REDIS_PORT), "--bind", address, "--protected-mode", "no"]
            self.run_url = f"redis://{address}:{REDIS_PORT}"
        self.argv = [str(binary), *listen, "--unixsocket", str(self.socket), "--unixsocketperm", "700",
                     "--dir", str(folder), "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                     "--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction",
                     "--logfile", str(folder / "redis.log")]
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        if self.lab is None:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        else:  # `ip netns exec` execs the server: the pid is redis-server's own
            self.process = self.lab.start("hub", "redis", self.argv).process
        deadline = time.monotonic() + 30
        while not self.answers():
            assert time.monotonic() < deadline, "redis-server did not answer within 30 s"
            time.sleep(0.05)

    def answers(self) -> bool:
        probe = connect(self.url, PROBE)
        try:
            return bool(probe.ping())
        except CONNECTION_ERRORS:
            return False
        finally:
            probe.close()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=30)


class Chaos(FaultLog):
    def __init__(self, redis: ChaosRedis, launch: subprocess.Popen, lab: NetnsLab | None = None) -> None:
        super().__init__(launch)
        self.redis, self.lab = redis, lab

    def inject(self, fault: Fault) -> None:
        time.sleep(fault.after_s)
        kind = fault.kind
        if kind == "redis_kill":
            self.redis.kill()
            self.note(f"redis kill -9, restart in {fault.duration_s:.1f}s")
            time.sleep(fault.duration_s)
            self.redis.start()
        elif kind == "redis_stop":
            self.redis.signal(signal.SIGSTOP)
            self.note(f"redis SIGSTOP for {fault.duration_s:.1f}s")
            time.sleep(fault.duration_s)
            self.redis.signal(signal.SIGCONT)
        elif kind == "partition":
            assert self.lab is not None
            self.lab.cut("run")
            self.note(f"launch cut off from redis for {fault.duration_s:.1f}s")
            try:
                time.sleep(fault.duration_s)
            finally:
                self.lab.heal("run")
        elif kind == "maxmemory":
            client = connect(self.redis.url, PROBE)
            try:
                used = int(client.info("memory")["used_memory"])
                client.config_set("maxmemory", used + (512 << 10))
                self.note(f"maxmemory {used + (512 << 10)} (used {used}) for {fault.duration_s:.1f}s")
                time.sleep(fault.duration_s)
                client.config_set("maxmemory", MAXMEMORY)
            finally:
                client.close()
        else:
            self.kill_process(fault)
        self.injected[kind] += 1


@pytest.mark.parametrize("long", [
    pytest.param(False, id="short", marks=pytest.mark.timeout(600)),  # ~70 s; slower on a loaded machine
    pytest.param(True, id="long", marks=[pytest.mark.timeout(2700), pytest.mark.skipif(
        not LONG, reason="30-minute chaos run: set SURREAL_LONG_TESTS=1")])])
def test_chaos_run_keeps_an_exact_ledger(tmp_path, long):
    with contextlib.ExitStack() as stack:
        lab = None if NO_LAB else stack.enter_context(NetnsLab(["hub", "run"], tmp_path / "lab"))
        chaos_run(tmp_path, long, lab)


def chaos_run(tmp_path: Path, long: bool, lab: NetnsLab | None) -> None:
    rng = random.Random(SEED)
    schedule = make_schedule(rng, long, KINDS if lab else tuple(k for k in KINDS if k != "partition"))
    print(f"\nchaos seed {SEED} ({'long' if long else 'short'}): SURREAL_CHAOS_SEED={SEED} replays it"
          + (f"; no partitions: {NO_LAB}" if lab is None else ""), flush=True)
    redis = ChaosRedis(tmp_path / "redis", lab)
    redis.start()
    ledger_dir = tmp_path / "ledger"
    overrides = launch_overrides(tmp_path, schedule)
    env = {**os.environ, LEDGER_DIR_ENV: str(ledger_dir)}
    client = connect(redis.url, PROBE)
    control = RunControl(client, RUN)
    argv = [*CLI, "launch", SMOKE, "--agents", str(AGENTS), "--redis-url", redis.run_url,
            *(a for o in overrides for a in ("-o", o))]
    if lab is None:
        out_path = tmp_path / "launch.out"
        with out_path.open("w") as out:
            launch = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    else:
        started = lab.start("run", "launch", argv, env=env, cwd=tmp_path)
        launch, out_path = started.process, started.log_path
    chaos = Chaos(redis, launch, lab)
    finished = "no"
    try:
        wait_for(lambda: quietly(lambda: control.learner_status().get("iteration", 0), 0) >= 1, 180,
                 "the first update", launch)
        for fault in schedule:
            chaos.inject(fault)
        ok, finished = recover_and_stop(launch, control, client, redis.url, tmp_path, out_path, chaos.note)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    try:
        learner_log = (tmp_path / RUN / "logs" / "learner.log").read_text()
        accounting = account(ledger_dir, stream_origins(redis.url), reported_trims(learner_log),
                             chaos.killed_learners)
    finally:
        client.close()
        redis.stop()
    lost = ("0 allowed (standalone Redis, appendfsync always: a partition loses nothing acknowledged; "
            "a loss is unaccounted)" if chaos.injected["partition"] else "n/a (standalone Redis, no partitions)")
    table = accounting.table(chaos.injected, ("yes, " if ok else "NO, ") + finished, lost)
    report = f"chaos seed {SEED} ({'long' if long else 'short'})\n{table}\nschedule:\n" + "\n".join(chaos.log)
    (tmp_path / "chaos-table.txt").write_text(report + "\n")
    print(report, flush=True)
    assert accounting.acknowledged > 0 and sum(chaos.injected.values()) == len(schedule), report
    assert accounting.trained_twice == 0, report
    assert accounting.unaccounted == 0, report
    assert ok, report + "\n" + out_path.read_text()[-3000:]
