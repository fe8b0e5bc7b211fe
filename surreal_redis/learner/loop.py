"""The learner process: hub -> feed -> gradient updates -> parameters back to the hub.

A prefetch thread reads and decodes experience from every shard, so Redis I/O and decoding never
stall the GPU step. Each round of the main thread: read -> ``feed.ingest`` (then ack) ->
``feed.train`` -> publish (every ``learner.publish_every_updates`` updates, at most once per
``hub.publisher.min_publish_interval`` s) -> housekeeping (retention/gc, episodes, metrics, stop
conditions). The feed holds the regime (:mod:`surreal_redis.replay.feeds`); this module does not
know which algorithm it trains, and delegates each policy to an object of the package (see
:mod:`surreal_redis.learner`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import redis
import torch

from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import RedisClient
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceivedChunk
from surreal_redis.hub.experience.retention import HubJanitor
from surreal_redis.hub.params import ParameterPublisher, PublishBackpressure
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeReader
from surreal_redis.hub.run.heartbeat import prune_stale, read_agents
from surreal_redis.learner.curve import CurveLog
from surreal_redis.learner.grants import GrantKeeper
from surreal_redis.learner.metrics import LearnerMetrics, LearnerProgress
from surreal_redis.learner.parts import LearnerParts
from surreal_redis.learner.prefetch import READ_WAIT_MS, Prefetcher, PrefetchQueue
from surreal_redis.learner.progress import Scores, StopRules
from surreal_redis.learner.republish import RejectionWatch
from surreal_redis.outage import OUTAGE_ERRORS, OutageGuard
from surreal_redis.run_folder import RunFolder
from surreal_redis.runtime import StopFlag, process_started_at
from surreal_redis.tracking import BackgroundTracker, Tracker, TrackerProcess

log = logging.getLogger(__name__)

# Retried with capped backoff in start() and in the main loop: Redis away, or full (the janitor
# frees memory meanwhile: it runs before each retry, trimming by memory after a refusal). The
# stop.max_seconds and stop.max_env_steps limits are checked before each retry too. Writes that
# may be skipped (the status report) are skipped under OOM where they are made.
RETRY_ERRORS = (*OUTAGE_ERRORS, redis.exceptions.OutOfMemoryError, PublishBackpressure)
OOM_ERRORS = (redis.exceptions.OutOfMemoryError, PublishBackpressure)
HOUSEKEEPING_EVERY_S = 1.0
STOP_CHECK_EVERY_S = 0.2
"""With ``stop.target_return``, the episodes are read and the stop rules applied this often
between housekeepings (an XREAD and an HGETALL): a run that reached its target stops within
0.2 s, not 1 s (the quick start learns ~9k env steps a second)."""


class Learner:
    """``surreal-redis learner``: :meth:`run` blocks until a stop condition, a stop request or
    a signal, and returns the exit code. :meth:`from_config` builds the process's learner."""

    def __init__(self, config: ExperimentConfig, client: RedisClient, stop: StopFlag, parts: LearnerParts,
                 tracker: Tracker | BackgroundTracker | None = None, final_draw: bool = True) -> None:
        """``tracker``: MLflow tracking (:meth:`start` logs the config to it), None for none.
        ``final_draw`` False: the stop leaves ``curves.png`` to ``launch``, whose final eval redraws
        it (the launch's exit waits for that draw, not two)."""
        cfg = self.config = config
        self.client, self.stop, self.tracker = client, stop, tracker
        self.final_draw = final_draw
        self.algo, self.feed, self.chunk_check = parts
        self.publisher = ParameterPublisher(client, cfg.run, cfg.hub.publisher)
        self.receiver = ExperienceReceiver(client, cfg.hub.receiver, cfg.run, cfg.redis.num_shards,
                                           settings=cfg.redis.settings())
        self.janitor = HubJanitor(client, cfg.hub.retention, cfg.run, cfg.redis.num_shards, cfg.hub.receiver,
                                  dead_letters=self.receiver.count_dead_letters)
        self.control = RunControl(client, cfg.run)
        self.checkpoints = RunFolder(cfg.experiment_dir).checkpoints(cfg.checkpoint)
        self.metrics = LearnerMetrics(client, cfg, tracker)
        self.env_steps = 0
        self.param_version = 0  # the last version this learner published
        self.started = time.monotonic()
        self._updated = False  # by this process
        self.elapsed_before = 0.0
        self._publish_failed = False
        self._next_housekeeping = self._next_stop_check = 0.0
        live_agents = partial(read_agents, client, cfg.run, cfg.agent.heartbeat_ttl_s, include_stale=False)
        self.grants = GrantKeeper(client, cfg, self.feed, version=lambda: self.param_version,
                                  env_steps=lambda: self.env_steps, publish=partial(self._publish, force=True))
        self.rejections = RejectionWatch(live_agents, self._republish, every_s=cfg.agent.heartbeat_every_s)
        episodes = EpisodeReader(client, cfg.run, start_id="0-0", maxlen=cfg.hub.episodes_maxlen)
        self.curve = CurveLog(tracker, cfg.tracking.curve_window, cfg.tracking.curve_every_env_steps,
                              elapsed=self.elapsed, env_steps=lambda: self.env_steps,
                              every_s=cfg.learner.metrics_every_s)
        self.scores = Scores(episodes, cfg, self.metrics, self.checkpoints, self.curve,
                             iteration=lambda: self.algo.iteration, state=self._state)
        self.rules = StopRules(cfg.stop, self.scores, live_agents, schedule_done=self.algo.schedule_done)

    @classmethod
    def from_config(cls, config: ExperimentConfig, client: RedisClient, stop: StopFlag, resume: str | None = None,
                    resume_from: Path | None = None, final_draw: bool = True) -> Learner:
        """The parts ``config`` names (:meth:`LearnerParts.of`), MLflow tracking if enabled, and
        with ``resume`` ('latest', 'best' or an iteration) the state of that checkpoint (of
        ``resume_from``'s experiment folder when given)."""
        tracker = None
        if config.tracking.enabled:
            # MLflow runs in a process of its own (its import and store set-up cost seconds of CPU
            # and would hold this process's GIL), driven by a thread of ours: no update waits for a
            # write. It starts after the first update (_after_update), so its start-up takes none of
            # the learner's; at the priority of the learner's, so it is done by the learner's stop,
            # which waits for its last writes (at nice 19 a busy machine left it tens of seconds).
            tracker = BackgroundTracker(partial(TrackerProcess, config.experiment_dir, config.run,
                                                run_name=config.run, tracking_uri=config.tracking.tracking_uri),
                                        deferred=True)
        if advice := config.stale_round_advice:
            log.warning("%s", advice)
        torch.set_num_threads(config.learner.torch_threads)
        torch.manual_seed(config.experiment.seed)
        built = cls(config, client, stop, LearnerParts.of(config), tracker=tracker, final_draw=final_draw)
        if resume is not None:
            built.restore(resume, resume_from)
        return built

    # ---------------------------------------------------------------- checkpoints
    def _state(self) -> dict[str, Any]:
        return {
            "algorithm": self.algo.state_dict(), "env_steps": self.env_steps, "param_version": self.param_version,
            "elapsed_s": self.elapsed(), "algo": self.config.algo, "feed": self.feed.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "consumed": self.receiver.consumed_state(),  # chunks a failover may deliver again are dropped
        }

    def restore(self, which: str, folder: Path | None = None) -> None:
        """Load checkpoint ``which``, refill the feed from the hub's retained window, and skip the
        episodes already recorded: their evals were credited by the run that wrote them."""
        manager = self.checkpoints if folder is None else RunFolder(Path(folder)).checkpoints(self.config.checkpoint)
        path = manager.resolve(which)
        state = manager.load(path, map_location=getattr(self.algo, "device", "cpu"))
        if state.get("algo") != self.config.algo:
            raise ValueError(f"checkpoint {path} is for algo {state.get('algo')!r}, config says {self.config.algo!r}")
        self.algo.load_state_dict(state["algorithm"])
        if "feed" in state:  # older checkpoints: sampling starts from a fresh generator
            self.feed.load_state_dict(state["feed"])
        if "consumed" in state:  # older checkpoints: the window starts empty
            self.receiver.load_consumed(state["consumed"])
        self.env_steps = int(state["env_steps"])
        self.elapsed_before = float(state["elapsed_s"])
        self.param_version = int(state["param_version"])
        self.publisher.continue_after(self.param_version)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        log.info("resumed from %s: iteration %d, %d env steps", path, self.algo.iteration, self.env_steps)
        self.scores.resume(self.param_version)
        stored = self.feed.refill(self.receiver.read_retained(delivered_only=True))  # the rest comes by receive()
        if stored:
            log.info("refilled replay with %d transitions from the hub's retained window", stored)

    def elapsed(self) -> float:
        """Training seconds, earlier runs of a resumed experiment included."""
        return self.elapsed_before + time.monotonic() - self.started

    # ---------------------------------------------------------------- main loop
    def run(self) -> int:
        cfg = self.config
        if not self.start():  # stopped while Redis was away or full
            self._finish("FINISHED")
            return 0
        batches = PrefetchQueue(cfg.learner.prefetch_chunks)
        stop_prefetch = threading.Event()
        prefetcher = Prefetcher(self.receiver, batches, cfg.learner.receive_batch, stop_prefetch,
                                wait_ms=min(cfg.hub.receiver.block_ms, READ_WAIT_MS))
        prefetcher.start()
        guard = OutageGuard("learner", self.stop, errors=RETRY_ERRORS)
        status = "FINISHED"
        try:
            while not self.stop:
                if prefetcher.error is not None:
                    raise RuntimeError(f"experience reader failed: {prefetcher.error!r}") from prefetcher.error
                try:
                    self.iterate(batches)
                    guard.succeeded()
                except RETRY_ERRORS as exc:  # training goes on from the feed; Redis work is retried
                    self._before_retry(exc, relieve=True)
                    if not self.stop:
                        guard.failed(exc)
        except BaseException:
            status = "FAILED"
            log.exception("learner failed")
            raise
        finally:
            prefetcher.halt()
            self._save_final()  # while the prefetcher's read ends
            prefetcher.join(timeout=5)
            self._finish(status, unread_steps=batches.steps())
        return 0

    def start(self) -> bool:
        """Housekeeping (a learner restarted into a full Redis frees memory before it publishes),
        the initial parameters and grant, the run marked running, the config logged to MLflow.
        Rides out an outage or a full Redis with capped backoff; False when stopped first."""
        guard = OutageGuard("learner (start)", self.stop, errors=RETRY_ERRORS)
        while True:
            if self.stop:
                return False
            try:
                self._start_hub()  # its housekeeping runs the janitor first
                guard.succeeded()
                break
            except RETRY_ERRORS as exc:
                self._before_retry(exc, relieve=False)
                if not self.stop:
                    guard.failed(exc)
        if self.tracker is not None:
            self.metrics.log_config()
        return True

    def _start_hub(self) -> None:
        self._collect_garbage()
        if not self._publish(force=True):
            raise PublishBackpressure("initial parameters refused: Redis is out of memory")
        self.grants.grant()  # overlap too: its first grant ahead comes with the first update
        if not self.control.start(unless_stopped_since=process_started_at()):  # asked while this learner started
            self.stop.set(f"run stopping ({self.control.stopping()[1] or 'stop requested'})")

    def _before_retry(self, exc: BaseException, relieve: bool) -> None:
        """After a Redis call failed with one of RETRY_ERRORS: a refusal for lack of memory makes
        the janitor trim by memory (at once with ``relieve``, else in the housekeeping before the
        next attempt); a reached time or step limit stops the learner, since the housekeeping that
        checks it may be what keeps failing."""
        if isinstance(exc, OOM_ERRORS):
            self.janitor.note_oom()
            if relieve:
                try:
                    self.metrics.observe_janitor(self.janitor.run_once())
                except RETRY_ERRORS as again:
                    log.warning("learner: the janitor could not free memory (%s)", again)
        reason = self.rules.limit_reason(self.env_steps, self.elapsed())
        if reason:
            self._stop_run(reason)

    def _stop_run(self, reason: str) -> None:
        """Stop this learner for ``reason`` and ask the run to stop (Redis may refuse: logged)."""
        self.stop.set(reason)
        try:
            self.control.request_stop(reason)
        except RETRY_ERRORS as again:  # the launcher sees the learner exit instead
            log.warning("learner: stopping (%s) without the run's stop request, Redis refused it (%s)", reason, again)

    def iterate(self, batches: PrefetchQueue) -> None:
        """One round: the next received batch into the feed (unless it has updates to run first;
        waits up to 0.2 s for one, not at all while the feed has updates to run), the updates the
        feed allows, and housekeeping once a second (the stop rules every
        :data:`STOP_CHECK_EVERY_S` with a target return)."""
        items: list[ReceivedChunk] = []
        if self.feed.wants_data():
            with contextlib.suppress(queue.Empty):
                items = batches.get(timeout=0.0 if self.feed.has_updates() else 0.2)
        if items:
            self._ingest(items)
        updates = self.feed.train(self.algo, self.stop)
        while True:
            if done := self.rules.update_reason():  # e.g. a learning rate annealed to 0: nothing more to learn
                self._stop_run(done)
                break
            self.grants.before_update()
            started = time.monotonic()
            stats = next(updates, None)  # the gradient steps run inside next()
            if stats is None:
                break
            self.metrics.observe_update(stats, time.monotonic() - started)
            self._after_update(batches)
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_EVERY_S
            self._next_stop_check = now + STOP_CHECK_EVERY_S
            self._housekeeping()
        elif self.config.stop.target_return is not None and now >= self._next_stop_check:
            self._next_stop_check = now + STOP_CHECK_EVERY_S
            self.scores.read()
            self._apply_stop_rules()

    def _ingest(self, items: list[ReceivedChunk]) -> None:
        """Into the feed first, then the Redis calls: an outage in between leaves entries pending
        (never delivered twice), not data lost. The acks go with the prefetch thread's next read
        (``ack(later=True)``): a round trip less between updates."""
        usable: list[tuple[ReceivedChunk, str | None]] = []
        unusable: list[tuple[ReceivedChunk, str | None]] = []
        for item in items:
            problem = self.chunk_check.problem(item.chunk)
            (unusable if problem else usable).append((item, problem))
        self.grants.chunk_arrived()
        for item, _ in usable:
            self.env_steps += item.chunk.num_steps
            self.metrics.observe_chunk(self.param_version, item.chunk, item.nbytes)
            self.feed.ingest(item.chunk)
        for item, problem in unusable:  # decodes, but does not fit this env/algorithm: never crash
            self.metrics.observe_unusable(item.chunk.num_steps)
            # Before the ack, whose error would otherwise leave these pending until a restart.
            self.receiver.set_aside(item, "unusable", f"agent {item.chunk.agent_id}: {problem}")
        self.receiver.ack([item for item, _ in usable], later=True)  # only now is the data safely stored

    def _after_update(self, batches: PrefetchQueue) -> None:
        iteration = self.algo.iteration
        if not self._updated:  # the end of start-up (bench/solve.py times launch to this line)
            self._updated = True
            log.info("first update done (%.1fs after the learner was built)", time.monotonic() - self.started)
            if isinstance(self.tracker, BackgroundTracker):
                self.tracker.open()
        if self.checkpoints.due(iteration):  # before the Redis call, which an outage may fail
            self.checkpoints.save(self._state(), iteration)
            if self.tracker is not None:  # drawn by the tracker from its store, off this thread
                self.tracker.draw_curves(RunFolder(self.config.experiment_dir).curves)
        version = self.param_version
        if iteration % self.config.learner.publish_every_updates == 0 or self._publish_failed:
            self._publish(queued=batches.steps() if self.grants.carry_on_publish else None)
        self.grants.after_update(version)

    # ---------------------------------------------------------------- publishing
    def _publish(self, force: bool = False, queued: int | None = None) -> bool:
        """Publish unless too soon after the last (``force``: anyway); after an update, with the
        next update's grant when it is due (``GrantKeeper.grant_on_publish``; ``queued``: the env
        steps the prefetch thread read ahead). False when Redis refused it for lack of memory
        (logged; the next update or housekeeping tries again, training goes on); connection errors
        propagate."""
        start = time.monotonic()
        self._publish_failed = True  # until it went through: the next update tries again
        grant = self.grants.grant_on_publish(queued) if queued is not None else None
        try:
            version = self.publisher.publish(self.algo.actor_params(), self.algo.iteration, force=force,
                                             carry_grant=self.grants.carry_on_publish, grant=grant)
        except PublishBackpressure as exc:
            log.warning("publish refused, Redis is full (%s); training goes on, retrying after housekeeping", exc)
            return False
        self._publish_failed = False
        if version is not None:
            self._published(version, start)
            if grant is not None:
                self.grants.published_grant()
        return True

    def _republish(self, above: int) -> int:
        """Publish the parameters again as a version above ``above``; returns that version."""
        start = time.monotonic()
        version = self.publisher.republish(self.algo.actor_params(), self.algo.iteration, above=above)
        self._published(version, start)
        return version

    def _published(self, version: int, start: float) -> None:
        self.param_version = version
        self.curve.publish(version)
        self.metrics.observe_publish(time.monotonic() - start)
        self.feed.on_publish(version)

    def _republish_if_rejected(self) -> None:
        """Agents rejected the live version's parameters: republish, and grant for the new version."""
        if self.rejections.look(self.param_version):
            self.grants.grant()

    # ---------------------------------------------------------------- housekeeping
    def _collect_garbage(self) -> None:
        """Scripts agents need (they may not load them: ACL), retention/gc, stale heartbeats."""
        cfg = self.config
        self.receiver.load_agent_scripts()
        self.grants.load_script()
        self.metrics.observe_janitor(self.janitor.run_once())
        prune_stale(self.client, cfg.run, cfg.agent.heartbeat_ttl_s)

    def _housekeeping(self) -> None:
        if time.monotonic() - self.metrics.last_gc >= self.config.learner.gc_every_s:
            self._collect_garbage()
        if self._publish_failed and self._publish():  # lockstep agents wait for it: not left to the next update
            self.grants.grant()
        self._republish_if_rejected()
        self.grants.top_up()
        self.scores.read()
        self.curve.flush()  # the points of the episodes read, written by the tracker's thread
        self.metrics.maybe_flush(self.progress(), self.feed.stats(), self.receiver.stats())
        if not self._apply_stop_rules():
            stopping, why = self.control.stopping()
            if stopping:
                self.stop.set(f"run stopping ({why or 'stop requested'})")

    def _apply_stop_rules(self) -> bool:
        """Stop the run if a stop rule says so (:meth:`StopRules.stop_reason`); whether one did."""
        reason = self.rules.stop_reason(self.env_steps, self.elapsed())
        if reason:
            self.control.request_stop(reason)
            self.stop.set(reason)
        return bool(reason)

    def mean_return(self) -> float | None:
        """Mean of the recent training episode returns (None before the first episode)."""
        return self.scores.mean_return()

    def progress(self) -> LearnerProgress:
        """Where the learner stands, for a metrics flush."""
        return LearnerProgress(self.algo.iteration, self.env_steps, self.param_version, self.mean_return(),
                               self.elapsed(), self.feed.use(), self.grants.topups)

    # ---------------------------------------------------------------- the end
    def _checkpoints_to_keep(self) -> list[Path]:
        """What the MLflow run keeps of the checkpoint folder: the latest checkpoint (the final one
        after a clean stop), the best-scored one and the score queue; the folder has the rest."""
        iterations = set(self.checkpoints.iterations()[-1:]) | {i for _, i in self.checkpoints.best()[:1]}
        best_json = self.checkpoints.directory / "best.json"
        paths = [self.checkpoints.path_for(i) for i in sorted(iterations)] + [best_json]
        return [path for path in paths if path.exists()]

    def _save_final(self) -> None:
        """The final checkpoint and parameters, once the learner made an update (the parameters
        best effort when Redis is gone)."""
        if self.algo.iteration == 0:
            return
        try:
            self.checkpoints.save(self._state(), self.algo.iteration)
            self._publish(force=True)
        except (*RETRY_ERRORS, OSError) as exc:
            log.warning("learner: final checkpoint/publish incomplete (%s)", exc)

    def _finish(self, status: str, unread_steps: int = 0) -> None:
        """Final metrics and the stop report, after :meth:`_save_final` (best effort when Redis
        is gone). ``unread_steps``: env steps read from the hub but not taken into the feed; with
        those the feed holds, they are reported as left unused at the stop."""
        try:
            self.receiver.flush_acks()  # the prefetch thread's next read would have carried them
            self.scores.read()
            self.curve.flush(force=True)
            use = self.feed.use()
            if use is not None:
                self.metrics.observe_stop(use.held + unread_steps)
            self.metrics.maybe_flush(self.progress(), self.feed.stats(), self.receiver.stats(), force=True)
            self.metrics.mark_stopped()
        except (*RETRY_ERRORS, OSError) as exc:
            log.warning("learner: final publish/metrics incomplete (%s)", exc)
        if self.tracker is not None:
            for path in self._checkpoints_to_keep():
                self.tracker.log_artifact(path, "checkpoints", missing_ok=True)  # the final eval may prune it
            if self.final_draw:
                self.tracker.draw_curves(RunFolder(self.config.experiment_dir).curves)  # with the final metrics
            self.tracker.finish("KILLED" if status == "FINISHED" and self.stop.reason.startswith("signal") else status)
        log.info("learner stopped (%s): %d updates, %d env steps, %.0fs, pid %d", self.stop.reason or status,
                 self.algo.iteration, self.env_steps, self.elapsed(), os.getpid())
