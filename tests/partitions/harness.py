"""The smoke run across a network-namespace lab, and the accounting of its chunks after partitions."""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.netns import LabProcess, NetnsLab

from surreal_redis.keys import RunKeys

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "smoke.yaml"
RUN = "smoke"
AGENTS = ("agent0", "agent1")
LONG = os.environ.get("SURREAL_LONG_TESTS") == "1"
RECOVERY_S = 90.0  # generous bound on 2 shared cores; the measured times go to the log
OVERRIDES = ("stop.max_env_steps=100000000", "stop.max_seconds=1800", "checkpoint.every_updates=1000",
             "learner.metrics_every_s=1.0")

ACCOUNT = r'''
import hashlib, json, sys
import numpy as np
from surreal_redis.config import load_config
from surreal_redis.connection import connect
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.keys import CONSUMER_GROUP, RunKeys
from surreal_redis.scripts import Scripts
from surreal_redis.trees import tree_leaves
config = load_config(sys.argv[2], sys.argv[3:])
client = connect(sys.argv[1])
shards = RunKeys(config.run).shards(config.redis.num_shards)
# the agents' last flushes, stored in their inboxes after the learner's last move, go into the streams
scripts = Scripts(client)
moved = {"taken": 0, "duplicates": 0, "malformed": 0}
for keys in shards:
    while client.llen(keys.inbox):
        step = move_inbox(scripts, keys)
        for name in moved:
            moved[name] += getattr(step, name)
account = {"moved_at_audit": moved, "pending": sum(client.xpending(keys.exp, CONSUMER_GROUP)["pending"] for keys in shards),
           "added": sum(client.xinfo_stream(keys.exp)["entries-added"] for keys in shards),
           "length": sum(client.xlen(keys.exp) for keys in shards), "chunks": []}
def receiver():
    return ExperienceReceiver(client, ReceiverConfig(consumer="partition-audit"), config.run, config.redis.num_shards)
for chunk in receiver().read_retained():
    arrays = [*tree_leaves(chunk.obs), chunk.actions, chunk.rewards, chunk.policy_version]
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()
    account["chunks"].append([chunk.agent_id, chunk.env_index, digest, int(chunk.num_steps)])
# what the consumer group handed out (after the pending count above: this pass acks pending entries)
account["delivered_steps"] = sum(int(chunk.num_steps) for chunk in receiver().read_retained(delivered_only=True))
print(json.dumps(account))
'''


class Run:
    """The smoke run across the lab; polls Redis from the observer host (never cut)."""

    def __init__(self, lab: NetnsLab, folder: Path, url: str, redis_host: str, redis_port: int,
                 servers: list[LabProcess], overrides: tuple[str, ...] = ()) -> None:
        """``url``: how the learner and agents reach Redis; ``redis_host``/``redis_port``: a node
        the observer asks (redis-cli -c follows a cluster's redirects); ``servers``: the Redis
        processes already started (they must not exit either)."""
        self.lab, self.folder, self.url = lab, folder, url
        folder.mkdir(parents=True, exist_ok=True)
        self.redis_address, self.redis_port = lab.host(redis_host).address, redis_port
        self.keys = RunKeys(RUN)
        self.started: list[LabProcess] = list(servers)
        self.overrides = (*OVERRIDES, *overrides, f"experiment.root={folder / 'runs'}")
        self.wait_for(lambda: self.cli("PING") == "PONG", 20, "Redis answers")
        self.learner = self._surreal("learner", "learner")
        self.agents = {name: self._surreal(name, "agent", "--id", str(i)) for i, name in enumerate(AGENTS)}
        self.started += [self.learner, *self.agents.values()]

    def _surreal(self, host: str, *command: str) -> LabProcess:
        overrides = [arg for item in self.overrides for arg in ("-o", item)]
        return self.lab.start(host, host, [sys.executable, "-m", "surreal_redis.cli", *command, "--config",
                                           str(SMOKE), "--redis-url", self.url,
                                           *overrides], cwd=self.folder)

    @property
    def processes(self) -> list[LabProcess]:
        return self.started

    def cli(self, *args: str) -> str:
        done = self.lab.run("observer", ["redis-cli", "-c", "-h", self.redis_address, "-p", str(self.redis_port),
                                         "--raw", *args], timeout_s=10)
        return done.stdout.strip()

    def learner_status(self) -> dict[str, Any]:
        raw = self.cli("GET", self.keys.learner)
        return json.loads(raw) if raw else {}

    def heartbeats(self) -> dict[str, dict[str, Any]]:
        lines = self.cli("HGETALL", self.keys.agents).splitlines()
        return {lines[i]: json.loads(lines[i + 1]) for i in range(0, len(lines) - 1, 2)}

    def iteration(self) -> int:
        return int(self.learner_status().get("iteration", 0))

    def assert_all_running(self) -> None:
        exited = {p.name: (p.exit_code(), p.log_tail()) for p in self.processes if p.exit_code() is not None}
        assert not exited, f"processes exited: {exited}"

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Seconds until ``predicate()`` held (polled every 0.5 s); fails naming ``what`` after ``timeout_s``."""
        started = time.monotonic()
        while not predicate():
            if time.monotonic() - started > timeout_s:
                logs = "\n".join(f"--- {p.name}\n{p.log_tail(1500)}" for p in self.processes[1:])
                pytest.fail(f"not within {timeout_s:.0f}s: {what}\n{logs}")
            self.assert_all_running()
            time.sleep(0.5)
        return time.monotonic() - started

    def wait_training(self, after_iteration: int, since: float, what: str) -> dict[str, float]:
        """The learner updates past ``after_iteration`` and every agent heartbeats after unix time
        ``since``; returns the seconds each took."""
        updates = self.wait_for(lambda: self.iteration() > after_iteration, RECOVERY_S, f"learner updates ({what})")
        beats = self.wait_for(lambda: all(self.heartbeats().get(str(i), {}).get("ts", 0) > since
                                          for i in range(len(AGENTS))), RECOVERY_S, f"agent heartbeats ({what})")
        return {"updates_s": updates, "heartbeats_s": beats}

    def partition(self, hosts: tuple[str, ...], seconds: float) -> dict[str, float]:
        """Cut ``hosts`` for ``seconds``, heal, and wait until training and heartbeats resume."""
        self.wait_training(self.iteration(), time.time(), "before the cut")
        self.lab.cut(*hosts)
        try:
            # the status the learner wrote just before the cut is read 2 s in (it reports every second)
            time.sleep(2.0)
            early = self.iteration()
            time.sleep(seconds - 2.0)
            self.assert_all_running()
            during = self.iteration()
        finally:
            self.lab.heal(*hosts)
        healed_at = time.time()
        timings = self.wait_training(during, healed_at, f"after a {seconds:.0f}s cut of {', '.join(hosts)}")
        self.assert_all_running()
        print(f"cut {hosts} {seconds:.0f}s: learner at update {early} 2 s in, {during} at the heal; "
              f"resumed after {timings['updates_s']:.1f} s (updates), {timings['heartbeats_s']:.1f} s (heartbeats)")
        return timings


def _sender_stats(agent: LabProcess) -> dict[str, Any]:
    """The sender counters an agent logs as it stops ("stopped after ... sender {...}")."""
    line = [line for line in agent.log_path.read_text().splitlines() if ": stopped after " in line][-1]
    return ast.literal_eval(line.partition("; sender ")[2])


def account_for_every_chunk(run: Run, may_lose: bool = False) -> dict[str, Any]:
    """Stop the run and account for every chunk: none is in the streams twice, the learner took in
    each delivered chunk at most once and all but those it left pending, and every chunk a sender
    counted as stored is in the streams. ``may_lose``: stored chunks may be missing (a cluster
    failover loses what the old primary had not replicated); they are counted in ``lost``.
    Returns the numbers."""
    run.assert_all_running()
    run.cli("HSET", run.keys.control, "state", "stopping", "reason", "partition test done")
    # each process sees the stop request by itself (a signal now would be a second stop: exit at once)
    for process in (*run.agents.values(), run.learner):
        assert process.wait(timeout_s=60) == 0, (process.name, process.exit_code(), process.log_tail())
    status = run.learner_status()
    assert status.get("state") == "stopped", status
    audit = run.lab.run("observer", [sys.executable, "-c", ACCOUNT, run.url, str(SMOKE),
                                     *run.overrides], timeout_s=120)
    assert audit.returncode == 0, audit.stderr[-3000:]
    account = json.loads(audit.stdout.strip().splitlines()[-1])
    identities = Counter((agent, env, digest) for agent, env, digest, _ in account["chunks"])
    twice = [key for key, n in identities.items() if n > 1]
    assert not twice, f"chunks in the stream more than once: {twice[:5]}"
    assert account["moved_at_audit"]["duplicates"] == account["moved_at_audit"]["malformed"] == 0, account["moved_at_audit"]
    # nothing trimmed: every chunk ever added is still there to count
    assert account["length"] == account["added"] == len(account["chunks"])
    stream_steps = sum(steps for *_, steps in account["chunks"])
    delivered = account["delivered_steps"]
    # the learner ingested each chunk the group handed it at most once (a chunk trained twice would
    # count twice), and all but those it left pending (read, not acked) at the stop
    flush_steps = 32
    assert delivered - flush_steps * account["pending"] <= status["env_steps"] <= delivered <= stream_steps
    # each agent's chunks: every one its sender counted as stored is in the stream once; a chunk it
    # gave up on (counted dropped) may have been stored all the same (its reply was what got lost)
    dropped, lost = {}, {}
    for agent_id, agent in enumerate(run.agents.values()):
        stats = _sender_stats(agent)
        in_stream = sum(1 for chunk in account["chunks"] if chunk[0] == agent_id)
        assert in_stream <= stats["chunks"] + stats["chunks_dropped"], (agent_id, stats, in_stream)
        lost[agent.name] = max(0, stats["chunks"] - in_stream)
        assert may_lose or lost[agent.name] == 0, (agent_id, stats, in_stream)
        dropped[agent.name] = (stats["chunks_dropped"], stats["steps_dropped"])
    print(f"accounted: {len(account['chunks'])} chunks, {stream_steps} steps in the stream, learner "
          f"{status['env_steps']} steps in {status['iteration']} updates, {account['pending']} pending; "
          f"{account['moved_at_audit']['taken']} batches left in inboxes; dropped (chunks, steps) {dropped}, "
          f"learner saw {status.get('agent_chunks_dropped')}; stored but lost {lost}")
    return {"status": status, "dropped": dropped, "lost": lost, "chunks": len(account["chunks"])}
