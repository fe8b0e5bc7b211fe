"""The learner process: hub -> replay -> gradient updates -> parameters back to the hub.

A prefetch thread reads and decodes experience from every shard (Redis I/O and decoding never
stall the GPU step); the main thread puts it into replay, acks it, trains, publishes parameters
(every ``learner.publish_every_updates`` updates, at most once per
``hub.publisher.min_publish_interval`` s), runs retention/gc, checkpoints, watches the stop
conditions and logs metrics to MLflow. PPO reads a FIFO replay (on-policy, stale chunks dropped
and counted); DDPG turns chunks into n-step transitions in a uniform or prioritized replay.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import redis
import torch

from surreal_redis.algos.registry import make_algorithm
from surreal_redis.checkpoint import CheckpointManager
from surreal_redis.chunk_check import ChunkCheck
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import CONNECTION_ERRORS, Backoff
from surreal_redis.envs import make_env
from surreal_redis.experience import Chunk
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceivedChunk
from surreal_redis.hub.experience.retention import HubJanitor
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeReader
from surreal_redis.hub.run.heartbeat import prune_stale
from surreal_redis.learner_metrics import LearnerMetrics
from surreal_redis.replay.fifo import FIFOReplay
from surreal_redis.replay.nstep import NStepBuilder
from surreal_redis.replay.prioritized import PrioritizedReplay
from surreal_redis.replay.uniform import UniformReplay
from surreal_redis.runtime import StopFlag
from surreal_redis.tracking import Tracker

log = logging.getLogger(__name__)

OWED_UPDATES_BEFORE_READING = 64  # off-policy: read more experience once fewer updates than this are owed


class Prefetcher(threading.Thread):
    """Reads batches of decoded chunks into a bounded queue. Connection errors are retried with
    capped backoff; any other error is kept in ``error`` and ends the thread (the learner exits
    non-zero)."""

    def __init__(self, receiver: ExperienceReceiver, out: queue.Queue, batch: int, stop: threading.Event) -> None:
        super().__init__(name="prefetch", daemon=True)
        self.receiver, self.out, self.batch, self.stop = receiver, out, batch, stop
        self.error: BaseException | None = None

    def run(self) -> None:
        backoff = Backoff(0.1, 5.0)
        try:
            while not self.stop.is_set():
                try:
                    items = self.receiver.receive(self.batch)
                    backoff.reset()
                except CONNECTION_ERRORS as exc:
                    delay = backoff.next_delay()
                    log.warning("prefetch: Redis unavailable (%s); retrying in %.1fs", exc, delay)
                    self.stop.wait(delay)
                    continue
                while items and not self.stop.is_set():
                    try:
                        self.out.put(items, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the main thread, which logs it and exits non-zero
            self.error = exc


class Learner:
    """``surreal-redis learner``: :meth:`run` blocks until a stop condition, a stop request or
    a signal, and returns the exit code."""

    def __init__(self, config: ExperimentConfig, client: redis.Redis, stop: StopFlag,
                 resume: str | None = None, resume_from: Path | None = None) -> None:
        self.config, self.client, self.stop = config, client, stop
        cfg = config
        torch.set_num_threads(cfg.learner.torch_threads)
        torch.manual_seed(cfg.experiment.seed)
        self.rng = np.random.default_rng(cfg.experiment.seed)
        env = make_env(cfg.env, seed=cfg.experiment.seed, mode="train")
        self.obs_space, self.action_space = env.observation_space, env.action_space
        env.close()
        self.algo = make_algorithm(cfg, self.obs_space, self.action_space)
        self.publisher = ParameterPublisher(client, cfg.run, cfg.hub.publisher)
        self.receiver = ExperienceReceiver(client, cfg.hub.receiver, cfg.run, cfg.redis.num_shards,
                                           settings=cfg.redis.settings())
        self.janitor = HubJanitor(client, cfg.hub.retention, cfg.run, cfg.redis.num_shards)
        self.control = RunControl(client, cfg.run)
        self.checkpoints = CheckpointManager(cfg.experiment_dir / "checkpoints", cfg.checkpoint)
        if cfg.algo == "ppo":
            self.fifo: FIFOReplay | None = FIFOReplay(cfg.replay.fifo)
            self.replay: UniformReplay | None = None
        else:
            self.fifo = None
            self.replay = PrioritizedReplay(cfg.replay.off_policy) if cfg.ddpg.use_per else UniformReplay(cfg.replay.off_policy)
            self.nstep = NStepBuilder(cfg.ddpg.n_step, cfg.ddpg.gamma)
            self.limiter = cfg.replay.rate_limiter.make()
        required = ("logp",) + (("raw_action",) if isinstance(self.action_space, gym.spaces.Box) else ())
        self.chunk_check = ChunkCheck(self.obs_space, self.action_space, required if cfg.algo == "ppo" else ())
        self.env_steps = 0
        self.transitions = 0
        self.param_version = 0  # the last version this learner published
        self._publish_failed = False
        self.started = time.monotonic()
        self.elapsed_before = 0.0
        self.episodes = EpisodeReader(client, cfg.run, start_id="0-0")
        self.train_returns: deque[float] = deque(maxlen=cfg.stop.return_window)
        self.eval_by_version: dict[int, list[float]] = {}
        self.last_eval: float | None = None
        self.tracker: Tracker | None = None
        if cfg.tracking.enabled:
            self.tracker = Tracker(cfg.experiment_dir, cfg.run, run_name=cfg.run,
                                   tracking_uri=cfg.tracking.tracking_uri, resume=resume is not None)
        self.metrics = LearnerMetrics(client, cfg, self.tracker)
        if resume is not None:
            self._restore(resume, resume_from)

    # ---------------------------------------------------------------- checkpoints
    def _state(self) -> dict[str, Any]:
        return {
            "algorithm": self.algo.state_dict(), "env_steps": self.env_steps, "param_version": self.param_version,
            "elapsed_s": self.elapsed(), "algo": self.config.algo,
            "rng": {"numpy": self.rng.bit_generator.state, "torch": torch.get_rng_state(),
                    "python": random.getstate()},
        }

    def _restore(self, which: str, folder: Path | None) -> None:
        manager = self.checkpoints if folder is None else CheckpointManager(Path(folder) / "checkpoints",
                                                                               self.config.checkpoint)
        path = manager.resolve(which)
        state = manager.load(path, map_location=getattr(self.algo, "device", "cpu"))
        if state.get("algo") != self.config.algo:
            raise ValueError(f"checkpoint {path} is for algo {state.get('algo')!r}, config says {self.config.algo!r}")
        self.algo.load_state_dict(state["algorithm"])
        self.env_steps = int(state["env_steps"])
        self.elapsed_before = float(state["elapsed_s"])
        self.param_version = int(state["param_version"])
        self.publisher.continue_after(self.param_version)
        self.rng.bit_generator.state = state["rng"]["numpy"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        log.info("resumed from %s: iteration %d, %d env steps", path, self.algo.iteration, self.env_steps)
        if self.replay is not None:
            self._refill_replay()

    def _refill_replay(self) -> None:
        """Off-policy: put the hub's retained window back into replay (acked entries included)."""
        count = 0
        for chunk in self.receiver.read_retained(delivered_only=True):  # the rest comes through receive()
            self._ingest_off_policy(chunk)
            count += chunk.num_steps
        log.info("refilled replay with %d steps from the hub's retained window", count)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    # ---------------------------------------------------------------- main loop
    def run(self) -> int:
        cfg = self.config
        if self.tracker is not None:
            self.metrics.log_config()
        self._publish(force=True)
        self.control.start()
        feed: queue.Queue[list[ReceivedChunk]] = queue.Queue(maxsize=max(1, cfg.learner.prefetch_chunks // cfg.learner.receive_batch))
        stop_prefetch = threading.Event()
        prefetcher = Prefetcher(self.receiver, feed, cfg.learner.receive_batch, stop_prefetch)
        prefetcher.start()
        next_housekeeping = 0.0
        status = "FINISHED"
        backoff = Backoff(0.1, 5.0)
        try:
            while not self.stop:
                items = []
                if self._wants_data():
                    try:
                        items = feed.get(timeout=0.2)
                    except queue.Empty:
                        pass
                if prefetcher.error is not None:
                    raise RuntimeError(f"experience reader failed: {prefetcher.error!r}") from prefetcher.error
                try:
                    if items:
                        self._ingest(items)
                    self._train()
                    if time.monotonic() >= next_housekeeping:
                        next_housekeeping = time.monotonic() + 1.0
                        self._housekeeping()
                    backoff.reset()
                except CONNECTION_ERRORS as exc:  # training goes on from replay; Redis work is retried
                    delay = backoff.next_delay()
                    log.warning("learner: Redis unavailable (%s); retrying in %.1fs", exc, delay)
                    self.stop.wait(delay)
        except BaseException:
            status = "FAILED"
            log.exception("learner failed")
            raise
        finally:
            stop_prefetch.set()
            prefetcher.join(timeout=5)
            self._finish(status)
        return 0

    def _ingest(self, items: list[ReceivedChunk]) -> None:
        """Into replay first, then the Redis calls: an outage in between leaves entries pending
        (never delivered twice), not data lost."""
        usable, unusable = [], []
        for item in items:
            problem = self.chunk_check.problem(item.chunk)
            (unusable if problem else usable).append((item, problem))
        for item, _ in usable:
            chunk = item.chunk
            self.env_steps += chunk.num_steps
            self.metrics.observe_chunk(self.param_version, chunk, item.nbytes)
            if self.fifo is not None:
                self.fifo.insert(chunk)
            else:
                self._ingest_off_policy(chunk)
        self.receiver.ack([item for item, _ in usable])  # only now is the data safely in replay
        for item, problem in unusable:  # decodes, but does not fit this env/algorithm: never crash
            self.receiver.set_aside(item, "unusable", f"agent {item.chunk.agent_id}: {problem}")

    def _ingest_off_policy(self, chunk: Chunk) -> None:
        assert self.replay is not None
        batch = self.nstep.add(chunk)
        if batch is not None and batch.size:
            self.replay.insert(*batch)
            self.limiter.record_insert(batch.size)
            self.transitions += batch.size

    # ---------------------------------------------------------------- training
    def _update_budget(self) -> int:
        """Off-policy: the updates owed for the transitions inserted (``learner.updates_per_step``)."""
        return int((self.transitions - self.config.learner.learning_starts) * self.config.learner.updates_per_step)

    def _wants_data(self) -> bool:
        """Off-policy, the replay ratio holds only if reading pauses while updates are owed: the
        backlog then builds up in Redis and agents wait on ``hub.sender.max_lag``."""
        if self.replay is None or len(self.replay) < max(self.config.learner.learning_starts, self.config.ddpg.batch_size):
            return True
        if not self.limiter.can_sample(self.config.ddpg.batch_size):
            return True
        return self._update_budget() - self.algo.iteration < OWED_UPDATES_BEFORE_READING

    def _train(self) -> None:
        if self.fifo is not None:
            steps = self.config.learner.steps_per_update
            while len(self.fifo) >= steps and not self.stop:
                chunks = self.fifo.take(steps)
                if not chunks:
                    break
                self._after_update(self.algo.update(chunks))
            return
        self._train_off_policy()

    def _train_off_policy(self) -> None:
        assert self.replay is not None
        cfg = self.config
        batch_size = cfg.ddpg.batch_size
        if len(self.replay) < max(cfg.learner.learning_starts, batch_size):
            return
        budget = self._update_budget()
        deadline = time.monotonic() + 0.5  # go back to ingesting regularly
        while (self.algo.iteration < budget and self.limiter.can_sample(batch_size)
               and time.monotonic() < deadline and not self.stop):
            batch = self.replay.sample(batch_size, self.rng)
            stats, td_errors = self.algo.update(batch)
            if isinstance(self.replay, PrioritizedReplay):
                self.replay.update_priorities(batch.indices, td_errors)
            self.limiter.record_sample(batch_size)
            self._after_update(stats)

    def _after_update(self, stats: dict[str, float]) -> None:
        self.metrics.observe_update(stats)
        iteration = self.algo.iteration
        if self.checkpoints.due(iteration):  # before the Redis call, which an outage may fail
            self.checkpoints.save(self._state(), iteration)
        if iteration % self.config.learner.publish_every_updates == 0 or self._publish_failed:
            self._publish()

    def _publish(self, force: bool = False) -> None:
        start = time.monotonic()
        self._publish_failed = True  # until it went through: the next update tries again
        version = self.publisher.publish(self.algo.actor_params(), self.algo.iteration, force=force)
        self._publish_failed = False
        if version is not None:
            self.param_version = version
            self.metrics.observe_publish(time.monotonic() - start)
            if self.fifo is not None:
                self.fifo.set_learner_version(version)

    # ---------------------------------------------------------------- housekeeping
    def _housekeeping(self) -> None:
        cfg = self.config
        now = time.monotonic()
        if now - self.metrics.last_gc >= cfg.learner.gc_every_s:
            self.receiver.load_agent_scripts()  # agents may not load scripts themselves (ACL)
            self.metrics.observe_janitor(self.janitor.run_once())
            prune_stale(self.client, cfg.run, cfg.agent.heartbeat_ttl_s)
        self._read_episodes()
        replay_stats = self.fifo.stats() if self.fifo is not None else {"size": len(self.replay or [])}
        self.metrics.maybe_flush(self, replay_stats, self.receiver.stats())
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
                self.train_returns.append(record.episode_return)
                self.metrics.observe_episode(record)
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
        return float(np.mean(self.train_returns)) if self.train_returns else None

    def _stop_reason(self) -> str:
        stop = self.config.stop
        if stop.max_env_steps is not None and self.env_steps >= stop.max_env_steps:
            return f"reached {self.env_steps} env steps (stop.max_env_steps={stop.max_env_steps})"
        if stop.max_seconds is not None and self.elapsed() >= stop.max_seconds:
            return f"ran {self.elapsed():.0f}s (stop.max_seconds={stop.max_seconds})"
        if stop.target_return is None:
            return ""
        if stop.target_metric == "eval":
            if self.last_eval is not None and self.last_eval >= stop.target_return:
                return f"eval return {self.last_eval:.1f} reached stop.target_return={stop.target_return}"
            return ""
        mean = self.mean_return()
        if mean is not None and len(self.train_returns) >= stop.return_window and mean >= stop.target_return:
            return (f"mean return {mean:.1f} over the last {stop.return_window} episodes reached "
                    f"stop.target_return={stop.target_return}")
        return ""

    def _finish(self, status: str) -> None:
        """Final checkpoint, parameters and metrics (best effort when Redis is gone)."""
        try:
            if self.algo.iteration > 0:
                self.checkpoints.save(self._state(), self.algo.iteration)
                self._publish(force=True)
            self._read_episodes()
            self.metrics.maybe_flush(self, {}, self.receiver.stats(), force=True)
            self.metrics.mark_stopped()
        except (*CONNECTION_ERRORS, OSError) as exc:
            log.warning("learner: final publish/metrics incomplete (%s)", exc)
        if self.tracker is not None:
            for path in self.checkpoints.directory.glob("*"):
                self.tracker.log_artifact(path, "checkpoints")
            self.tracker.finish("KILLED" if status == "FINISHED" and self.stop.reason.startswith("signal") else status)
        log.info("learner stopped (%s): %d updates, %d env steps, %.0fs, pid %d", self.stop.reason or status,
                 self.algo.iteration, self.env_steps, self.elapsed(), os.getpid())
