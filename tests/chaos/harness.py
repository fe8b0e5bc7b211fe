"""What the chaos runs share: the fault record, the launch's children by role, waits that fail
fast when the launch exits, reads that may meet an outage the test made, and the end of a run
(stop, exit code, every entry left in the streams)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from surreal_redis.connection import RedisSettings, connect, stream_entries
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.wire import Origin, entry_origin
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.scripts import Scripts

CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
RUN, AGENTS = "smoke", 2
PROBE = RedisSettings(socket_timeout=1.0, connect_timeout=1.0)
LONG = os.environ.get("SURREAL_LONG_TESTS") == "1"


def chaos_seed(default: int) -> int:
    """``SURREAL_CHAOS_SEED`` when set (a schedule to replay), else ``default``."""
    return int(os.environ.get("SURREAL_CHAOS_SEED", default))


@dataclass(frozen=True)
class Fault:
    """``kind`` at ``after_s`` seconds past the previous fault's end, lasting ``duration_s``
    (the outage, the freeze, the lowered limit); ``agent``: the agent killed; ``target``: which
    Cluster primary (an index into the keys whose primaries the run picks from)."""

    kind: str
    after_s: float
    duration_s: float = 0.0
    agent: int = 0
    target: int = 0


def launch_overrides(root: Path, schedule: list[Fault]) -> list[str]:
    """The smoke launch's overrides for a chaos run: no stop but ``surreal-redis stop``, no MLflow,
    and as many restarts as the schedule kills the learner and the most-killed agent, no more (a
    crash an outage caused would use them up and fail the run)."""
    kills = Counter("learner" if f.kind == "learner_kill" else f"agent-{f.agent}"
                    for f in schedule if f.kind in ("learner_kill", "agent_kill"))
    return [f"experiment.root={root}", "stop.max_env_steps=null", "stop.max_seconds=null", "tracking.enabled=false",
            f"learner.max_restarts={kills['learner']}",
            f"agent.max_restarts={max(kills[f'agent-{a}'] for a in range(AGENTS))}", "agent.heartbeat_ttl_s=10"]


class FaultLog:
    """What a chaos run did: faults ``injected`` by kind, the learner pids it killed, and a log of
    timed lines (printed as they come)."""

    def __init__(self, launch: subprocess.Popen) -> None:
        self.launch = launch
        self.injected: Counter = Counter()
        self.killed_learners: set[int] = set()
        self.log: list[str] = []
        self.started = time.monotonic()

    def note(self, text: str) -> None:
        line = f"t={time.monotonic() - self.started:6.1f}s {text}"
        self.log.append(line)
        print(line, flush=True)

    def kill_process(self, fault: Fault) -> None:
        """kill -9 the learner (``learner_kill``) or agent ``fault.agent`` once it is running."""
        role = "learner" if fault.kind == "learner_kill" else f"agent-{fault.agent}"
        pid = wait_for(lambda: children(self.launch.pid).get(role), 90, f"{role} to be running", self.launch)
        os.kill(pid, signal.SIGKILL)
        if role == "learner":
            self.killed_learners.add(pid)
        self.note(f"{role} (pid {pid}) kill -9")


def children(pid: int) -> dict[str, int]:
    """The launch's children by role: ``learner``, ``agent-<id>``, ``eval`` (live ones only)."""
    found: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            try:
                argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state == "Z":
                continue
            words = [a.decode() for a in argv]
            if "learner" in words:
                found["learner"] = kid
            elif "agent" in words:
                found[f"agent-{words[words.index('--id') + 1]}"] = kid
            elif "eval" in words:
                found.setdefault("eval", kid)
    return found


def wait_for(condition, timeout: float, what: str, launch: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert launch.poll() is None, f"launch exited ({launch.returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.5)


def quietly(read, default=None):
    """A Redis read that may meet the outage the test made (a cluster without a primary for a
    slot included)."""
    try:
        return read()
    except OUTAGE_ERRORS:
        return default
    except Exception as exc:  # a restarted Redis still loading its AOF answers LOADING
        if "LOADING" in str(exc):
            return default
        raise


def all_alive(launch: subprocess.Popen, control: RunControl, client) -> dict | None:
    """The learner's status when every process runs and reports, else None."""
    running = children(launch.pid)
    if set(running) != {"learner", "eval", *(f"agent-{a}" for a in range(AGENTS))}:
        return None
    status = quietly(control.learner_alive, {})
    agents = quietly(lambda: [a for a in read_agents(client, RUN, 10) if not a.stale], [])
    live = {int(a.agent_id) for a in agents if a.pid in running.values()}
    if not status or status.get("pid") != running["learner"] or live != set(range(AGENTS)):
        return None
    return status


def recover_and_stop(launch: subprocess.Popen, control: RunControl, client, url: str, cwd: Path,
                     out_path: Path, note) -> tuple[bool, str]:
    """After the last fault: wait for every process to be back and the learner to make two more
    updates, then ``surreal-redis stop``. Returns (exit 0 and "finished" printed, what happened)."""
    iteration = wait_for(lambda: all_alive(launch, control, client), 180, "every process alive", launch)["iteration"]
    wait_for(lambda: (all_alive(launch, control, client) or {}).get("iteration", 0) >= iteration + 2, 180,
             "two more updates after the last fault", launch)
    note("all processes alive and training; stopping the run")
    stop = subprocess.run([*CLI, "stop", "--run", RUN, "--redis-url", url], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    code = launch.wait(timeout=180)
    text = out_path.read_text()
    finished = f"exit {code}, " + ("'finished' printed" if "finished" in text else "no 'finished' line")
    return code == 0 and f"run '{RUN}' finished" in text, finished


def stream_origins(url: str, shards: int = 1) -> list[Origin]:
    """Origins of every entry left in the run's streams, after moving what the inboxes hold."""
    client = connect(url)
    try:
        scripts = Scripts(client)
        origins = []
        for shard in range(shards):
            keys = RunKeys(RUN).shard(shard)
            while move_inbox(scripts, keys, 256).left:
                pass
            start = b"-"
            while entries := stream_entries(client.xrange(keys.exp, min=start, count=1000)):
                origins += [entry_origin(fields) for _, fields in entries]
                start = b"(" + entries[-1][0]
        return [o for o in origins if o is not None]
    finally:
        client.close()
