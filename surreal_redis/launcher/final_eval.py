"""How a launch ends: the final eval of the learner's final checkpoint (``eval --checkpoint`` in
a child process, ``eval.final_episodes`` episodes within ``eval.final_max_s`` seconds, entered
into the best-k checkpoints), the summary with its headline, and what a second signal (which
exits at once) says was not saved."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from surreal_redis.checkpoint import CheckpointError
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import RedisClient
from surreal_redis.hub.run.control import RunControl
from surreal_redis.launcher.children import log_tail
from surreal_redis.launcher.final_curve import FinalCurve
from surreal_redis.learner.metrics import fmt_number, use_summary
from surreal_redis.run_folder import RunFolder
from surreal_redis.runtime import StopFlag, child_env, die_with_parent, niced

log = logging.getLogger(__name__)

STANDBY_CLOSE_S = 1.0  # an unused standby has this long to exit once its stdin closed (one still
# building is killed: it wrote nothing)
STANDBY_READY = "ready"  # what ``eval --checkpoint -`` prints on stdout once it waits for the path
FINAL_EVAL_START_S = 60.0  # the final eval's process may take this long to start (torch, env) on top of
# eval.final_max_s of play before it is killed
INTERRUPTED = "  final eval: interrupted, nothing recorded"


class _Skipped(Exception):
    """No final eval: the message is the summary's line saying why."""


class FinalEval:
    """The final eval of one run. ``command(*args)``: the launcher's command line for a child
    role (here ``eval --checkpoint PATH``); ``progress``: where the line announcing it goes;
    ``stop``: a signal during the eval ends it with nothing recorded.

    :meth:`standby` starts the eval's process ahead (``eval --checkpoint -``): it builds its env
    and networks during the run, at the lowest priority, and waits for the checkpoint's path, so
    the final eval takes its play time only after the stop, not the seconds a process with torch
    takes to start. :meth:`close` ends a standby no eval used.
    """

    def __init__(self, config: ExperimentConfig, folder: RunFolder, stop: StopFlag,
                 progress: Callable[[str], None], command: Callable[..., list[str]]) -> None:
        self.config, self.folder, self.stop = config, folder, stop
        self.progress, self.command = progress, command
        self.score: float | None = None  # the final eval's, once it gave one
        self.curve: FinalCurve | None = None  # its record in MLflow and curves.png, once prepared
        self._status: dict = {}  # the learner's last report, of the final checkpoint
        self._standby: subprocess.Popen | None = None  # the eval's process started ahead
        self._begun: tuple[subprocess.Popen, int, Path] | None = None  # the eval playing: process, update, log

    def prepare(self) -> None:
        """Start loading MLflow for the final eval's record now (seconds of CPU, in a process of
        its own: :class:`FinalCurve`), if a final eval is due and the learner's MLflow run exists
        (else nothing: call again later). The supervisor calls it during the run, so that the
        stop does not wait for it; :meth:`line` does it otherwise, and ends it in any case."""
        if self.curve is None and self.due:
            self.curve = FinalCurve.start(self.config, self.folder)

    @property
    def due(self) -> bool:
        """Whether the config asks for a final eval (eval enabled, eval.final_episodes > 0)."""
        return self.config.eval.enabled and self.config.eval.final_episodes > 0

    def standby(self) -> None:
        """Start the eval's process ahead, when a final eval is due and none is standing by (not
        blocking; a standby that failed to start is logged, and the final eval starts its own)."""
        if not self.due or self._standby is not None:
            return
        log_path = self.folder.log_file("final-eval")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._standby = self._start(["-"], log_path, stdin=subprocess.PIPE)
        except OSError as exc:
            log.warning("the final eval's process did not start ahead (%s); it starts after the stop", exc)

    def begin(self, client: RedisClient) -> None:
        """Start the final eval once the learner reported its stop at its final checkpoint (before
        its process exits: it closes its MLflow run meanwhile); nothing when none is due, it began
        already, or the learner has not reported yet (call again). Not blocking; a Redis error is
        raised (the eval then starts in :meth:`line`)."""
        if self._begun is not None or not self.due:
            return
        if RunControl(client, self.config.run).learner_status().get("state") != "stopped":
            return
        try:
            path, iteration, self._status = self._final_checkpoint(client)
        except _Skipped:  # line() says why
            return
        self._begin(path, iteration)

    def _begin(self, path: Path, iteration: int) -> None:
        """Announce the final eval of ``path`` and start it: the standby's process, else a new one."""
        cfg = self.config.eval
        self.prepare()  # MLflow loads while the eval plays
        self.progress(f"final eval of update {iteration}: {cfg.final_episodes} episodes, at most {cfg.final_max_s:.0f}s "
                      f"(Ctrl-C skips it)")
        log_path = self.folder.log_file("final-eval")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        process = self._told(path) or self._start([str(path)], log_path, stdin=subprocess.DEVNULL)
        self._begun = (process, iteration, log_path)

    def close(self) -> None:
        """End a standby process that no eval used: its stdin closed, one waiting for it exits at
        once; one still building is killed after :data:`STANDBY_CLOSE_S` (it wrote nothing). An
        eval begun but not waited for (the run failed or was signalled since) is stopped."""
        begun, self._begun = self._begun, None
        if begun is not None:
            begun[0].terminate()
            begun[0].communicate()
        process, self._standby = self._standby, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout=STANDBY_CLOSE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with contextlib.suppress(OSError):
            assert process.stdout is not None
            process.stdout.close()

    def _start(self, checkpoint: list[str], log_path: Path, stdin: int) -> subprocess.Popen:
        """``eval --checkpoint`` PATH or ``-`` in a child process logging to ``log_path``."""
        # In a process group of its own (die_with_parent): a terminal's Ctrl-C reaches the launcher
        # only, which passes on one SIGTERM (a second signal would end the child without its result).
        with open(log_path, "ab") as err:
            return subprocess.Popen(self.command("eval", "--checkpoint", *checkpoint), stdout=subprocess.PIPE,
                                    stderr=err, stdin=stdin, cwd=log_path.parent,
                                    preexec_fn=niced(self.config.agent.nice, die_with_parent),
                                    env=child_env(actor=True, nice=self.config.agent.nice))

    def _told(self, path: Path) -> subprocess.Popen | None:
        """The standby process, given ``path``, when it said it is ready (:data:`STANDBY_READY`);
        else None, and a standby still building (it builds at the lowest priority, which a busy
        machine may starve) is ended: the eval starts afresh at full priority instead."""
        process, self._standby = self._standby, None
        if process is None:
            return None
        assert process.stdout is not None
        said = process.stdout.readline() if select.select([process.stdout], [], [], 0)[0] else b""
        if said.decode(errors="replace").strip() != STANDBY_READY:
            log.info("the final eval's process started ahead is %s; starting another",
                     "not ready yet" if process.poll() is None else f"gone (exit code {process.returncode})")
            self._standby = process
            self.close()
            return None
        stdin, process.stdin = process.stdin, None  # closed here: communicate() would flush it
        assert stdin is not None
        try:
            stdin.write(f"{path}\n".encode())
            stdin.close()
        except OSError as exc:  # it died since (its exit code and log say why): a fresh one is started
            log.warning("the final eval's standby process is gone (exit code %s, %s); starting another",
                        process.wait(), exc)
            with contextlib.suppress(OSError):
                stdin.close()
            process.communicate()
            return None
        return process

    def line(self, client: RedisClient, code: int, signalled: str) -> str:
        """Score the learner's final checkpoint; blocks until the eval ends (at most
        ``eval.final_max_s`` + ``FINAL_EVAL_START_S`` seconds), then adds its score to the run's
        MLflow run and curves. Returns the summary's line on it, '' when none is due (eval
        disabled, eval.final_episodes 0, a failed run ``code``)."""
        try:
            return self._line(client, code, signalled)
        finally:
            self.prepare()  # the learner left the final curves.png to this (--final-curves-by-launch)
            if self.curve is not None:
                self.curve.end(self.score, self._status)  # the last eval point, in MLflow and curves.png

    def _line(self, client: RedisClient, code: int, signalled: str) -> str:
        cfg = self.config.eval
        if not cfg.enabled or cfg.final_episodes == 0 or code != 0:
            return ""  # an eval begun is stopped by close()
        if signalled:
            return f"  final eval: skipped ({signalled})"
        if self._begun is None:
            try:
                path, iteration, self._status = self._final_checkpoint(client)
            except _Skipped as skipped:
                return str(skipped)
            self._begin(path, iteration)
        assert self._begun is not None
        (process, iteration, log_path), self._begun = self._begun, None
        terminated, killed = self._wait(process)
        return self._result(process, iteration, log_path, terminated, killed)

    def _final_checkpoint(self, client: RedisClient) -> tuple[Path, int, dict]:
        """The learner's final checkpoint, its update count and the learner's last report (of that
        checkpoint); _Skipped when there is none."""
        try:
            status = RunControl(client, self.config.run).learner_status()
        except redis.RedisError as exc:
            raise _Skipped(f"  final eval: skipped (the learner's last report is unreadable: {exc})") from None
        try:
            path = self.folder.checkpoints(self.config.checkpoint).resolve("latest")
        except CheckpointError:
            raise _Skipped("  final eval: skipped (no checkpoint: the learner made no update)") from None
        iteration = int(path.stem.split("-")[1])
        if status.get("state") != "stopped" or status.get("iteration") != iteration:
            # E.g. killed STOP_GRACE_S after the stop, before it saved: the latest is not the final parameters.
            raise _Skipped(f"  final eval: skipped (the learner left no final checkpoint: it reported update "
                           f"{status.get('iteration', '-')}, {status.get('state', 'no state')}; the latest is {iteration})")
        return path, iteration, status

    def _wait(self, process: subprocess.Popen) -> tuple[bool, bool]:
        """Wait for the eval to exit: SIGTERM on a stop, SIGKILL past its deadline. Returns
        (terminated, killed)."""
        limit_s = self.config.eval.final_max_s + FINAL_EVAL_START_S
        deadline = time.monotonic() + limit_s
        terminated = killed = False
        while process.poll() is None:
            if self.stop and not terminated:
                terminated = True
                process.terminate()
            if time.monotonic() >= deadline and not killed:
                killed = True
                log.error("the final eval still runs %.0fs after it started; killing it", limit_s)
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
        return terminated, killed

    def _result(self, process: subprocess.Popen, iteration: int, log_path: Path, terminated: bool,
                killed: bool) -> str:
        """The summary's line on an eval that exited: its score (the JSON line it printed last)
        and the best checkpoints, or why there is none."""
        cfg = self.config.eval
        out = process.communicate()[0].decode(errors="replace").strip().splitlines()
        if process.returncode != 0 or not out:
            if terminated:  # stopped before it could say so (still starting, say)
                return INTERRUPTED
            why = f"killed after {cfg.final_max_s + FINAL_EVAL_START_S:.0f}s" if killed else \
                f"exit code {process.returncode}"
            return f"  final eval: FAILED ({why}; see {log_path})\n{log_tail(log_path, 5)}"
        result = json.loads(out[-1])
        if result["interrupted"]:
            return INTERRUPTED
        if result["score"] is None:
            return f"  final eval: no episode finished within eval.final_max_s={cfg.final_max_s:g}s, nothing recorded"
        self.score = float(result["score"])
        best = ", ".join(f"update {i} ({s:.1f})" for s, i in
                         self.folder.checkpoints(self.config.checkpoint).best()) or "none kept"
        return (f"  final eval of update {iteration} (the final checkpoint): mean return {result['score']:.1f} over "
                f"{len(result['returns'])} of {result['episodes']} episodes in {result['seconds']:.1f}s; "
                f"best checkpoints: {best}")


def headline(code: int, ending: str, signalled: str) -> str:
    """How the run ended, for the summary's first line: ``code`` the launch's exit code (before
    a signal makes it 130), ``ending`` why it ended, ``signalled`` the signal that ended it."""
    if code != 0:
        return f"FAILED ({ending})" if ending else "FAILED"
    if signalled:
        return f"interrupted ({signalled}; MLflow marks it KILLED)"
    return f"finished ({ending})" if ending else "finished"


def summary(config: ExperimentConfig, folder: RunFolder, status: dict, headline: str, final_eval: str) -> str:
    """The lines a launch ends with: ``status`` the learner's last report ({} when unreadable),
    ``final_eval`` the final eval's line ('' for none), and where the run's files are."""
    lines = [f"run {config.run!r} {headline}; results in {folder.path}"]
    if status:
        lines.append(f"  {status['env_steps']} env steps, {status['iteration']} updates, "
                     f"mean return {fmt_number(status['mean_return'])}, last eval {fmt_number(status['eval_return'])}")
        lines.append(f"  {use_summary(status, whole_run=True)}")
    if final_eval:
        lines.append(final_eval)
    lines.append(f"  checkpoints: {folder.checkpoints_dir}")
    lines.append(f"  logs: {folder.logs_dir}")
    if config.tracking.enabled:
        lines.append(f"  MLflow: mlflow ui --backend-store-uri sqlite:///{folder.mlflow_store}")
        lines.append(f"  curves: {folder.curves}" if folder.curves.exists() else "  curves: none drawn (no return logged)")
    return "\n".join(lines)


def not_saved(config: ExperimentConfig, folder: RunFolder, status: dict) -> str:
    """For a second signal, which exits at once (the learner too, before its final
    checkpoint): what of the learner's work ``status`` (its last report) is not on disk.
    Reads the checkpoint folder only: it runs in the signal handler."""
    saved = folder.checkpoints(config.checkpoint).iterations()
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
    if config.tracking.enabled:
        said += "; the MLflow run is marked KILLED once the learner is gone"
    return said
