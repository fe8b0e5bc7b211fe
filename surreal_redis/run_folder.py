"""The layout of one run's folder on disk (``experiment.root / experiment.name``, listed in
docs/usage.md), as :mod:`surreal_redis.keys` is the layout of its keys in Redis: nothing else
builds these paths.

It also owns the folder's life around a launch: the lock a live launcher holds (``flock`` on
``launch.lock``, which the kernel drops with a dead process), taking a folder that holds an
earlier run (moving it aside with ``fresh``), and the announcement in ``hub.json`` (run name,
Redis URL, the launcher's pid and its start time), so a run can be reached by name alone. An
announcement whose launcher was killed is stale: its pid no longer runs, or runs another process
(a different start time).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from surreal_redis.checkpoint import CheckpointConfig, CheckpointManager

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
MLFLOW_STORE_FILE = "mlflow.db"
MLFLOW_ARTIFACTS_DIR = "mlartifacts"
MLFLOW_RUN_ID_FILE = "mlflow_run_id"
CURVES_FILE = "curves.png"
HUB_FILE = "hub.json"
LOCK_FILE = "launch.lock"  # flock'ed by the live launcher of the folder; it moves with a --fresh archive
DEFAULT_RUNS_DIR = Path("runs")  # experiment.root's default, from the folder a launch ran in


@dataclass(frozen=True)
class LocalRun:
    """A run a live ``launch`` on this machine announced in its experiment folder."""

    name: str
    url: str
    pid: int
    folder: Path


class FolderLive(RuntimeError):
    """A live launcher holds the folder; ``who`` says which and how it shows (its pid, when known)."""

    def __init__(self, who: str) -> None:
        super().__init__(who)
        self.who = who


class EarlierRun(RuntimeError):
    """The folder holds an earlier run: ``found`` lists what shows it (``checkpoints/``,
    ``mlflow_run_id``...), ``archive`` is where a ``fresh`` claim would move it."""

    def __init__(self, found: list[str], archive: Path) -> None:
        super().__init__(f"holds a run ({', '.join(found)})")
        self.found, self.archive = found, archive


@dataclass(frozen=True)
class RunFolder:
    """Every path of one run's folder, and what a launch does with the folder (claim, lock,
    announce). Building one touches nothing on disk."""

    path: Path

    @classmethod
    def holding(cls, checkpoint: Path) -> RunFolder:
        """The run folder of a checkpoint file (``<run>/checkpoints/ckpt-*.pt``)."""
        return cls(Path(checkpoint).parent.parent)

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def logs_dir(self) -> Path:
        return self.path / LOGS_DIR

    def log_file(self, child: str) -> Path:
        """``logs/<child>.log``: ``child`` is a process name such as ``learner`` or ``agent-3``."""
        return self.logs_dir / f"{child}.log"

    @property
    def mlflow_store(self) -> Path:
        return self.path / MLFLOW_STORE_FILE

    @property
    def mlflow_artifacts(self) -> Path:
        return self.path / MLFLOW_ARTIFACTS_DIR

    @property
    def mlflow_run_id_file(self) -> Path:
        return self.path / MLFLOW_RUN_ID_FILE

    @property
    def curves(self) -> Path:
        return self.path / CURVES_FILE

    @property
    def hub_file(self) -> Path:
        return self.path / HUB_FILE

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    def checkpoints(self, config: CheckpointConfig) -> CheckpointManager:
        """The run's checkpoint manager (``checkpoints/``), kept as ``config`` says."""
        return CheckpointManager(self.checkpoints_dir, config)

    # ---------------------------------------------------------------- an earlier run
    def earlier_run(self) -> list[str]:
        """What in the folder shows an earlier run (a config alone does not)."""
        found = [f"{path.name}/" for path in (self.checkpoints_dir, self.logs_dir) if any(path.glob("*"))]
        return found + [path.name for path in (self.mlflow_run_id_file,) if path.exists()]

    def claim(self, fresh: bool) -> Path | None:
        """Make the folder free for a new run: nothing to do when it holds no earlier run; with
        ``fresh`` the earlier run is moved to ``<folder>.<time>`` (returned); else EarlierRun."""
        found = self.earlier_run()
        if not found:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        archive = self.path.with_name(f"{self.path.name}.{stamp}")
        if not fresh:
            raise EarlierRun(found, archive)
        suffix = 1
        while archive.exists():  # a second one in the same second
            suffix += 1
            archive = archive.with_name(f"{self.path.name}.{stamp}-{suffix}")
        self.path.rename(archive)
        log.info("moved the earlier run in %s to %s", self.path, archive)
        return archive

    # ---------------------------------------------------------------- the lock
    def lock(self) -> FolderLock:
        """Hold :data:`LOCK_FILE` (creating it and the folder) until the lock is released or this
        process ends. FolderLive when a live launcher holds it, or the folder's hub.json names a
        launcher that still runs (one that took no lock)."""
        announced = self.announcement()
        if announced is not None and announced.pid != os.getpid():
            raise FolderLive(f"its launcher (pid {announced.pid}) announced it in {self.hub_file}")
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _flock_holder(fd) or self._announced_pid()
            os.close(fd)
            raise FolderLive(f"its launcher{f' (pid {pid})' if pid else ''} holds {self.lock_file}") from None
        return FolderLock(fd)

    # ---------------------------------------------------------------- the announcement
    def announce(self, run: str, url: str) -> Path:
        """Announce this process as the live launcher of ``run`` on ``url`` (atomically)."""
        tmp = self.hub_file.with_suffix(".tmp")
        pid = os.getpid()
        tmp.write_text(json.dumps({"run": run, "url": url, "pid": pid, "pid_start": _process_start(pid),
                                   "started": time.time()}))
        os.replace(tmp, self.hub_file)
        return self.hub_file

    def withdraw(self) -> None:
        """Withdraw :meth:`announce`'s announcement, if it is still this process's."""
        try:
            owner = json.loads(self.hub_file.read_text()).get("pid")
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("left %s alone: unreadable (%s)", self.hub_file, exc)
            return
        if owner == os.getpid():  # else a later launch of the run took the folder over: its file
            self.hub_file.unlink(missing_ok=True)

    def announcement(self) -> LocalRun | None:
        """The run announced in the folder, if its launcher still runs (None for a stale or
        unreadable file, or none)."""
        try:
            data = json.loads(self.hub_file.read_text())
            run = LocalRun(str(data["run"]), str(data["url"]), int(data["pid"]), self.path)
            start = data.get("pid_start")
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return run if _running(run.pid, start) else None

    def _announced_pid(self) -> int | None:
        """The pid in the folder's hub.json, if it is readable (running or not)."""
        try:
            return int(json.loads(self.hub_file.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


class FolderLock:
    """A launcher's flock on its folder's :data:`LOCK_FILE`, held until :meth:`release`."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only fd drops the flock
            self._fd = None


def live_local_runs(root: Path = DEFAULT_RUNS_DIR) -> list[LocalRun]:
    """The runs under ``root`` whose launcher still runs (stale and unreadable files are skipped)."""
    found = (RunFolder(path.parent).announcement() for path in sorted(Path(root).glob(f"*/{HUB_FILE}")))
    return [run for run in found if run is not None]


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks (/proc/PID/stat field 22); None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # after the command name, which may hold spaces


def _running(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return start is None or _process_start(pid) in (None, start)


def _flock_holder(fd: int) -> int | None:
    """The pid holding a flock on the file open as ``fd``, from /proc/locks (None without it)."""
    stat = os.fstat(fd)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 8725 fe:00:2146904 0 EOF"
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
            return int(fields[4])
    return None
