"""``surreal-redis launch``: one experiment on this machine.

Starts an embedded Redis when no URL is given, then the learner, N agents and one eval as child
processes. Each child logs to ``<experiment>/logs/<name>.log`` and runs in that folder, so files
that libraries drop into their working directory (MuJoCo's ``MUJOCO_LOG.TXT``) stay with the run.
The launcher shows progress and supervises:

- a crashed agent or eval is restarted, up to ``agent.max_restarts`` times, with backoff;
- a crashed learner is restarted from its latest checkpoint, up to ``learner.max_restarts`` times,
  with backoff. It reads under the same consumer name (``hub.receiver.consumer`` of the same
  config file), so what it had read but not stored is still pending for it. The run fails once
  the restarts are used up;
- a Redis outage is ridden out like the children ride it out, and a Redis that came back empty
  gets the run's config and control state again;
- everything stops cleanly on Ctrl-C, on ``surreal-redis stop``, or when the learner reports that
  a stop condition was met;
- then, unless it was Ctrl-C or a failure, a final eval scores the learner's final checkpoint
  (``eval.final_episodes`` episodes within ``eval.final_max_s`` seconds, in a child process) into the
  best-k checkpoints and the summary. A Ctrl-C during it ends it with nothing recorded.

While it lives, the launcher announces the run in ``<experiment>/hub.json`` (its Redis URL), so
``status`` and ``stop`` find it by name (:func:`surreal_redis.status.find_run`), and holds an
exclusive lock (``flock``) on ``<experiment>/launch.lock``.

A new run never shares an experiment folder with an earlier one. Without ``--resume`` the launch
is refused, unless ``fresh`` asks to move the earlier run aside first. A live run is never
touched: before anything is moved or deleted, a launch is refused when the folder's lock is held
or its hub.json names a launcher that still runs (this host), or when the run's learner reports
in a shared Redis (any host).

Exit codes (:meth:`Launcher.run`): 0 finished (a stop condition, ``surreal-redis stop``), 1
failed, 130 (:data:`INTERRUPTED_EXIT`) interrupted by SIGINT or SIGTERM. A second signal exits
130 at once, saying which updates were not saved; the learner's MLflow run is then marked KILLED
by its tracking process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from surreal_redis.checkpoint import CheckpointError, CheckpointManager
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import RedisClient, RedisSettings, connect
from surreal_redis.embedded import EmbeddedRedis, die_with_parent
from surreal_redis.hub.params import ParameterClient
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.learner.metrics import use_summary
from surreal_redis.outage import OUTAGE_ERRORS, OutageGuard
from surreal_redis.plots import CURVES_FILE
from surreal_redis.runtime import INTERRUPTED_EXIT, ONE_BLAS_THREAD, StopFlag
from surreal_redis.status import HUB_FILE, live_local_runs, remove_hub_file, write_hub_file

log = logging.getLogger(__name__)

STOP_GRACE_S = 60.0  # the learner writes a final checkpoint and closes its MLflow run, which opens in the
# background and may still be opening when a run stops early (tens of seconds on a busy 2-core machine)
RESTART_DELAY_S = 1.0  # before the first restart of a child; doubles with each restart
RESTART_DELAY_CAP_S = 30.0
SUPERVISE_EVERY_S = 0.5
FINAL_EVAL_START_S = 60.0  # the final eval's process may take this long to start (torch, env) on top of
# eval.final_max_s of play before it is killed
LOCK_FILE = "launch.lock"  # flock'ed by the live launcher of the folder; it moves with a --fresh archive


class LaunchError(RuntimeError):
    """A launch refused before any process started; the message says what to do instead."""


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


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


def restart_delay(restart: int) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...) of a child: 1, 2, 4, ... 30."""
    return min(RESTART_DELAY_CAP_S, RESTART_DELAY_S * 2 ** max(0, restart - 1))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# glibc keeps freed memory in per-thread arenas and above its trim threshold; with torch in every
# process that cost ~260 MiB of PSS over a 4-agent Pong run (bench/memory.py). A fixed trim
# threshold also fixes glibc's mmap threshold at 128 KiB, so every larger temporary was mapped and
# unmapped per call; at 16 MiB they come from the heap and are reused. Agents: ~150 page faults
# per Pong act (an 84x84 frame stack is 450 KiB as float32), numpy 5.4-5.8 ms instead of 4.1-4.3.
# Learner: one SAC update on a HalfCheetah batch of 256, 25.8-31.4 ms instead of 18.4-18.8 (two
# cores shared with other work). A user's own setting wins.
CHILD_MALLOC = {"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "1048576",
                "MALLOC_MMAP_THRESHOLD_": "16777216"}


# Agents and evals get one BLAS thread (runtime.ONE_BLAS_THREAD). A user's setting wins.
ACTOR_ENV = dict(ONE_BLAS_THREAD)


def child_env(actor: bool = False) -> dict[str, str]:
    """The environment of the launcher's children: this process's, plus :data:`CHILD_MALLOC`
    (and :data:`ACTOR_ENV` for agents and evals)."""
    return {**CHILD_MALLOC, **(ACTOR_ENV if actor else {}), **os.environ}


@dataclass
class Child:
    """One child process of the launch and how to (re)start it. ``restart_at``: monotonic time
    of a scheduled restart (None: none scheduled)."""

    name: str
    args: list[str]
    log_path: Path
    max_restarts: int
    process: subprocess.Popen | None = None
    restarts: int = 0
    restart_at: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=self.log_path.parent, preexec_fn=die_with_parent,
                                            env=child_env(actor=self.name != "learner"))
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


class Launcher:
    """Runs one experiment; :meth:`run` blocks and returns the exit code (0 when the run ended
    cleanly: stop condition or stop request; 1 when it failed; :data:`INTERRUPTED_EXIT` when a
    signal stopped it). ``progress`` receives one human-readable line every couple of seconds, and
    the summary at the end.

    ``fresh``: an experiment folder that holds an earlier run is moved to ``<folder>.<time>``
    instead of refusing the launch. Raises :class:`LaunchError` (before anything starts) for a
    folder that holds an earlier run, a run that is live (its launcher or its learner), or an
    unreachable Redis; ``ValueError`` naming the setting for settings a launch cannot run with.
    """

    def __init__(self, config: ExperimentConfig, stop: StopFlag, resume: str | None = None,
                 resume_from: Path | None = None, progress: Callable[[str], None] | None = None,
                 log_level: str = "INFO", fresh: bool = False) -> None:
        if config.agent.num_agents < 1:
            raise ValueError(f"launch needs at least one agent, got agent.num_agents={config.agent.num_agents}")
        if fresh and resume is not None:
            raise ValueError("--fresh starts the run over, --resume continues it: choose one")
        self.config, self.stop, self.resume, self.resume_from = config, stop, resume, resume_from
        self.fresh = fresh
        self.progress = progress or (lambda line: log.info("%s", line))
        self.log_level = log_level
        self.dir = config.experiment_dir.resolve()
        self.server: EmbeddedRedis | None = None
        self.children: list[Child] = []
        self.url = ""
        self.ending = ""  # why the run ended, for the summary
        self.signalled = ""  # the signal that ended the run (not one that came during the final eval)
        self.final_eval = ""  # the summary's line on it
        self._lock: int | None = None  # the fd holding LOCK_FILE while this launcher lives
        self._last_status: dict = {}  # the learner's last report the progress line read

    # ---------------------------------------------------------------- set-up
    def _command(self, *role: str) -> list[str]:
        return [sys.executable, "-m", "surreal_redis.cli", "--log-level", self.log_level, *role,
                "--config", str(self.dir / "config.yaml"), "--redis-url", self.url]

    def _earlier_run(self) -> list[str]:
        """What in the experiment folder shows an earlier run."""
        found = [f"{name}/" for name in ("checkpoints", "logs") if any((self.dir / name).glob("*"))]
        return found + [name for name in ("mlflow_run_id",) if (self.dir / name).exists()]

    def _live(self, who: str) -> LaunchError:
        run = self.config.run
        return LaunchError(f"run {run!r} is live: {who}; nothing was moved or deleted. Stop it first "
                           f"(surreal-redis stop --run {run}, or Ctrl-C its launch), or choose another "
                           f"experiment.name (-o experiment.name=NEW)")

    def _announced_pid(self) -> int | None:
        """The pid in the folder's hub.json, if it is readable."""
        try:
            return int(json.loads((self.dir / HUB_FILE).read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _lock_folder(self) -> None:
        """Hold :data:`LOCK_FILE` of the experiment folder (creating both) for this launcher's
        life; LaunchError when a live launcher holds it, or the folder's hub.json names a launcher
        that still runs (one that took no lock). The kernel drops a dead process's lock."""
        announced = [run for run in live_local_runs(self.dir.parent) if run.folder.resolve() == self.dir]
        if announced and announced[0].pid != os.getpid():
            raise self._live(f"its launcher (pid {announced[0].pid}) announced it in {self.dir / HUB_FILE}")
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _flock_holder(fd) or self._announced_pid()
            os.close(fd)
            raise self._live(f"its launcher{f' (pid {pid})' if pid else ''} holds {path}") from None
        self._unlock()  # the lock of the folder --fresh moved aside
        self._lock = fd

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the only fd drops the flock
            self._lock = None

    def _refuse_live_learner(self, client: RedisClient) -> None:
        alive = RunControl(client, self.config.run).learner_alive()
        if alive:
            raise self._live(f"its learner (pid {alive.get('pid')}) reported {time.time() - float(alive['time']):.0f}s "
                             f"ago on {self.url}")

    def _connect(self) -> RedisClient:
        client = connect(self.url, self.config.redis.settings())
        try:
            client.ping()
        except redis.RedisError as exc:
            raise LaunchError(f"cannot reach Redis at {self.url}: {exc}") from exc
        return client

    def _claim_folder(self) -> None:
        """Refuse (or with ``fresh``, move aside) a folder holding an earlier run, unless resuming."""
        found = self._earlier_run()
        if not found or self.resume is not None:
            return
        archive = self.dir.with_name(f"{self.dir.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        if not self.fresh:
            raise LaunchError(
                f"{self.dir} already holds a run ({', '.join(found)}). Continue it with --resume, start over "
                f"with --fresh (moves the earlier run to {archive.name}), or choose another experiment.name "
                f"(-o experiment.name=NEW)")
        suffix = 1
        while archive.exists():
            suffix += 1
            archive = archive.with_name(f"{self.dir.name}.{time.strftime('%Y%m%d-%H%M%S')}-{suffix}")
        self.dir.rename(archive)
        log.info("moved the earlier run in %s to %s", self.dir, archive)

    def _prepare(self) -> RedisClient:
        cfg = self.config
        # A live run first (this host: the folder's lock; any host: its learner in a shared
        # Redis), before --fresh moves its folder or the run's keys are dropped.
        self._lock_folder()
        client = None
        if cfg.redis.url:
            self.url = cfg.redis.url
            client = self._connect()
            self._refuse_live_learner(client)
        self._claim_folder()
        if not self.dir.exists():  # moved aside: lock the new folder (the old lock went with it)
            self._lock_folder()
        # Children run in logs/: every path they get must be absolute.
        absolute = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, root=str(self.dir.parent)))
        (self.dir / "config.yaml").write_text(absolute.to_yaml())
        if client is None:
            self.server = EmbeddedRedis(maxmemory=cfg.redis.maxmemory).start()
            self.url = self.server.url
            client = self._connect()
        control = RunControl(client, cfg.run)
        self._refuse_live_learner(client)  # one that started since the first look
        if self.resume is None:
            dropped = control.drop()
            if dropped:
                log.info("removed %d keys left by an earlier run named %r", dropped, cfg.run)
        self._write_run_state(control)
        write_hub_file(self.dir, cfg.run, self.url)
        return client

    def _write_run_state(self, control: RunControl) -> None:
        """The config for ``--run`` processes and the ``running`` state (again after Redis came back empty)."""
        control.store_config(self.config.to_yaml())
        control.start()

    def _learner_command(self) -> list[str]:
        """The learner, resumed from this run's latest checkpoint once there is one (a restart),
        else as the launch was asked to start it."""
        command = self._command("learner")
        if CheckpointManager(self.dir / "checkpoints", self.config.checkpoint).iterations():
            return command + ["--resume", "latest"]
        if self.resume is not None:
            command += ["--resume", self.resume]
            if self.resume_from is not None:
                command += ["--resume-from", str(self.resume_from.resolve())]
        return command

    def _children(self) -> list[Child]:
        logs = self.dir / "logs"
        children = [Child("learner", self._learner_command(), logs / "learner.log", self.config.learner.max_restarts)]
        agent_restarts = self.config.agent.max_restarts if self.config.agent.restart_on_crash else 0
        for agent_id in range(self.config.agent.num_agents):
            children.append(Child(f"agent-{agent_id}", self._command("agent", "--id", str(agent_id)),
                                  logs / f"agent-{agent_id}.log", agent_restarts))
        if self.config.eval.enabled:
            children.append(Child("eval-0", self._command("eval"), logs / "eval-0.log", agent_restarts))
        return children

    # ---------------------------------------------------------------- running
    def run(self) -> int:
        try:
            client = self._prepare()
        except BaseException:
            self._stop_server()
            self._unlock()
            raise
        self.stop.on_second_signal(lambda name: self._not_saved(self._learner_report()))
        code = 1
        try:
            try:
                code = self._supervise(client)
            finally:
                self._shutdown(client)
            self.signalled = self.stop.reason if self.stop.reason.startswith("signal") else ""
            self.final_eval = self._final_eval(client, code)
            self._summary(client, code)
        finally:
            remove_hub_file(self.dir)
            self._stop_server()
            self._unlock()
        return INTERRUPTED_EXIT if code == 0 and self.signalled else code

    def _learner_report(self) -> dict:
        """The learner's latest report, read on a connection of its own (the code a signal
        interrupted may hold the launcher's), within a second; else the last one the progress
        line read."""
        try:
            client = connect(self.url, RedisSettings(socket_timeout=1.0, connect_timeout=1.0))
            try:
                return RunControl(client, self.config.run).learner_status() or self._last_status
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError) as exc:
            log.warning("the learner's last report is unreadable (%s); using the one from the progress line", exc)
            return self._last_status

    def _not_saved(self, status: dict) -> str:
        """For a second signal, which exits at once (the learner too, before its final
        checkpoint): what of the learner's work ``status`` (its last report) is not on disk.
        Reads the checkpoint folder only: it runs in the signal handler."""
        saved = CheckpointManager(self.dir / "checkpoints", self.config.checkpoint).iterations()
        latest = saved[-1] if saved else 0
        reported = int(status.get("iteration", 0))
        if not reported:
            said = "the learner reported no update (nothing to save)"
        elif reported <= latest:
            said = f"the learner's final checkpoint (update {latest}) is saved"
        elif not saved:
            said = f"no checkpoint is saved: updates 1-{reported} are lost"
        else:
            said = (f"the learner's final checkpoint is not saved: updates {latest + 1}-{reported} are lost "
                    f"(the latest checkpoint is update {latest})")
        if self.config.tracking.enabled:
            said += "; the MLflow run is marked KILLED once the learner is gone"
        return said

    def _supervise(self, client: RedisClient) -> int:
        control = RunControl(client, self.config.run)
        self.children = self._children()
        learner, others = self.children[0], self.children[1:]
        # Learner and agents start at once: agents import torch and build their envs while the
        # learner starts, then wait for its first parameters themselves (~3 s sooner to the first
        # update on 2 cores than starting them after that publish). Eval is not on that path: it
        # starts after the first publish, so its torch import does not compete with theirs (first
        # update 0.82x as late, 3 of 3 paired launches on 2 shared cores).
        evals = [child for child in others if child.name.startswith("eval-")]
        for child in self.children:
            if child not in evals:
                child.start()
        if not self._wait_for_parameters(client, learner):
            self.ending = self.ending or self.stop.reason
            return 0 if self.stop else 1  # interrupted while starting: not a failure
        for child in evals:
            child.start()
        guard = OutageGuard("launcher", self.stop)
        next_progress = 0.0
        last_line = ""
        while not self.stop.wait(SUPERVISE_EVERY_S):
            code = self._check_learner(client, learner)
            if code is not None:
                return code
            for child in others:
                self._check_child(child, control)
            if all(child.gone for child in others if child.name.startswith("agent-")):
                self.ending = "no agent left"
                log.error("every agent exited and none is restarted any more; stopping the run")
                return 1
            if self.server is not None and self.server.process is not None and self.server.process.poll() is not None:
                self.ending = "the embedded Redis died"
                log.error("the embedded redis-server exited with code %d; stopping the run. Its log:\n%s",
                          self.server.process.returncode, self.server.log_tail())
                return 1
            try:
                stopping, reason = control.stopping()
                if guard.failing:  # back after an outage, possibly empty: the run's state again
                    if control.stored_config() is None:
                        log.warning("Redis came back without the run's keys; writing its config and state again")
                        self._write_run_state(control)
                    guard.succeeded()
                if stopping:
                    self.ending = reason or "stop requested"
                    log.info("run stopping: %s", self.ending)
                    for child in others:  # nothing left for them to do: they stop while the learner finishes
                        if child.alive:
                            child.started.terminate()
                    return self._wait_learner(learner)
                if time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + 2.0
                    line = self._progress_line(client, learner)
                    if line != last_line:  # the learner reports every learner.metrics_every_s
                        self.progress(line)
                        last_line = line
            except OUTAGE_ERRORS as exc:
                guard.failed(exc)
        self.ending = self.stop.reason or "launcher stopped"
        return 0

    def _wait_for_parameters(self, client: RedisClient, learner: Child) -> bool:
        """Block until the learner published its first parameters; False when it exited first
        (its log tail is logged) or the launcher was stopped."""
        params = ParameterClient(client, self.config.run, self.config.hub.params_client)
        guard = OutageGuard("launcher", self.stop)
        while not self.stop:
            if learner.started.poll() is not None:
                self.ending = "the learner did not start"
                log.error("learner exited with code %d before publishing parameters. Last log lines:\n%s",
                          learner.started.returncode, log_tail(learner.log_path))
                self._note_learner_exit(client, learner)
                return False
            try:
                if params.fetch_info().version > 0:
                    guard.succeeded()
                    return True
            except OUTAGE_ERRORS as exc:
                guard.failed(exc)
                continue
            self.stop.wait(0.2)
        return False

    def _check_learner(self, client: RedisClient, learner: Child) -> int | None:
        """None while the run goes on; else its exit code (the learner finished, or crashed with
        no restart left). A crashed learner is restarted from its latest checkpoint."""
        if learner.restart_at is not None:
            if time.monotonic() >= learner.restart_at:
                learner.args = self._learner_command()
                resumed = "--resume" in learner.args
                log.info("restarting the learner (restart %d of %d)%s", learner.restarts, learner.max_restarts,
                         " from its latest checkpoint" if resumed else "")
                learner.start()
            return None
        code = learner.started.poll()
        if code is None:
            return None
        self._note_learner_exit(client, learner)
        if code == 0:
            try:
                stopping, reason = RunControl(client, self.config.run).stopping()
            except OUTAGE_ERRORS:
                stopping, reason = False, ""
            self.ending = reason if stopping and reason else "the learner finished"
            log.info("learner finished")
            return 0
        tail = log_tail(learner.log_path)
        if learner.restarts >= learner.max_restarts:
            self.ending = f"the learner crashed (exit code {code}, restarts used: {learner.restarts} of {learner.max_restarts})"
            log.error("learner crashed with exit code %d; stopping the run (restarts used: %d of %d). "
                      "Last log lines:\n%s", code, learner.restarts, learner.max_restarts, tail)
            return 1
        delay = learner.schedule_restart()
        log.error("learner crashed with exit code %d; restarting it in %.0fs (restart %d of %d). Last log lines:\n%s",
                  code, delay, learner.restarts, learner.max_restarts, tail)
        return None

    def _note_learner_exit(self, client: RedisClient, learner: Child) -> None:
        """Tell Redis the learner is gone, so a ``--resume`` right after is not refused (best effort)."""
        if learner.process is None or learner.process.returncode is None:
            return
        try:
            RunControl(client, self.config.run).mark_learner_exited(learner.process.pid, learner.process.returncode)
        except redis.RedisError as exc:
            log.debug("could not mark the learner as exited: %s", exc)

    def _check_child(self, child: Child, control: RunControl) -> None:
        if child.restart_at is not None:
            if time.monotonic() >= child.restart_at:
                child.start()
            return
        if child.alive or child.process is None:
            return
        code = child.process.returncode
        if code == 0 and self._stopping(control):
            return  # it saw the run's stop request before this loop did: a clean stop, not a crash
        log.error("%s exited with code %d. Last log lines:\n%s", child.name, code, log_tail(child.log_path))
        if child.restarts < child.max_restarts:
            delay = child.schedule_restart()
            log.info("restarting %s in %.0fs (restart %d of %d)", child.name, delay, child.restarts, child.max_restarts)
        else:
            log.error("%s is not restarted (restarts used: %d of %d)", child.name, child.restarts, child.max_restarts)
            child.process = None

    @staticmethod
    def _stopping(control: RunControl) -> bool:
        try:
            return control.stopping()[0]
        except OUTAGE_ERRORS:
            return False

    def _wait_learner(self, learner: Child) -> int:
        """After a stop request: the learner's exit code once it stopped (0 when it is not running)."""
        if not learner.alive:
            return 0 if learner.process is None or learner.process.returncode in (0, None) else 1
        try:
            learner.started.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("learner still running %.0fs after the stop request", STOP_GRACE_S)
            return 0
        return 0 if learner.started.returncode == 0 else 1

    def _progress_line(self, client: RedisClient, learner: Child) -> str:
        status = RunControl(client, self.config.run).learner_status()
        self._last_status = status
        agents = read_agents(client, self.config.run, self.config.agent.heartbeat_ttl_s, include_stale=False)
        restarting = "learner restarting | " if learner.restart_at is not None else ""
        if not status:
            return f"{restarting}waiting for the learner... agents {len(agents)}/{self.config.agent.num_agents}"
        return (f"{restarting}env steps {status['env_steps']} ({status['steps_per_s']:.0f}/s) | updates "
                f"{status['iteration']} ({status['updates_per_s']:.1f}/s) | params v{status['version']} | return "
                f"{_fmt(status['mean_return'])} | eval {_fmt(status['eval_return'])} | agents "
                f"{len(agents)}/{self.config.agent.num_agents} | {use_summary(status)} | {status['elapsed_s']:.0f}s")

    # ---------------------------------------------------------------- stopping
    def _shutdown(self, client: RedisClient) -> None:
        """SIGTERM to every child, the stop request in Redis (for processes on other machines),
        SIGKILL for children still alive after the grace.

        Children hear the signal before the request, so a learner stopped by Ctrl-C knows it was
        interrupted (MLflow: KILLED) rather than finished."""
        alive = [c for c in self.children if c.alive]
        for child in alive:
            child.started.terminate()
        try:
            RunControl(client, self.config.run).request_stop(self.ending or self.stop.reason or "launcher exiting")
        except redis.RedisError as exc:
            log.warning("could not write the stop request (%s)", exc)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in alive:
            try:
                child.started.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", child.name, STOP_GRACE_S)
                child.started.kill()
                child.started.wait()
        if self.children:
            self._note_learner_exit(client, self.children[0])

    def _final_eval(self, client: RedisClient, code: int) -> str:
        """Score the learner's final checkpoint (see the module docstring); returns the summary's
        line on it, '' when none is due (eval disabled, eval.final_episodes 0, a failed run)."""
        cfg = self.config.eval
        if not cfg.enabled or cfg.final_episodes == 0 or code != 0:
            return ""
        if self.signalled:
            return f"  final eval: skipped ({self.signalled})"
        try:
            status = RunControl(client, self.config.run).learner_status()
        except redis.RedisError as exc:
            return f"  final eval: skipped (the learner's last report is unreadable: {exc})"
        try:
            path = CheckpointManager(self.dir / "checkpoints", self.config.checkpoint).resolve("latest")
        except CheckpointError:
            return "  final eval: skipped (no checkpoint: the learner made no update)"
        iteration = int(path.stem.split("-")[1])
        if status.get("state") != "stopped" or status.get("iteration") != iteration:
            # E.g. killed STOP_GRACE_S after the stop, before it saved: the latest is not the final parameters.
            return (f"  final eval: skipped (the learner left no final checkpoint: it reported update "
                    f"{status.get('iteration', '-')}, {status.get('state', 'no state')}; the latest is {iteration})")
        self.progress(f"final eval of update {iteration}: {cfg.final_episodes} episodes, at most {cfg.final_max_s:.0f}s "
                      f"(Ctrl-C skips it)")
        log_path = self.dir / "logs" / "final-eval.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as err:
            # In a process group of its own (die_with_parent): a terminal's Ctrl-C reaches the launcher
            # only, which passes on one SIGTERM (a second signal would end the child without its result).
            process = subprocess.Popen(self._command("eval", "--checkpoint", str(path)), stdout=subprocess.PIPE,
                                       stderr=err, stdin=subprocess.DEVNULL, cwd=log_path.parent,
                                       preexec_fn=die_with_parent, env=child_env(actor=True))
        deadline = time.monotonic() + cfg.final_max_s + FINAL_EVAL_START_S
        terminated = killed = False
        while process.poll() is None:
            if self.stop and not terminated:
                terminated = True
                process.terminate()
            if time.monotonic() >= deadline and not killed:
                killed = True
                log.error("the final eval still runs %.0fs after it started; killing it",
                          cfg.final_max_s + FINAL_EVAL_START_S)
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
        stdout = process.stdout
        if stdout is None:  # opened with stdout=PIPE, so never
            raise RuntimeError("the final eval has no stdout pipe")
        with stdout:
            out = stdout.read().decode(errors="replace").strip().splitlines()
        if process.returncode != 0 or not out:
            if terminated:  # stopped before it could say so (still starting, say)
                return "  final eval: interrupted, nothing recorded"
            why = f"killed after {cfg.final_max_s + FINAL_EVAL_START_S:.0f}s" if killed else \
                f"exit code {process.returncode}"
            return f"  final eval: FAILED ({why}; see {log_path})\n{log_tail(log_path, 5)}"
        result = json.loads(out[-1])
        if result["interrupted"]:
            return "  final eval: interrupted, nothing recorded"
        if result["score"] is None:
            return f"  final eval: no episode finished within eval.final_max_s={cfg.final_max_s:g}s, nothing recorded"
        best = ", ".join(f"update {i} ({s:.1f})" for s, i in
                         CheckpointManager(self.dir / "checkpoints", self.config.checkpoint).best()) or "none kept"
        return (f"  final eval of update {iteration} (the final checkpoint): mean return {result['score']:.1f} over "
                f"{len(result['returns'])} of {result['episodes']} episodes in {result['seconds']:.1f}s; "
                f"best checkpoints: {best}")

    def _headline(self, code: int) -> str:
        if code != 0:
            return f"FAILED ({self.ending})" if self.ending else "FAILED"
        if self.signalled:
            return f"interrupted ({self.signalled}; MLflow marks it KILLED)"
        return f"finished ({self.ending})" if self.ending else "finished"

    def _summary(self, client: RedisClient, code: int) -> None:
        try:
            status = RunControl(client, self.config.run).learner_status()
        except redis.RedisError:
            status = {}
        lines = [f"run {self.config.run!r} {self._headline(code)}; results in {self.dir}"]
        if status:
            lines.append(f"  {status['env_steps']} env steps, {status['iteration']} updates, "
                         f"mean return {_fmt(status['mean_return'])}, last eval {_fmt(status['eval_return'])}")
            lines.append(f"  {use_summary(status, whole_run=True)}")
        if self.final_eval:
            lines.append(self.final_eval)
        lines.append(f"  checkpoints: {self.dir / 'checkpoints'}")
        lines.append(f"  logs: {self.dir / 'logs'}")
        if self.config.tracking.enabled:
            lines.append(f"  MLflow: mlflow ui --backend-store-uri sqlite:///{self.dir / 'mlflow.db'}")
            curves = self.dir / CURVES_FILE
            lines.append(f"  curves: {curves}" if curves.exists() else "  curves: none drawn (no return logged)")
        self.progress("\n".join(lines))

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
