"""The learner's numbers: MLflow metrics (``charts/``, ``losses/``, ``hub/``, ``system/`` on the
learner-step axis) and the learner status hash that ``launch`` and ``status`` display."""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import redis

from surreal_redis.configtools import flatten, to_dict
from surreal_redis.experience import Chunk
from surreal_redis.hub.experience.backlog import dedup_ratio, read_backlog
from surreal_redis.hub.experience.receiver import ReceiverStats
from surreal_redis.hub.experience.retention import JanitorStats
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeRecord
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.tracking import Tracker

if TYPE_CHECKING:
    from surreal_redis.config import ExperimentConfig

log = logging.getLogger(__name__)


class LearnerProgress(NamedTuple):
    """Where the learner stands, for one metrics flush."""

    iteration: int
    """Gradient updates so far (the MLflow step axis)."""
    env_steps: int
    param_version: int
    """The last parameter version the learner published."""
    mean_return: float | None
    """Mean of the recent training episode returns (None before the first episode)."""
    elapsed_s: float
    """Training seconds, earlier runs of a resumed experiment included."""


class LearnerMetrics:
    """Accumulates between flushes; :meth:`maybe_flush` writes every ``learner.metrics_every_s``."""

    def __init__(self, client: redis.Redis, config: ExperimentConfig, tracker: Tracker | None) -> None:
        self.client, self.config, self.tracker = client, config, tracker
        self.control = RunControl(client, config.run)
        self.losses: dict[str, list[float]] = defaultdict(list)
        self.staleness: deque[int] = deque(maxlen=10_000)
        self.publish_s: list[float] = []
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.eval_score: float | None = None
        self.eval_version: int | None = None
        self.trimmed = self.unread_dropped = self.obs_deleted = 0
        self.last_gc = 0.0
        self.ingest_bytes = 0
        self._last_flush = time.monotonic()
        self._last_counts: dict[str, float] = {}
        self._status: dict[str, Any] = {}

    # ---------------------------------------------------------------- observations
    def log_config(self) -> None:
        assert self.tracker is not None
        self.tracker.log_params(flatten(to_dict(self.config)))
        path = self.config.experiment_dir / "config.yaml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.config.to_yaml())
        self.tracker.log_artifact(path)

    def observe_chunk(self, learner_version: int, chunk: Chunk, nbytes: int) -> None:
        self.staleness.extend((learner_version - chunk.policy_version).tolist())
        self.ingest_bytes += nbytes

    def observe_update(self, stats: dict[str, float]) -> None:
        for key, value in stats.items():
            self.losses[key].append(float(value))

    def observe_publish(self, seconds: float) -> None:
        self.publish_s.append(seconds)

    def observe_janitor(self, stats: JanitorStats) -> None:
        self.last_gc = time.monotonic()
        self.trimmed += stats.trimmed
        self.unread_dropped += stats.unread_dropped
        self.obs_deleted += stats.obs_deleted
        if stats.unread_dropped:
            log.warning("retention trimmed %d entries the learner had not read (hub.retention.max_entries "
                        "too small for the learner's pace)", stats.unread_dropped)

    def observe_episode(self, record: EpisodeRecord) -> None:
        self.episode_returns.append(record.episode_return)
        self.episode_lengths.append(record.length)

    def observe_eval(self, version: int, score: float) -> None:
        self.eval_score, self.eval_version = score, version

    def mark_stopped(self) -> None:
        """Keep the last status readable (for the launcher's summary) but say the learner is gone."""
        status = dict(self._status, state="stopped", time=time.time())
        self.control.write_learner_status(status, ttl_s=3600)

    # ---------------------------------------------------------------- flushing
    def _rate(self, name: str, value: float, dt: float) -> float:
        previous = self._last_counts.get(name, value)
        self._last_counts[name] = value
        return (value - previous) / dt if dt > 0 else 0.0

    def _hub_numbers(self, version: int) -> dict[str, float]:
        cfg = self.config
        shards = [RunKeys(cfg.run).shard(i) for i in range(cfg.redis.num_shards)]
        backlogs = [read_backlog(self.client, keys) for keys in shards]
        memory = self.client.info("memory")
        agents = [a for a in read_agents(self.client, cfg.run, cfg.agent.heartbeat_ttl_s) if not a.stale]
        numbers = {
            "hub/stream_unread": float(sum(b.unread for b in backlogs)),
            "hub/stream_length": float(sum(b.length for b in backlogs)),
            "hub/redis_used_memory_mb": memory["used_memory"] / 2**20,
            "hub/agents_alive": float(len(agents)),
            "hub/trimmed_total": float(self.trimmed),
            "hub/unread_trimmed_total": float(self.unread_dropped),
            "hub/obs_deleted_total": float(self.obs_deleted),
        }
        ratios = [r for keys, b in zip(shards, backlogs) if (r := dedup_ratio(self.client, keys, b.length)[0])]
        if ratios:
            numbers["hub/dedup_ratio"] = float(np.mean(ratios))
        if agents:
            numbers["hub/agent_version_lag_mean"] = float(np.mean([version - a.param_version for a in agents]))
        return numbers

    def maybe_flush(self, progress: LearnerProgress, replay_stats: dict[str, int], receiver: ReceiverStats,
                    force: bool = False) -> None:
        """Log and report once ``learner.metrics_every_s`` passed since the last flush (or ``force``).
        Blocks for a few Redis round trips; hub numbers are skipped (logged) if Redis errs."""
        now = time.monotonic()
        dt = now - self._last_flush
        if not force and dt < self.config.learner.metrics_every_s:
            return
        self._last_flush = now
        step = progress.iteration
        metrics: dict[str, float | None] = {
            "charts/env_steps": float(progress.env_steps),
            "charts/env_steps_per_s": self._rate("steps", progress.env_steps, dt),
            "charts/updates_per_s": self._rate("updates", step, dt),
            "charts/param_version": float(progress.param_version),
            "charts/episode_return_mean": progress.mean_return,
            "hub/ingest_mb_per_s": self._rate("bytes", self.ingest_bytes, dt) / 2**20,
            "hub/dead_entries_total": float(receiver.dead),
            "hub/obs_cache_hit_ratio": receiver.cache_hits / max(1, receiver.cache_hits + receiver.cache_misses),
            "system/elapsed_s": progress.elapsed_s,
        }
        if self.episode_returns:
            metrics["charts/episode_return"] = float(np.mean(self.episode_returns))
            metrics["charts/episode_length"] = float(np.mean(self.episode_lengths))
        if self.eval_score is not None:
            metrics["charts/eval_return"] = self.eval_score
        if self.staleness:
            values = np.asarray(self.staleness)
            metrics.update({"hub/policy_staleness_p50": float(np.percentile(values, 50)),
                            "hub/policy_staleness_p90": float(np.percentile(values, 90)),
                            "hub/policy_staleness_max": float(values.max())})
        if self.publish_s:
            metrics["hub/publish_delay_ms"] = 1000 * float(np.mean(self.publish_s))
        metrics.update({f"losses/{k}": float(np.mean(v)) for k, v in self.losses.items() if v})
        metrics.update({f"system/replay_{k}": float(v) for k, v in replay_stats.items()})
        try:
            metrics.update(self._hub_numbers(progress.param_version))
        except redis.RedisError as exc:
            log.warning("hub metrics unavailable: %s", exc)
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)
        status = {"iteration": step, "version": progress.param_version, "env_steps": progress.env_steps,
                  "mean_return": progress.mean_return, "eval_return": self.eval_score,
                  "steps_per_s": metrics["charts/env_steps_per_s"], "updates_per_s": metrics["charts/updates_per_s"],
                  "pid": os.getpid(), "time": time.time(), "elapsed_s": progress.elapsed_s, "state": "running"}
        self.control.write_learner_status(status, ttl_s=max(60, int(10 * self.config.learner.metrics_every_s)))
        self._status = status
        mean = progress.mean_return
        log.info("update %d | v%d | %d env steps (%.0f/s) | %.1f updates/s | return %s | eval %s",
                 step, progress.param_version, progress.env_steps, metrics["charts/env_steps_per_s"],
                 metrics["charts/updates_per_s"], "-" if mean is None else f"{mean:.1f}",
                 "-" if self.eval_score is None else f"{self.eval_score:.1f}")
        self.losses.clear()
        self.staleness.clear()
        self.publish_s.clear()
        self.episode_returns.clear()
        self.episode_lengths.clear()
