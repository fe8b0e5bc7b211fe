"""The launcher's child processes: how each is started (its environment, its log, its folder),
when a crashed one is restarted (:func:`restart_delay`), and the tail of its log for the error
that says why it ended."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from surreal_redis.launcher.preload import Preloaded
from surreal_redis.runtime import child_env, die_with_parent, niced

log = logging.getLogger(__name__)

CLI = [sys.executable, "-m", "surreal_redis.cli"]  # how every child's command line starts
RESTART_DELAY_S = 1.0  # before the first restart of a child; doubles with each restart
RESTART_DELAY_CAP_S = 30.0

def restart_delay(restart: int) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...) of a child: 1, 2, 4, ... 30."""
    return min(RESTART_DELAY_CAP_S, RESTART_DELAY_S * 2 ** max(0, restart - 1))


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a child's log ('(no log)' when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Child:
    """One child process of the launch and how to (re)start it. ``restart_at``: monotonic time
    of a scheduled restart (None: none scheduled); ``preloaded``: a process started ahead that
    its first start takes over (:mod:`.preload`)."""

    name: str
    args: list[str]
    log_path: Path
    max_restarts: int
    process: subprocess.Popen | None = None
    restarts: int = 0
    restart_at: float | None = None
    preloaded: Preloaded | None = None
    nice: int = 0  # started this much nicer (agents, evals: agent.nice; their imports yield to the learner's)

    def start(self) -> None:
        """Start the process (not blocking), appending its output to ``log_path``, in that folder."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        preloaded, self.preloaded = self.preloaded, None
        if preloaded is not None and self.args[:len(CLI)] == CLI:
            self.process = preloaded.hand_over(self.args[len(CLI):], self.log_path, self.log_path.parent)
            if self.process is not None:
                self.restart_at = None
                return
        elif preloaded is not None:
            preloaded.discard()
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=self.log_path.parent, preexec_fn=niced(self.nice, die_with_parent),
                                            env=child_env(actor=self.name != "learner", nice=self.nice))
        self.restart_at = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def started(self) -> subprocess.Popen:
        """The process :meth:`start` made (RuntimeError for a child never started or given up)."""
        if self.process is None:
            raise RuntimeError(f"{self.name} has no process")
        return self.process

    @property
    def gone(self) -> bool:
        """Exited for good: not running and no restart scheduled."""
        return self.process is None and self.restart_at is None

    def schedule_restart(self) -> float:
        """Count one more restart and schedule it; returns its delay in seconds."""
        self.restarts += 1
        delay = restart_delay(self.restarts)
        self.restart_at = time.monotonic() + delay
        return delay

    def check(self, stopping: Callable[[], bool]) -> None:
        """One look at a child other than the learner: start a restart that is due; a child that
        exited is restarted after :func:`restart_delay` while restarts are left, else given up
        (``process`` None). An exit 0 while ``stopping()`` is a clean stop, not a crash."""
        if self.restart_at is not None:
            if time.monotonic() >= self.restart_at:
                self.start()
            return
        if self.alive or self.process is None:
            return
        code = self.process.returncode
        if code == 0 and stopping():
            return  # it saw the run's stop request before the launcher did: a clean stop, not a crash
        log.error("%s exited with code %d. Last log lines:\n%s", self.name, code, log_tail(self.log_path))
        if self.restarts < self.max_restarts:
            delay = self.schedule_restart()
            log.info("restarting %s in %.0fs (restart %d of %d)", self.name, delay, self.restarts, self.max_restarts)
        else:
            log.error("%s is not restarted (restarts used: %d of %d)", self.name, self.restarts, self.max_restarts)
            self.process = None


def reap(children: list[Child], grace_s: float) -> None:
    """Wait for ``children`` (already sent SIGTERM) to exit, SIGKILL for those still alive
    ``grace_s`` seconds from now; blocks until all are gone."""
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.started.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs; killing it", child.name, grace_s)
            child.started.kill()
            child.started.wait()
