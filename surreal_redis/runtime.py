"""What every long-running process shares: signal handling (the first SIGINT/SIGTERM asks for a
clean stop, the second exits at once), logging setup, and how children start (priority,
environment, :func:`die_with_parent`). The run's state in Redis is in
:mod:`surreal_redis.hub.run.control`."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""For agents and evals: they act on a few observations at a time, one process per core, and a
BLAS thread pool per process (numpy's OpenBLAS starts one per core) only makes them fight. Read
when numpy is first imported; a user's own setting wins."""


def process_started_at() -> float:
    """Wall-clock time this process started (Linux: from ``/proc``; elsewhere, or if unreadable,
    now): a stop requested after it is one this process must honour."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime_s + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


NICE_APPLIED = "SURREAL_REDIS_NICE_APPLIED"
"""Set by ``launch`` in the environment of a child it started already this much nicer (its
imports then yield to the learner's from the start): :func:`lower_priority` takes it off."""


def lower_priority(increment: int) -> None:
    """Make this process ``increment`` nicer (0: unchanged), less what ``launch`` applied when it
    started it (:data:`NICE_APPLIED`); the scheduler then favours the processes that kept
    priority 0 (the learner) when every core is busy."""
    increment -= int(os.environ.pop(NICE_APPLIED, "0") or 0)
    if increment > 0:
        os.nice(increment)
        log.info("CPU priority lowered by %d (nice %d)", increment, os.getpriority(os.PRIO_PROCESS, 0))


def lower_thread_priority(increment: int) -> bool:
    """Make the calling thread alone ``increment`` nicer (Linux keeps a nice value per thread):
    work that may wait (a start-up ahead of need) yields to every other process while the
    process's other threads keep their priority, which an unprivileged process could not raise
    again. False (nothing changed) on other systems."""
    if not sys.platform.startswith("linux") or not increment:
        return False
    thread = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + increment))
    return True


INTERRUPTED_EXIT = 130
"""The exit code of a process stopped by a signal (the shell's 128 + SIGINT), for Ctrl-C and
SIGTERM alike, so scripts tell an interrupted run from a finished one (0) or a failed one (1)."""


# glibc keeps freed memory in per-thread arenas and above its trim threshold, costing hundreds of
# MiB with torch in every process. A fixed trim threshold also fixes glibc's mmap threshold at
# 128 KiB, so every larger temporary (an Atari frame stack, a learner batch) would be mapped and
# unmapped per call, at the cost of page faults; at 16 MiB they come from the heap and are reused.
# A user's own setting wins.
CHILD_MALLOC = {"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "1048576",
                "MALLOC_MMAP_THRESHOLD_": "16777216"}


def die_with_parent() -> None:
    """preexec_fn for child processes: Linux sends the child SIGTERM when the process that started
    it dies, and the child gets its own process group, so a terminal's Ctrl-C reaches only the
    parent, which stops its children in order."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # no glibc (not Linux): children are still stopped by the parent's orderly shutdown
    os.setpgrp()


def child_env(actor: bool = False, nice: int = 0) -> dict[str, str]:
    """The environment of the launcher's children: this process's, plus :data:`CHILD_MALLOC` and
    for agents and evals (``actor``) one BLAS thread (``runtime.ONE_BLAS_THREAD``); a user's own
    setting wins. ``nice``: what :func:`niced` applies at the child's start (:data:`NICE_APPLIED`)."""
    applied = {NICE_APPLIED: str(nice)} if nice else {}
    return {**CHILD_MALLOC, **(ONE_BLAS_THREAD if actor else {}), **os.environ, **applied}


def niced(nice: int, preexec: Callable[[], None]) -> Callable[[], None]:
    """A ``preexec_fn`` running ``preexec`` and then making the child ``nice`` nicer."""

    def start() -> None:
        preexec()
        if nice:
            os.nice(nice)

    return start


def _handle_stop_signals(handler: Callable[[int, FrameType | None], object] | signal.Handlers) -> None:
    """SIGINT and SIGTERM to ``handler``; only the main thread may set handlers (elsewhere: none)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


class StopFlag:
    """Set by the first SIGINT/SIGTERM (or by code); the second signal exits immediately with
    code :data:`INTERRUPTED_EXIT`, after logging one line that ends with what the callback given
    to :meth:`on_second_signal` reports (what is lost by not stopping cleanly).
    ``wait(timeout)`` sleeps but wakes as soon as a stop is requested."""

    def __init__(self, install_handlers: bool = True) -> None:
        self._event = threading.Event()
        self.reason = ""
        self._second_signal_report: Callable[[str], str] | None = None
        self._signalled = False  # a stop set by code (max steps, the run's control state) is not a first signal
        if install_handlers:
            _handle_stop_signals(self._on_signal)

    def on_second_signal(self, report: Callable[[str], str]) -> None:
        """``report(signal name)`` runs in the signal handler before the exit: it must not block
        (no lock the interrupted code may hold) and returns one sentence for the log line."""
        self._second_signal_report = report

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._signalled:
            said = ""
            if self._second_signal_report is not None:
                try:
                    said = f"; {self._second_signal_report(name)}"
                except Exception:  # the exit must happen all the same
                    log.exception("could not say what the second %s leaves unsaved", name)
            log.warning("second %s: exiting now%s", name, said)
            os._exit(INTERRUPTED_EXIT)
        self._signalled = True
        self.set(f"signal {name}")

    def finish(self) -> None:
        """The process's work is done and its exit code chosen: SIGINT and SIGTERM are ignored
        from now on. The interpreter's shutdown puts a Python handler back to the default action,
        so a late second Ctrl-C would otherwise end the process killed by the signal, not with
        its code."""
        _handle_stop_signals(signal.SIG_IGN)

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            log.info("stopping: %s", reason)
            self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


def setup_logging(level: str = "INFO", logfile: Path | None = None) -> None:
    """Root logging to stderr (and ``logfile`` when given) with process-identifying format."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(logfile))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s")
    for noisy in ("mlflow", "alembic", "urllib3", "git"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
