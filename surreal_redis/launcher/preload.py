"""The learner's process started ahead of the rest of a launch.

The learner's first update waits for its imports (torch and the rest: 2-3 s of CPU on 2 cores),
which used to start only once the launcher had loaded itself, claimed the folder and started
Redis (about 0.9 s). ``launch`` now starts ``python -m surreal_redis.cli.preload learner``
first thing (:mod:`surreal_redis.cli.preload`, the child's side): it imports what the learner
needs and blocks on one line of stdin, the JSON object ``{"argv", "log", "cwd"}`` that
:meth:`Preloaded.hand_over` writes once the run is ready; it then writes to ``log``, runs in
``cwd`` and is ``surreal-redis ARGV`` from there. Stdin ending first (the launch was refused or
failed) ends it with nothing done.

A preloaded process is used once, for the learner's first start; a restart starts afresh.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
from pathlib import Path

from surreal_redis.runtime import child_env, die_with_parent

log = logging.getLogger(__name__)

CHILD = "surreal_redis.cli.preload"  # the preloaded process's module (``python -m``)


class Preloaded:
    """The launcher's side: a process importing one role's modules, waiting for its command."""

    def __init__(self, role: str, process: subprocess.Popen) -> None:
        self.role, self.process = role, process
        self.used = False  # handed over: the process is the role's now

    @classmethod
    def start(cls, role: str) -> Preloaded | None:
        """Start a process preloading ``role`` (not blocking); None (logged) when it cannot start."""
        try:
            process = subprocess.Popen([sys.executable, "-m", CHILD, role], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       preexec_fn=die_with_parent, env=child_env(actor=False))
        except OSError as exc:
            log.warning("the %s's process was not started ahead (%s); it starts with the run", role, exc)
            return None
        return cls(role, process)

    def hand_over(self, argv: list[str], log_path: Path, cwd: Path) -> subprocess.Popen | None:
        """Tell the process to run ``surreal-redis ARGV``, logging to ``log_path`` in ``cwd``;
        returns it, or None when it is gone (the caller starts the role afresh; its log says why)."""
        assert self.process.stdin is not None and not self.used
        told = json.dumps({"argv": argv, "log": str(log_path), "cwd": str(cwd)})
        try:
            if self.process.poll() is not None:
                raise BrokenPipeError(f"exit code {self.process.returncode}")
            self.process.stdin.write(f"{told}\n".encode())
            self.process.stdin.close()
        except OSError as exc:
            log.warning("the %s's process started ahead is gone (%s); starting another", self.role, exc)
            self.discard()
            return None
        self.used = True
        return self.process

    def discard(self) -> None:
        """End it unless it was handed over (killed: it has done nothing but import)."""
        if self.used:
            return
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        self.process.kill()
        self.process.wait()
