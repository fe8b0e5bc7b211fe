"""``surreal-redis launch``: one experiment on this machine.

Starts an embedded Redis when no URL is given, then the learner, N agents and one eval as child
processes (each logging to ``<experiment>/logs/<name>.log``), shows progress, restarts crashed
agents, and stops everything cleanly on Ctrl-C, on ``surreal-redis stop`` or when the learner
reports that a stop condition was met.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import EmbeddedRedis, connect, die_with_parent
from surreal_redis.hub.params import ParameterClient
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.runtime import StopFlag

log = logging.getLogger(__name__)

STOP_GRACE_S = 30.0  # the learner writes a final checkpoint and MLflow artifacts on the way out


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Child:
    """One child process of the launch and how to (re)start it."""

    name: str
    args: list[str]
    log_path: Path
    restartable: bool
    process: subprocess.Popen | None = None
    restarts: int = 0
    started: float = field(default=0.0)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=die_with_parent)
        self.started = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Launcher:
    """Runs one experiment; :meth:`run` blocks and returns the exit code (0 when the learner
    finished cleanly). ``progress`` receives one human-readable line every couple of seconds."""

    def __init__(self, config: ExperimentConfig, stop: StopFlag, resume: str | None = None,
                 resume_from: Path | None = None, progress: Callable[[str], None] | None = None,
                 log_level: str = "INFO") -> None:
        self.config, self.stop, self.resume, self.resume_from = config, stop, resume, resume_from
        self.progress = progress or (lambda line: log.info("%s", line))
        self.log_level = log_level
        self.dir = config.experiment_dir
        self.server: EmbeddedRedis | None = None
        self.children: list[Child] = []

    # ---------------------------------------------------------------- set-up
    def _command(self, *role: str) -> list[str]:
        return [sys.executable, "-m", "surreal_redis.cli", "--log-level", self.log_level, *role,
                "--config", str(self.dir / "config.yaml"), "--redis-url", self.url]

    def _prepare(self) -> redis.Redis:
        cfg = self.config
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(cfg.to_yaml())
        if cfg.redis.url:
            self.url = cfg.redis.url
        else:
            self.server = EmbeddedRedis(maxmemory=cfg.redis.maxmemory).start()
            self.url = self.server.url
        client = connect(self.url, cfg.redis.settings())
        try:
            client.ping()
        except redis.RedisError as exc:
            raise RuntimeError(f"cannot reach Redis at {self.url}: {exc}") from exc
        status = RunControl(client, cfg.run).learner_status()
        if status.get("state") == "running" and time.time() - float(status.get("time", 0)) < 30:
            raise RuntimeError(f"a learner of run {cfg.run!r} is already running on {self.url} (pid "
                               f"{status.get('pid')}); stop it or choose another experiment.name")
        if self.resume is None:
            dropped = RunControl(client, cfg.run).drop()
            if dropped:
                log.info("removed %d keys left by an earlier run named %r", dropped, cfg.run)
        control = RunControl(client, cfg.run)
        control.store_config(cfg.to_yaml())
        control.start()
        return client

    def _children(self) -> list[Child]:
        logs = self.dir / "logs"
        learner = self._command("learner")
        if self.resume is not None:
            learner += ["--resume", self.resume]
            if self.resume_from is not None:
                learner += ["--resume-from", str(self.resume_from)]
        children = [Child("learner", learner, logs / "learner.log", restartable=False)]
        for agent_id in range(self.config.agent.num_agents):
            children.append(Child(f"agent-{agent_id}", self._command("agent", "--id", str(agent_id)),
                                  logs / f"agent-{agent_id}.log", restartable=self.config.agent.restart_on_crash))
        if self.config.eval.enabled:
            children.append(Child("eval-0", self._command("eval"), logs / "eval-0.log", restartable=True))
        return children

    # ---------------------------------------------------------------- running
    def run(self) -> int:
        try:
            client = self._prepare()
        except BaseException:
            self._stop_server()
            raise
        code = 1
        try:
            code = self._supervise(client)
        finally:
            self._shutdown(client)
        self._summary(client, code)
        self._stop_server()
        return code

    def _supervise(self, client: redis.Redis) -> int:
        control = RunControl(client, self.config.run)
        self.children = self._children()
        learner, others = self.children[0], self.children[1:]
        learner.start()
        if not self._wait_for_parameters(client, learner):
            return 1
        for child in others:
            child.start()
        next_progress = 0.0
        last_line = ""
        while not self.stop:
            self.stop.wait(0.5)
            if learner.process.poll() is not None:
                code = learner.process.returncode
                if code != 0:
                    log.error("learner crashed with exit code %d; stopping the run. Last log lines:\n%s",
                              code, log_tail(learner.log_path))
                    return 1
                log.info("learner finished")
                return 0
            stopping, reason = control.stopping()
            if stopping:
                log.info("run stopping: %s", reason or "stop requested")
                self._wait_learner(learner)
                return 0 if learner.process.returncode in (0, None) else 1
            for child in others:
                self._check_child(child)
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + 2.0
                line = self._progress_line(client)
                if line != last_line:  # the learner reports every learner.metrics_every_s
                    self.progress(line)
                    last_line = line
        control.request_stop(self.stop.reason or "launcher stopped")
        return 0

    def _wait_for_parameters(self, client: redis.Redis, learner: Child) -> bool:
        """Agents start once the learner has published its first parameters."""
        params = ParameterClient(client, self.config.run, self.config.hub.params_client)
        while not self.stop:
            if learner.process.poll() is not None:
                log.error("learner exited with code %d before publishing parameters. Last log lines:\n%s",
                          learner.process.returncode, log_tail(learner.log_path))
                return False
            if params.fetch_info().version > 0:
                return True
            self.stop.wait(0.2)
        return False

    def _check_child(self, child: Child) -> None:
        if child.alive or child.process is None:
            return
        code = child.process.returncode
        log.error("%s exited with code %d. Last log lines:\n%s", child.name, code, log_tail(child.log_path))
        if child.restartable and child.restarts < self.config.agent.max_restarts:
            child.restarts += 1
            log.info("restarting %s (restart %d of %d)", child.name, child.restarts, self.config.agent.max_restarts)
            child.start()
        else:
            log.error("%s is not restarted (restarts used: %d)", child.name, child.restarts)
            child.process = None

    def _wait_learner(self, learner: Child) -> None:
        try:
            learner.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("learner still running %.0fs after the stop request", STOP_GRACE_S)

    def _progress_line(self, client: redis.Redis) -> str:
        status = RunControl(client, self.config.run).learner_status()
        agents = read_agents(client, self.config.run, self.config.agent.heartbeat_ttl_s, include_stale=False)
        if not status:
            return f"waiting for the learner... agents {len(agents)}/{self.config.agent.num_agents}"

        def fmt(value: object) -> str:
            return "-" if value is None else f"{value:.1f}"

        return (f"env steps {status['env_steps']} ({status['steps_per_s']:.0f}/s) | updates {status['iteration']} "
                f"({status['updates_per_s']:.1f}/s) | params v{status['version']} | return {fmt(status['mean_return'])} "
                f"| eval {fmt(status['eval_return'])} | agents {len(agents)}/{self.config.agent.num_agents} "
                f"| {status['elapsed_s']:.0f}s")

    # ---------------------------------------------------------------- stopping
    def _shutdown(self, client: redis.Redis) -> None:
        """Stop request in Redis, SIGTERM to every child, SIGKILL for those still alive after the grace."""
        try:
            RunControl(client, self.config.run).request_stop(self.stop.reason or "launcher exiting")
        except redis.RedisError as exc:
            log.warning("could not write the stop request (%s)", exc)
        alive = [c for c in self.children if c.alive]
        for child in alive:
            child.process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for child in alive:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", child.name, STOP_GRACE_S)
                child.process.kill()
                child.process.wait()

    def _summary(self, client: redis.Redis, code: int) -> None:
        try:
            status = RunControl(client, self.config.run).learner_status()
        except redis.RedisError:
            status = {}
        db = (self.dir / "mlflow.db").resolve()
        lines = [f"run {self.config.run!r} {'finished' if code == 0 else 'FAILED'}; results in {self.dir.resolve()}"]
        if status:
            lines.append(f"  {status['env_steps']} env steps, {status['iteration']} updates, "
                         f"mean return {status['mean_return']}, last eval {status['eval_return']}")
        lines.append(f"  checkpoints: {(self.dir / 'checkpoints').resolve()}")
        lines.append(f"  logs: {(self.dir / 'logs').resolve()}")
        if self.config.tracking.enabled:
            lines.append(f"  MLflow: mlflow ui --backend-store-uri sqlite:///{db}")
        self.progress("\n".join(lines))

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
