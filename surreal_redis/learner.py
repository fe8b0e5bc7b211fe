"""The learner process: hub -> feed -> gradient updates -> parameters back to the hub.

A prefetch thread reads and decodes experience from every shard (Redis I/O and decoding never
stall the GPU step). Each round of the main thread: read -> ``feed.ingest`` (then ack) ->
``feed.train`` -> publish (every ``learner.publish_every_updates`` updates, at most once per
``hub.publisher.min_publish_interval`` s) -> housekeeping (retention/gc, episodes, metrics, stop
conditions). The feed holds the regime (:mod:`surreal_redis.replay.feeds`: PPO's FIFO, DDPG's
n-step replay and rate limiter); this module does not know which algorithm it trains.

Production on grants (on-policy runs, ``learner.on_policy_sync`` ``lockstep`` or ``overlap``; see
:mod:`surreal_redis.hub.quota`), always for the live parameter version:

- ``lockstep``: after each update (and its publish) the learner grants the env steps its next
  update still needs (:meth:`~surreal_redis.replay.feeds.Feed.steps_needed`).
- ``overlap``: before each update's gradient steps it grants what the update after it needs, so
  agents make that batch meanwhile; after the publish, what agents had not claimed yet of that
  grant carries over to the new version.
- Top-up rule (both): when the feed still needs steps for its next update, the grant is used up (or
  gone), no chunk arrived for ``learner.lockstep_topup_s`` seconds and no agent that beat within
  three ``agent.heartbeat_every_s`` is still making a flush it claimed (so an agent claimed and
  died, or the chunks were lost or dropped), the learner grants the missing steps again,
  publishing first if the live version is not its own (Redis restarted empty).
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
from typing import Any, NamedTuple

import numpy as np
import redis
import torch

from surreal_redis.algos.base import Trainer
from surreal_redis.algos.learning import FeedSettings, make_feed, make_trainer
from surreal_redis.checkpoint import CheckpointManager
from surreal_redis.chunk_check import ChunkCheck
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import OUTAGE_ERRORS, OutageGuard, RedisClient
from surreal_redis.envs import make_env
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceivedChunk
from surreal_redis.hub.experience.retention import HubJanitor
from surreal_redis.hub.params import ParameterPublisher, PublishBackpressure
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeReader, TrainReturns
from surreal_redis.hub.run.heartbeat import prune_stale, read_agents
from surreal_redis.learner_metrics import LearnerMetrics, LearnerProgress
from surreal_redis.plots import CURVES_FILE
from surreal_redis.prefetch import Prefetcher, PrefetchQueue
from surreal_redis.replay.feeds import Feed
from surreal_redis.runtime import StopFlag
from surreal_redis.tracking import BackgroundTracker, Tracker, TrackerProcess

log = logging.getLogger(__name__)

# Retried with capped backoff in start() and in the main loop: Redis away, or full (the janitor
# frees memory meanwhile: it runs before each retry, trimming by memory after a refusal). The
# stop.max_seconds and stop.max_env_steps limits are checked before each retry too. Writes that
# may be skipped (the status report) are skipped under OOM where they are made.
RETRY_ERRORS = (*OUTAGE_ERRORS, redis.exceptions.OutOfMemoryError, PublishBackpressure)
OOM_ERRORS = (redis.exceptions.OutOfMemoryError, PublishBackpressure)


class LearnerParts(NamedTuple):
    """What a learner trains and how: the trainer, its feed, and the check each chunk must pass."""

    algo: Trainer
    feed: Feed
    chunk_check: ChunkCheck


class Learner:
    """``surreal-redis learner``: :meth:`run` blocks until a stop condition, a stop request or
    a signal, and returns the exit code. :meth:`from_config` builds the process's learner."""

    def __init__(self, config: ExperimentConfig, client: RedisClient, stop: StopFlag, parts: LearnerParts,
                 tracker: Tracker | BackgroundTracker | None = None) -> None:
        """``tracker``: MLflow tracking (:meth:`start` logs the config to it), None for none."""
        cfg = self.config = config
        self.client, self.stop, self.tracker = client, stop, tracker
        self.algo, self.feed, self.chunk_check = parts
        self.publisher = ParameterPublisher(client, cfg.run, cfg.hub.publisher)
        self.receiver = ExperienceReceiver(client, cfg.hub.receiver, cfg.run, cfg.redis.num_shards,
                                           settings=cfg.redis.settings())
        self.janitor = HubJanitor(client, cfg.hub.retention, cfg.run, cfg.redis.num_shards, cfg.hub.receiver,
                                  dead_letters=self.receiver.count_dead_letters)
        self.quota = ProductionQuota(client, cfg.run) if cfg.lockstep and self.feed.steps_needed() is not None else None
        self.overlap = cfg.learner.on_policy_sync == "overlap"
        self.control = RunControl(client, cfg.run)
        self.checkpoints = CheckpointManager(cfg.experiment_dir / "checkpoints", cfg.checkpoint)
        self.metrics = LearnerMetrics(client, cfg, tracker)
        self.episodes = EpisodeReader(client, cfg.run, start_id="0-0", maxlen=cfg.hub.episodes_maxlen)
        self.env_steps = 0
        self.param_version = 0  # the last version this learner published
        self.train_returns = TrainReturns(cfg.stop.return_window)
        self.eval_by_version: dict[int, list[float]] = {}
        self.evals_from_version = 0  # evals of older parameters are not this learner's (see restore)
        self.last_eval: float | None = None
        self.started = time.monotonic()
        self._updated = False  # by this process
        self.elapsed_before = 0.0
        self._publish_failed = False
        self._next_housekeeping = 0.0
        self._last_chunk_at = self._granted_at = time.monotonic()
        self.topups = 0  # lockstep grants topped up by the rule above
        self._rejections: dict[tuple[str, int], int] = {}  # (agent id, pid) -> parameter downloads rejected
        self._rejections_version = -1  # the version live when they were last read
        self._next_rejection_check = 0.0
        self.republished = 0  # versions republished because agents rejected the live one

    @classmethod
    def from_config(cls, config: ExperimentConfig, client: RedisClient, stop: StopFlag, resume: str | None = None,
                    resume_from: Path | None = None) -> Learner:
        """The parts ``config`` names (the env is made once for its spaces), MLflow tracking if
        enabled, and with ``resume`` ('latest', 'best' or an iteration) the state of that
        checkpoint (of ``resume_from``'s experiment folder when given)."""
        tracker = None
        if config.tracking.enabled:
            # MLflow runs in a process of its own (its import and store set-up take ~2 s of CPU
            # and held this process's GIL) at the lowest CPU priority, driven by a thread of ours;
            # no update waits for a write. It starts now, while the agents wait for the first
            # parameters: its start-up then takes the core they leave (it took ~6 s of a core
            # from agents starting to learn when it opened after the first update).
            tracker = BackgroundTracker(partial(TrackerProcess, config.experiment_dir, config.run,
                                                run_name=config.run, tracking_uri=config.tracking.tracking_uri))
        if advice := config.stale_round_advice:
            log.warning("%s", advice)
        seed = config.experiment.seed
        torch.set_num_threads(config.learner.torch_threads)
        torch.manual_seed(seed)
        env = make_env(config.env, seed=seed, mode="train")
        obs_space, action_space = env.observation_space, env.action_space
        env.close()
        section = config.algo_config
        parts = LearnerParts(make_trainer(section, obs_space, action_space, seed),
                             make_feed(section, FeedSettings.of(config), seed),
                             ChunkCheck.for_experiment(config, obs_space, action_space))
        built = cls(config, client, stop, parts, tracker=tracker)
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
        manager = self.checkpoints if folder is None else CheckpointManager(Path(folder) / "checkpoints",
                                                                               self.config.checkpoint)
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
        self.param_version = self.evals_from_version = int(state["param_version"])
        self.publisher.continue_after(self.param_version)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        log.info("resumed from %s: iteration %d, %d env steps", path, self.algo.iteration, self.env_steps)
        while records := self.episodes.read_new():  # train returns still count for the stop window
            self.train_returns.add(records)
        stored = self.feed.refill(self.receiver.read_retained(delivered_only=True))  # the rest comes by receive()
        if stored:
            log.info("refilled replay with %d transitions from the hub's retained window", stored)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    # ---------------------------------------------------------------- main loop
    def run(self) -> int:
        cfg = self.config
        if not self.start():  # stopped while Redis was away or full
            self._finish("FINISHED")
            return 0
        batches = PrefetchQueue(cfg.learner.prefetch_chunks)
        stop_prefetch = threading.Event()
        prefetcher = Prefetcher(self.receiver, batches, cfg.learner.receive_batch, stop_prefetch)
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
            stop_prefetch.set()
            prefetcher.join(timeout=5)
            self._finish(status, unread_steps=batches.steps())
        return 0

    def start(self) -> bool:
        """Housekeeping first (a learner restarted into a full Redis frees memory before it
        publishes), publish the initial parameters (on grants: and grant the first update's steps),
        mark the run running, then log the config to MLflow (if tracking). Rides out an outage or
        a full Redis with capped backoff (housekeeping again before each retry); False when
        stopped first."""
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
        self._grant()  # overlap too: its first grant ahead comes with the first update
        self.control.start()

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
        reason = self._limit_reason()
        if not reason:
            return
        self.stop.set(reason)
        try:
            self.control.request_stop(reason)
        except RETRY_ERRORS as again:  # the launcher sees the learner exit instead
            log.warning("learner: stopping (%s) without the run's stop request, Redis refused it (%s)", reason, again)

    def iterate(self, batches: PrefetchQueue) -> None:
        """One round: the next received batch into the feed (unless it has updates to run first;
        waits up to 0.2 s for one), the updates the feed allows, and housekeeping once a second."""
        items: list[ReceivedChunk] = []
        if self.feed.wants_data():
            with contextlib.suppress(queue.Empty):
                items = batches.get(timeout=0.2)
        if items:
            self._ingest(items)
        updates = self.feed.train(self.algo, self.stop, arriving=batches.steps)
        while True:
            if self.overlap and self.quota is not None and self.feed.steps_needed() == 0:
                self._grant(ahead=1)  # an update runs now: agents make the next batch meanwhile
            started = time.monotonic()
            stats = next(updates, None)  # the gradient steps run inside next()
            if stats is None:
                break
            self.metrics.observe_update(stats, time.monotonic() - started)
            self._after_update()
        if time.monotonic() >= self._next_housekeeping:
            self._next_housekeeping = time.monotonic() + 1.0
            self._housekeeping()

    def _ingest(self, items: list[ReceivedChunk]) -> None:
        """Into the feed first, then the Redis calls: an outage in between leaves entries pending
        (never delivered twice), not data lost."""
        usable: list[tuple[ReceivedChunk, str | None]] = []
        unusable: list[tuple[ReceivedChunk, str | None]] = []
        for item in items:
            problem = self.chunk_check.problem(item.chunk)
            (unusable if problem else usable).append((item, problem))
        self._last_chunk_at = time.monotonic()
        for item, _ in usable:
            self.env_steps += item.chunk.num_steps
            self.metrics.observe_chunk(self.param_version, item.chunk, item.nbytes)
            self.feed.ingest(item.chunk)
        for item, problem in unusable:  # decodes, but does not fit this env/algorithm: never crash
            self.metrics.observe_unusable(item.chunk.num_steps)
            # Before the ack, whose error would otherwise leave these pending until a restart.
            self.receiver.set_aside(item, "unusable", f"agent {item.chunk.agent_id}: {problem}")
        self.receiver.ack([item for item, _ in usable])  # only now is the data safely stored

    def _after_update(self) -> None:
        iteration = self.algo.iteration
        if not self._updated:  # the end of start-up (bench/solve.py times launch to this line)
            self._updated = True
            log.info("first update done (%.1fs after the learner was built)", time.monotonic() - self.started)
        if self.checkpoints.due(iteration):  # before the Redis call, which an outage may fail
            self.checkpoints.save(self._state(), iteration)
            if self.tracker is not None:  # drawn by the tracker from its store, off this thread
                self.tracker.draw_curves(self.config.experiment_dir / CURVES_FILE)
        version = self.param_version
        if iteration % self.config.learner.publish_every_updates == 0 or self._publish_failed:
            self._publish()
        if not self.overlap:
            self._grant()  # for the new version, or again for the old one when no publish was due
        elif self.quota is not None and self.param_version != version:
            # The unclaimed rest of the grant made before this update. A claim between the read and
            # the write is granted twice: one flush more, used by the next update.
            grant = self.quota.left()
            self.quota.grant(self.param_version, max(0, grant[1]) if grant and grant[0] == version else 0)
            self._granted_at = time.monotonic()

    def _grant(self, ahead: int = 0) -> None:
        """Let agents acting with the live version produce what the next ``1 + ahead`` updates
        still need (on grants only)."""
        if self.quota is None:
            return
        steps = self.feed.steps_needed(ahead) or 0
        limit = self.config.stop.max_env_steps
        if limit is not None:  # no more than the run still needs: the stop comes at the limit
            steps = min(steps, max(0, limit - self.env_steps))
        self.quota.grant(self.param_version, steps)
        self._granted_at = time.monotonic()

    def _top_up(self) -> None:
        """On grants: the top-up rule of the module docstring. At most an HMGET, an HGETALL and an
        HGET when it looks, which is only after ``learner.lockstep_topup_s`` without a chunk."""
        needed = self.feed.steps_needed()
        if self.quota is None or not needed:
            return
        now = time.monotonic()
        if now - max(self._last_chunk_at, self._granted_at) < self.config.learner.lockstep_topup_s:
            return
        grant = self.quota.left()
        if grant is not None and grant[0] == self.param_version and grant[1] > 0:
            self._granted_at = now  # steps are left to claim: no agent is asking (none alive?)
            return
        recent = 3 * self.config.agent.heartbeat_every_s
        making = [a.agent_id for a in read_agents(self.client, self.config.run, self.config.agent.heartbeat_ttl_s)
                  if a.claimed and a.age_s < recent]
        if making:  # slow, not lost: look again later
            self._granted_at = now
            log.debug("lockstep: agents %s are still making the flushes they claimed", ", ".join(making))
            return
        if self.quota.live_version() != self.param_version:
            log.warning("lockstep: the live parameter version is not v%d (Redis restarted?); publishing again",
                        self.param_version)
            self._publish(force=True)
        self.topups += 1
        log.info("lockstep: no experience for %.0fs while the update needs %d more steps; granting them again "
                 "for v%d (top-up %d)", now - self._last_chunk_at, needed, self.param_version, self.topups)
        self._grant()

    def _publish(self, force: bool = False) -> bool:
        """Publish unless too soon after the last (``force``: anyway). False when Redis refused it
        for lack of memory (logged; the next update or housekeeping tries again, training goes on);
        connection errors propagate."""
        start = time.monotonic()
        self._publish_failed = True  # until it went through: the next update tries again
        try:
            version = self.publisher.publish(self.algo.actor_params(), self.algo.iteration, force=force)
        except PublishBackpressure as exc:
            log.warning("publish refused, Redis is full (%s); training goes on, retrying after housekeeping", exc)
            return False
        self._publish_failed = False
        if version is not None:
            self._published(version, start)
        return True

    def _published(self, version: int, start: float) -> None:
        self.param_version = version
        self.metrics.observe_publish(time.monotonic() - start)
        self.feed.on_publish(version)

    def _republish_if_rejected(self) -> None:
        """Agents report parameter downloads they rejected (digest mismatch: the live blob is
        damaged). When those counts rose while the live version stayed this learner's, publish the
        parameters again as a version above every one seen (one HGETALL every heartbeat period)."""
        now = time.monotonic()
        if now < self._next_rejection_check:
            return
        self._next_rejection_check = now + self.config.agent.heartbeat_every_s
        agents = read_agents(self.client, self.config.run, self.config.agent.heartbeat_ttl_s, include_stale=False)
        rose = False
        for agent in agents:
            key = (agent.agent_id, agent.pid)
            rose |= agent.param_rejections > self._rejections.get(key, 0)
            self._rejections[key] = agent.param_rejections
        unchanged, self._rejections_version = self._rejections_version == self.param_version, self.param_version
        if not (rose and unchanged):
            return
        above = max([self.param_version, *(agent.param_version for agent in agents)])
        start = time.monotonic()
        version = self.publisher.republish(self.algo.actor_params(), self.algo.iteration, above=above)
        self.republished += 1
        log.warning("agents rejected parameter v%d (damaged in Redis?); republished as v%d", self.param_version,
                    version)
        self._published(version, start)
        self._rejections_version = -1  # the next look only takes counts reported before agents saw it
        self._grant()

    # ---------------------------------------------------------------- housekeeping
    def _collect_garbage(self) -> None:
        """Scripts agents need (they may not load them: ACL), retention/gc, stale heartbeats."""
        cfg = self.config
        self.receiver.load_agent_scripts()
        if self.quota is not None:
            self.quota.load_script()
        self.metrics.observe_janitor(self.janitor.run_once())
        prune_stale(self.client, cfg.run, cfg.agent.heartbeat_ttl_s)

    def _housekeeping(self) -> None:
        cfg = self.config
        if time.monotonic() - self.metrics.last_gc >= cfg.learner.gc_every_s:
            self._collect_garbage()
        if self._publish_failed and self._publish():  # lockstep agents wait for it: not left to the next update
            self._grant()
        self._republish_if_rejected()
        self._top_up()
        self._read_episodes()
        self.metrics.maybe_flush(self.progress(), self.feed.stats(), self.receiver.stats())
        reason = self._stop_reason()
        if reason:
            self.control.request_stop(reason)
            self.stop.set(reason)
        else:
            stopping, why = self.control.stopping()
            if stopping:
                self.stop.set(f"run stopping ({why or 'stop requested'})")

    def _read_episodes(self) -> None:
        for record in self.episodes.read_new():
            if record.mode == "train":
                self.train_returns.add([record])
                self.metrics.observe_episode(record)
                continue
            if record.version < self.evals_from_version:
                continue
            scores = self.eval_by_version.setdefault(record.version, [])
            scores.append(record.episode_return)
            if len(scores) == self.config.eval.episodes:
                del self.eval_by_version[record.version]
                self._on_eval(record.version, float(np.mean(scores)))

    def _on_eval(self, version: int, score: float) -> None:
        """A complete eval of parameter version ``version``: log it and keep the best-k."""
        self.last_eval = score
        self.metrics.observe_eval(version, score)
        best = self.checkpoints.best()
        if self.config.checkpoint.keep_best and (len(best) < self.config.checkpoint.keep_best or score > best[-1][0]):
            # The current state is at most a few updates past the evaluated version.
            iteration = self.algo.iteration
            if not self.checkpoints.path_for(iteration).exists():
                self.checkpoints.save(self._state(), iteration)
            self.checkpoints.record_score(iteration, score)
            log.info("eval of v%d scored %.2f: checkpoint %d kept among the best", version, score, iteration)

    def mean_return(self) -> float | None:
        return self.train_returns.mean()

    def progress(self) -> LearnerProgress:
        return LearnerProgress(self.algo.iteration, self.env_steps, self.param_version, self.mean_return(),
                               self.elapsed(), self.feed.use(), self.topups)

    def _limit_reason(self) -> str:
        """Why the step or time limit stops the run ("" if neither is reached); no Redis call."""
        stop = self.config.stop
        if stop.max_env_steps is not None and self.env_steps >= stop.max_env_steps:
            return f"reached {self.env_steps} env steps (stop.max_env_steps={stop.max_env_steps})"
        if stop.max_seconds is not None and self.elapsed() >= stop.max_seconds:
            return f"ran {self.elapsed():.0f}s (stop.max_seconds={stop.max_seconds})"
        return ""

    def _stop_reason(self) -> str:
        stop = self.config.stop
        limit = self._limit_reason()
        if limit:
            return limit
        if stop.target_return is None:
            return ""
        if stop.target_metric == "eval":
            if self.last_eval is not None and self.last_eval >= stop.target_return:
                return f"eval return {self.last_eval:.1f} reached stop.target_return={stop.target_return}"
            return ""
        # one agent's records alone cannot reach it: a window per agent id, over the agents that heartbeat
        live = [a.agent_id for a in read_agents(self.client, self.config.run, self.config.agent.heartbeat_ttl_s,
                                                include_stale=False)]
        score = self.train_returns.stop_score(live)
        if score is not None and score >= stop.target_return:
            return (f"train return {score:.1f} (lower median over agents of each one's mean over its share of "
                    f"the last {stop.return_window} episodes) reached stop.target_return={stop.target_return}")
        return ""

    def _checkpoints_to_keep(self) -> list[Path]:
        """What the MLflow run keeps of the checkpoint folder: the latest checkpoint (the final one
        after a clean stop), the best-scored one and the score queue; the folder has the rest."""
        iterations = set(self.checkpoints.iterations()[-1:]) | {i for _, i in self.checkpoints.best()[:1]}
        best_json = self.checkpoints.directory / "best.json"
        paths = [self.checkpoints.path_for(i) for i in sorted(iterations)] + [best_json]
        return [path for path in paths if path.exists()]

    def _finish(self, status: str, unread_steps: int = 0) -> None:
        """Final checkpoint, parameters and metrics (best effort when Redis is gone).
        ``unread_steps``: env steps read from the hub but not taken into the feed; with those the
        feed holds, they are reported as left unused at the stop."""
        try:
            if self.algo.iteration > 0:
                self.checkpoints.save(self._state(), self.algo.iteration)
                self._publish(force=True)
            self._read_episodes()
            use = self.feed.use()
            if use is not None:
                self.metrics.observe_stop(use.held + unread_steps)
            self.metrics.maybe_flush(self.progress(), self.feed.stats(), self.receiver.stats(), force=True)
            self.metrics.mark_stopped()
        except (*RETRY_ERRORS, OSError) as exc:
            log.warning("learner: final publish/metrics incomplete (%s)", exc)
        if self.tracker is not None:
            for path in self._checkpoints_to_keep():
                self.tracker.log_artifact(path, "checkpoints")
            self.tracker.draw_curves(self.config.experiment_dir / CURVES_FILE)  # with the final metrics
            self.tracker.finish("KILLED" if status == "FINISHED" and self.stop.reason.startswith("signal") else status)
        log.info("learner stopped (%s): %d updates, %d env steps, %.0fs, pid %d", self.stop.reason or status,
                 self.algo.iteration, self.env_steps, self.elapsed(), os.getpid())
