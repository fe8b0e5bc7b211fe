"""``surreal-redis launch``: one experiment on this machine (see docs/usage.md, which says how
crashed children are restarted and outages ridden out).

Starts an embedded Redis when no URL is given, then the learner, N agents and one eval as child
processes, each logging to ``<experiment>/logs/<name>.log`` and running in that folder; supervises
them until a stop, then runs the final eval (:mod:`.final_eval`) unless interrupted or failed.

A live run is never touched: a launch is refused before anything is moved or deleted while the
folder's launcher lives (its lock or hub.json, :mod:`surreal_redis.run_folder`), another launch
holds the run's lease in a shared Redis (:mod:`surreal_redis.hub.run.lease`: taken first, renewed
while this launcher lives, released at its exit) or the run's learner reports there. Exit codes (:meth:`Launcher.run`): 0 finished, 1 failed, 130
(:data:`INTERRUPTED_EXIT`) interrupted by a signal; a second signal exits 130 at once, saying
which updates were not saved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import RedisClient, RedisSettings, connect
from surreal_redis.embedded import EmbeddedRedis
from surreal_redis.hub.params import ParameterClient
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.launcher.children import CLI, Child, log_tail, reap
from surreal_redis.launcher.claim import LaunchError, RunClaim, live_run
from surreal_redis.launcher.final_eval import FinalEval, headline, not_saved, summary
from surreal_redis.launcher.preload import Preloaded
from surreal_redis.learner.metrics import progress_line
from surreal_redis.outage import OUTAGE_ERRORS, OutageGuard
from surreal_redis.run_folder import EarlierRun, RunFolder
from surreal_redis.runtime import INTERRUPTED_EXIT, StopFlag

log = logging.getLogger(__name__)

STOP_GRACE_S = 60.0  # the learner writes a final checkpoint and closes its MLflow run, which opens in the
# background and may still be opening when a run stops early (tens of seconds on a busy 2-core machine)
SUPERVISE_EVERY_S = 0.1  # a stop request is seen this long after the learner wrote it, at the most
STOPPING_POLL_S = 0.05  # how often a stopping learner's report is read for its final checkpoint


class Launcher:
    """Runs one experiment; :meth:`run` blocks and returns the exit code (module docstring).
    ``progress`` receives one human-readable line every couple of seconds, and the summary at the
    end. ``fresh``: an experiment folder that holds an earlier run is moved to ``<folder>.<time>``
    instead of refusing the launch. Raises :class:`LaunchError` (before anything starts) for a
    folder that holds an earlier run, a live run or an unreachable Redis; ``ValueError`` naming
    the setting for settings a launch cannot run with.
    """

    def __init__(self, config: ExperimentConfig, stop: StopFlag, resume: str | None = None,
                 resume_from: Path | None = None, progress: Callable[[str], None] | None = None,
                 log_level: str = "INFO", fresh: bool = False, preloaded: Preloaded | None = None) -> None:
        if config.agent.num_agents < 1:
            raise ValueError(f"launch needs at least one agent, got agent.num_agents={config.agent.num_agents}")
        if fresh and resume is not None:
            raise ValueError("--fresh starts the run over, --resume continues it: choose one")
        self.config, self.stop, self.resume, self.resume_from, self.fresh = config, stop, resume, resume_from, fresh
        self.progress = progress or (lambda line: log.info("%s", line))
        self.log_level = log_level
        self.preloaded = preloaded  # the learner's process, started ahead; ``launch`` discards it unused
        self.folder = RunFolder(config.experiment_dir.resolve())
        self.server: EmbeddedRedis | None = None
        self.children: list[Child] = []
        self.url = ""
        self.ending = ""  # why the run ended, for the summary
        self.signalled = ""  # the signal that ended the run (not one that came during the final eval)
        self.final_eval = ""  # the summary's line on it
        self.claim = RunClaim(config, self.folder)  # the folder's lock and the run's lease
        self.outage = OutageGuard("launcher", stop)  # the supervising loop's view of Redis
        self._last_status: dict = {}  # the learner's last report the progress line read
        # made now, as its process starts during the run (progress: whatever self.progress is then)
        self.finale = FinalEval(config, self.folder, stop, lambda line: self.progress(line), self._command)

    # ---------------------------------------------------------------- set-up
    def _command(self, *role: str) -> list[str]:
        return [*CLI, "--log-level", self.log_level, *role,
                "--config", str(self.folder.config_file), "--redis-url", self.url]

    def _refuse_live_learner(self, client: RedisClient) -> None:
        alive = RunControl(client, self.config.run).learner_alive()
        if alive:
            raise live_run(self.config, f"its learner (pid {alive.get('pid')}) reported {time.time() - float(alive['time']):.0f}s "
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
        if self.resume is not None:
            return
        try:
            self.folder.claim(self.fresh)
        except EarlierRun as earlier:
            raise LaunchError(
                f"{self.folder.path} already holds a run ({', '.join(earlier.found)}). Continue it with --resume, "
                f"start over with --fresh (moves the earlier run to {earlier.archive.name}), or choose another "
                f"experiment.name (-o experiment.name=NEW)") from None

    def _prepare(self) -> RedisClient:
        cfg = self.config
        # A live run first (this host: the folder's lock; any host: the run's lease, or a learner
        # not started by a launch, in a shared Redis), before --fresh moves its folder or the
        # run's keys are dropped.
        self.claim.lock_folder()
        client = None
        if cfg.redis.url:
            self.url = cfg.redis.url
            client = self._connect()
            self.claim.take_lease(client, self.url)
            self._refuse_live_learner(client)
        self._claim_folder()
        if not self.folder.path.exists():  # moved aside: lock the new folder (the old lock went with it)
            self.claim.lock_folder()
        # Children run in logs/: every path they get must be absolute.
        absolute = dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment,
                                                                           root=str(self.folder.path.parent)))
        self.folder.config_file.write_text(absolute.to_yaml())
        if client is None:
            self.server = EmbeddedRedis(maxmemory=cfg.redis.maxmemory).start()
            self.url = self.server.url
            client = self._connect()
            self.claim.take_lease(client, self.url)  # a fresh server: free, held for `status` and `--run` processes to see
        control = RunControl(client, cfg.run)
        self._refuse_live_learner(client)  # one that started since the first look
        if self.resume is None:
            dropped = control.drop(keep_lease=True)
            if dropped:
                log.info("removed %d keys left by an earlier run named %r", dropped, cfg.run)
        self._write_run_state(control)
        self.folder.announce(cfg.run, self.url)
        return client

    def _write_run_state(self, control: RunControl) -> None:
        """The config for ``--run`` processes and the ``running`` state (again after Redis came back empty)."""
        control.store_config(self.config.to_yaml())
        control.start()

    def _learner_command(self) -> list[str]:
        """The learner, resumed from this run's latest checkpoint once there is one (a restart),
        else as the launch was asked to start it."""
        command = self._command("learner")
        if self.finale.due and self.config.tracking.enabled:
            command.append("--final-curves-by-launch")  # the final eval's redraw is the last
        if self.folder.checkpoints(self.config.checkpoint).iterations():
            return command + ["--resume", "latest"]
        if self.resume is not None:
            command += ["--resume", self.resume]
            if self.resume_from is not None:
                command += ["--resume-from", str(self.resume_from.resolve())]
        return command

    def _children(self) -> list[Child]:
        log_file = self.folder.log_file
        children = [Child("learner", self._learner_command(), log_file("learner"), self.config.learner.max_restarts,
                          preloaded=self.preloaded)]
        agent_restarts = self.config.agent.max_restarts if self.config.agent.restart_on_crash else 0
        nice = self.config.agent.nice
        for agent_id in range(self.config.agent.num_agents):
            children.append(Child(f"agent-{agent_id}", self._command("agent", "--id", str(agent_id)),
                                  log_file(f"agent-{agent_id}"), agent_restarts, nice=nice))
        if self.config.eval.enabled:
            children.append(Child("eval-0", self._command("eval"), log_file("eval-0"), agent_restarts, nice=nice))
        return children

    # ---------------------------------------------------------------- running
    def run(self) -> int:
        try:
            client = self._prepare()
        except BaseException:
            self.claim.release_lease()
            self._stop_server()
            self.claim.release()
            raise
        self.config.algorithm.for_run(self.config)  # its warnings (the learner's log has them too) on the console
        self.stop.on_second_signal(lambda name: not_saved(self.config, self.folder, self._learner_report()))
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
            self.finale.close()
            self.folder.withdraw()
            self.claim.release_lease()
            self._stop_server()
            self.claim.release()
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

    def _supervise(self, client: RedisClient) -> int:
        control = RunControl(client, self.config.run)
        self.children = self._children()
        learner, others = self.children[0], self.children[1:]
        # Learner and agents start at once: agents build their envs while the learner starts, then
        # wait for its first parameters themselves. Eval starts after the first publish, so its
        # torch import does not compete with theirs for the first update.
        evals = [child for child in others if child.name.startswith("eval-")]
        for child in self.children:
            if child not in evals:
                child.start()
        if not self._wait_for_parameters(client, learner):
            self.ending = self.ending or self.stop.reason
            return 0 if self.stop else 1  # interrupted while starting: not a failure
        for child in evals:
            child.start()
        self.finale.standby()  # the final eval's process, ready by the stop
        next_progress = 0.0
        last_line = ""
        while not self.stop.wait(SUPERVISE_EVERY_S):
            if self.claim.lost:
                self.ending = "another launch took the run over (this launcher's lease had expired)"
                return 1
            code = self._check_learner(client, learner)
            if code is not None:
                return code
            for child in others:
                child.check(lambda: self._stopping(control)[0])
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
                self._reachable(control)
                if stopping:
                    self.ending = reason or "stop requested"
                    log.info("run stopping: %s", self.ending)
                    self.finale.prepare()  # the final eval's MLflow record loads while the learner finishes
                    for child in others:  # nothing left for them to do: they stop while the learner finishes
                        if child.alive:
                            child.started.terminate()
                    return self._wait_learner(client, learner)
                if time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + 2.0
                    self.finale.prepare()  # once the learner's MLflow run exists: loaded before the stop
                    line = self._progress_line(client, learner)
                    if line != last_line:  # the learner reports every learner.metrics_every_s
                        self.progress(line)
                        last_line = line
            except OUTAGE_ERRORS as exc:
                self.outage.failed(exc)
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
            stopping, reason = self._stopping(RunControl(client, self.config.run))
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

    def _stopping(self, control: RunControl) -> tuple[bool, str]:
        """``control.stopping()``, or not stopping while Redis is away."""
        try:
            answer = control.stopping()
            self._reachable(control)
        except OUTAGE_ERRORS:
            return False, ""
        return answer

    def _reachable(self, control: RunControl) -> None:
        """Redis answered. After an outage: said once, and the run's config and state written again
        when the server came back without them. Whichever call notices first does this, so a
        learner that finishes before the loop's next backed-off round does not hide the return."""
        if not self.outage.failing:
            return
        if control.stored_config() is None:
            log.warning("Redis came back without the run's keys; writing its config and state again")
            self._write_run_state(control)
        self.outage.succeeded()

    def _wait_learner(self, client: RedisClient, learner: Child) -> int:
        """After a stop request: the learner's exit code once it stopped (0 when it is not running).
        The final eval starts as soon as the learner reports its final checkpoint, while the
        learner closes its MLflow run (:meth:`FinalEval.begin`)."""
        if not learner.alive:
            return 0 if learner.process is None or learner.process.returncode in (0, None) else 1
        deadline = time.monotonic() + STOP_GRACE_S
        while learner.started.poll() is None:
            if time.monotonic() >= deadline:
                log.warning("learner still running %.0fs after the stop request", STOP_GRACE_S)
                return 0
            if not self.stop:  # a signal since: no final eval
                try:
                    self.finale.begin(client)
                except OUTAGE_ERRORS as exc:  # the eval starts after the learner's exit instead
                    log.debug("the learner's stop report is unreadable for now: %s", exc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                learner.started.wait(timeout=STOPPING_POLL_S)
        return 0 if learner.started.returncode == 0 else 1

    def _progress_line(self, client: RedisClient, learner: Child) -> str:
        status = RunControl(client, self.config.run).learner_status()
        self._last_status = status
        agents = read_agents(client, self.config.run, self.config.agent.heartbeat_ttl_s, include_stale=False)
        restarting = "learner restarting | " if learner.restart_at is not None else ""
        return restarting + progress_line(status, len(agents), self.config.agent.num_agents)

    # ---------------------------------------------------------------- stopping
    def _shutdown(self, client: RedisClient) -> None:
        """SIGTERM to every child, the stop request in Redis (for processes on other machines),
        SIGKILL for children still alive after the grace. Children hear the signal before the
        request, so a learner stopped by Ctrl-C knows it was interrupted (MLflow: KILLED)."""
        alive = [c for c in self.children if c.alive]
        for child in alive:
            child.started.terminate()
        if not self.claim.lost:  # else the run is another launch's now
            try:
                RunControl(client, self.config.run).request_stop(self.ending or self.stop.reason or "launcher exiting")
            except redis.RedisError as exc:
                log.warning("could not write the stop request (%s)", exc)
        reap(alive, STOP_GRACE_S)
        if self.children and not self.claim.lost:
            self._note_learner_exit(client, self.children[0])

    # ---------------------------------------------------------------- the end
    def _final_eval(self, client: RedisClient, code: int) -> str:
        """The summary's line on the final eval (:meth:`FinalEval.line`)."""
        return self.finale.line(client, code, self.signalled)

    def _summary(self, client: RedisClient, code: int) -> None:
        try:
            status = RunControl(client, self.config.run).learner_status()
        except redis.RedisError:
            status = {}
        self.progress(summary(self.config, self.folder, status, headline(code, self.ending, self.signalled),
                              self.final_eval))

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
