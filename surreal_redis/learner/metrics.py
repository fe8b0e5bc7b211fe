"""The learner's numbers: MLflow metrics (``charts/``, ``losses/``, ``hub/``, ``system/`` on the
learner-step axis) and the learner status hash that ``launch`` and ``status`` display.

- ``hub/experience_used_fraction`` (on-policy, whole run): env steps that reached an update / env
  steps whose fate is settled: used + dropped by the feed (too stale, capacity) + set aside as
  unusable + trimmed unread (janitor entries x ``hub.sender.flush_steps``, an upper bound). Steps
  held for the next update are reported apart at the stop (``experience_unused_at_stop``).
- ``hub/policy_lag_p50`` / ``_p90`` / ``_max`` (whole run; ``hub/policy_staleness_*`` over the
  flush window): learner version minus the version that produced each step, when it arrived;
  ``hub/policy_lag_share_<bucket>``: the share of steps per :data:`LAG_BUCKETS` bucket.
- ``losses/rho_clipped_fraction`` (APPO's V-trace): the share of an update's samples whose
  importance weight was clipped at rho-bar (pi as the agents receive it: float16 parameters'
  rounding is no lag); ``losses/epochs``: epochs per update (window mean), the reuse per sample:
  each sample takes part in one gradient pass per epoch (``update_epochs`` unless ``target_kl``
  stops an update early); ``losses/approx_kl``: the KL between the policy that the update's ratio
  is taken against (PPO: the agents'; APPO: ``clip_against``) and the updated one, on the last
  epoch's minibatches (window mean).
- ``system/learner_busy_fraction``: seconds inside gradient updates / wall seconds (window).
- ``hub/agent_idle_fraction``: seconds agents waited (claims, backpressure) / seconds their env
  loops ran, summed over agents, from their heartbeats (window; the whole run's when no agent ran
  in it).

The status hash carries them too, busy, idle and epochs per update also over the whole run;
``use_summary`` shows the lag, the clipped share, the passes per sample and the KL per update.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import redis

from surreal_redis.chunks import Chunk
from surreal_redis.configtools import flatten, to_dict
from surreal_redis.connection import RedisClient
from surreal_redis.hub.experience.backlog import dedup_ratio, read_backlog
from surreal_redis.hub.experience.receiver import ReceiverStats
from surreal_redis.hub.experience.retention import JanitorStats
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeRecord
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.replay.feeds import ExperienceUse
from surreal_redis.run_folder import RunFolder
from surreal_redis.tracking import BackgroundTracker, Tracker

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
    use: ExperienceUse | None = None
    """What the feed did with the steps it took in (None: an off-policy feed)."""
    topups: int = 0
    """Lockstep grants the learner topped up (see :mod:`surreal_redis.learner.grants`)."""


LAG_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, None))
"""Policy-lag histogram buckets, inclusive (None: no upper end)."""


def lag_shares(histogram: Counter[int]) -> dict[str, float]:
    """The share of counted steps per :data:`LAG_BUCKETS` bucket, by label (``0``, ``3-4``, ``9+``)."""
    total = sum(histogram.values())
    shares = {}
    for low, high in LAG_BUCKETS:
        label = str(low) if high == low else f"{low}+" if high is None else f"{low}-{high}"
        count = sum(n for lag, n in histogram.items() if lag >= low and (high is None or lag <= high))
        shares[label] = count / total if total else 0.0
    return shares


def lag_percentile(histogram: Counter[int], q: float) -> int:
    """The lower ``q``-th percentile (0-100) of the values counted in ``histogram`` (non-empty)."""
    if not histogram:
        raise ValueError("lag_percentile needs at least one counted value")
    rank = q / 100 * (sum(histogram.values()) - 1)
    seen = 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen > rank:
            return value
    return max(histogram)


class AgentClocks:
    """Agents' idle and running seconds from their heartbeats, per process (agent id and pid: a
    restarted agent starts from 0 again). Keeps the last report of agents that left."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], tuple[float, float]] = {}  # at the last update: the window's start
        self.seen: dict[tuple[str, int], tuple[float, float]] = {}  # the latest report of each, for total()

    def update(self, reports: list[tuple[str, int, float, float]]) -> float | None:
        """Take ``(agent id, pid, idle_s, running_s)`` reports; returns the idle fraction since
        the previous call over the agents reported both times (None without running time)."""
        idle = running = 0.0
        for agent_id, pid, idle_s, running_s in reports:
            previous = self.last.get((agent_id, pid))
            if previous is not None and running_s > previous[1]:
                idle += min(max(0.0, idle_s - previous[0]), running_s - previous[1])
                running += running_s - previous[1]
            self.last[(agent_id, pid)] = (idle_s, running_s)
        self.observe(reports)
        return idle / running if running > 0 else None

    def observe(self, reports: list[tuple[str, int, float, float]]) -> None:
        """Keep the reports for :meth:`total` without ending :meth:`update`'s window: a run shorter
        than the learner's report interval still has its agents' time when they left before it."""
        for agent_id, pid, idle_s, running_s in reports:
            self.seen[(agent_id, pid)] = (idle_s, running_s)

    def total(self) -> float | None:
        """Idle fraction over everything reported (None before any running time)."""
        running = sum(r for _, r in self.seen.values())
        return sum(i for i, _ in self.seen.values()) / running if running > 0 else None


class LearnerMetrics:
    """Accumulates between flushes; :meth:`maybe_flush` writes every ``learner.metrics_every_s``."""

    def __init__(self, client: RedisClient, config: ExperimentConfig,
                 tracker: Tracker | BackgroundTracker | None) -> None:
        self.client, self.config, self.tracker = client, config, tracker
        self.control = RunControl(client, config.run)
        self.losses: dict[str, list[float]] = defaultdict(list)
        self.staleness: deque[int] = deque(maxlen=10_000)
        self.publish_s: list[float] = []
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.eval_score: float | None = None
        self.janitor_totals = JanitorStats(trimmed=0, unread_dropped=0, obs_deleted=0, calls=0)  # sums over the run
        # (agent id, pid) -> (chunks dropped, parameter downloads rejected), last heartbeat of each
        # agent process, those that left included: run totals
        self.agent_counts: dict[tuple[str, int], tuple[int, int]] = {}
        self.last_gc = 0.0
        self.ingest_bytes = 0
        self.lags: Counter[int] = Counter()  # policy lag of every step received, whole run
        self.unusable_steps = 0
        self.unused_at_stop: int | None = None
        self.busy_s = self.busy_total_s = 0.0
        self.epochs_total = self.epoch_updates = 0  # on-policy: the whole run's mean epochs per update
        self.started = time.monotonic()
        self.agent_clocks = AgentClocks()
        self._last_flush = time.monotonic()
        self._agents_observed = self._last_flush
        self._last_counts: dict[str, float] = {}
        self._reported: dict[str, Any] = {}  # the last status written

    # ---------------------------------------------------------------- observations
    def log_config(self) -> None:
        """The config as the MLflow run's parameters, and ``config.yaml`` as its artifact."""
        assert self.tracker is not None
        self.tracker.log_params(flatten(to_dict(self.config)))
        path = RunFolder(self.config.experiment_dir).config_file
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.config.to_yaml())
        self.tracker.log_artifact(path)

    def observe_chunk(self, learner_version: int, chunk: Chunk, nbytes: int) -> None:
        lags = (learner_version - chunk.policy_version).tolist()
        self.staleness.extend(lags)
        self.lags.update(lags)  # Counter's C loop: a few steps cost less than np.unique's sort
        self.ingest_bytes += nbytes

    def observe_update(self, stats: dict[str, float], seconds: float) -> None:
        """One gradient update's stats and the seconds it took."""
        for key, value in stats.items():
            self.losses[key].append(float(value))
        if "epochs" in stats:
            self.epochs_total += int(stats["epochs"])
            self.epoch_updates += 1
        self.busy_s += seconds
        self.busy_total_s += seconds

    def observe_unusable(self, steps: int) -> None:
        """``steps`` env steps were set aside: they do not fit this env or algorithm."""
        self.unusable_steps += steps

    def observe_stop(self, unused_steps: int) -> None:
        """The learner stops holding ``unused_steps`` env steps no update will use."""
        self.unused_at_stop = unused_steps

    def observe_publish(self, seconds: float) -> None:
        self.publish_s.append(seconds)

    def observe_janitor(self, stats: JanitorStats) -> None:
        self.last_gc = time.monotonic()
        self.janitor_totals = JanitorStats(*(total + more for total, more in zip(self.janitor_totals, stats)))
        if stats.unread_dropped:
            cause = ("Redis near maxmemory (hub.retention.memory_high_water)" if stats.pressure_trimmed
                     else "hub.retention.max_entries too small for the learner's pace")
            log.warning("retention trimmed %d entries the learner had not read (%s)", stats.unread_dropped, cause)

    def observe_episode(self, record: EpisodeRecord) -> None:
        self.episode_returns.append(record.episode_return)
        self.episode_lengths.append(record.length)

    def observe_eval(self, score: float) -> None:
        self.eval_score = score

    def mark_stopped(self) -> None:
        """Keep the last status readable (for the launcher's summary) but say the learner is gone."""
        status = dict(self._reported, state="stopped", time=time.time())
        self.control.write_learner_status(status, ttl_s=3600)

    # ---------------------------------------------------------------- flushing
    def _rate(self, name: str, value: float, dt: float) -> float:
        previous = self._last_counts.get(name, value)
        self._last_counts[name] = value
        return (value - previous) / dt if dt > 0 else 0.0

    def _hub_numbers(self) -> dict[str, float]:
        cfg = self.config
        shards = [RunKeys(cfg.run).shard(i) for i in range(cfg.redis.num_shards)]
        backlogs = [read_backlog(self.client, keys) for keys in shards]
        memory = self.client.info("memory")
        numbers = {
            "hub/stream_unread": float(sum(b.unread for b in backlogs)),
            "hub/stream_length": float(sum(b.length for b in backlogs)),
            "hub/redis_used_memory_mb": memory["used_memory"] / 2**20,
        }
        # The estimate parses the newest entries of a shard (~15 ms at 50 entries, on the update's
        # thread): only shards storing observation blobs, without which it is None, pay for it.
        ratios = [r for keys, b in zip(shards, backlogs)
                  if self.client.zcard(keys.obsref) and (r := dedup_ratio(self.client, keys, b.length)[0])]
        if ratios:
            numbers["hub/dedup_ratio"] = float(np.mean(ratios))
        return numbers

    def _observe_agents(self, now: float) -> None:
        """Between reports, read the agents' clocks once per ``agent.heartbeat_every_s`` (one
        HGETALL): at the stop, agents remove their heartbeats, and a run whose learning was
        shorter than ``learner.metrics_every_s`` had no idle figure ("agents idle -")."""
        if now - self._agents_observed < self.config.agent.heartbeat_every_s:
            return
        self._agents_observed = now
        try:
            agents = read_agents(self.client, self.config.run, self.config.agent.heartbeat_ttl_s, include_stale=False)
        except redis.RedisError as exc:  # the next look or report reads them again
            log.debug("agents' heartbeats not read (%s)", exc)
            return
        self.agent_clocks.observe([(a.agent_id, a.pid, a.idle_s, a.running_s) for a in agents])

    def _agent_numbers(self, version: int) -> dict[str, float]:
        agents = [a for a in read_agents(self.client, self.config.run, self.config.agent.heartbeat_ttl_s) if not a.stale]
        numbers = {"hub/agents_alive": float(len(agents))}
        if agents:
            numbers["hub/agent_version_lag_mean"] = float(np.mean([version - a.param_version for a in agents]))
        idle = self.agent_clocks.update([(a.agent_id, a.pid, a.idle_s, a.running_s) for a in agents])
        if idle is None:  # no agent ran since the last flush (a short run, or agents gone at the stop)
            idle = self.agent_clocks.total()
        if idle is not None:
            numbers["hub/agent_idle_fraction"] = idle
        self.agent_counts.update({(a.agent_id, a.pid): (a.chunks_dropped, a.param_rejections) for a in agents})
        numbers["hub/agent_chunks_dropped_total"] = float(sum(c for c, _ in self.agent_counts.values()))
        numbers["hub/param_rejections_total"] = float(sum(r for _, r in self.agent_counts.values()))
        return numbers

    def _experience_numbers(self, use: ExperienceUse | None) -> dict[str, float]:
        if use is None:
            return {}
        wasted = use.dropped + self.unusable_steps + self.janitor_totals.unread_dropped * self.config.hub.sender.flush_steps
        numbers = {"hub/experience_used_steps_total": float(use.used), "hub/experience_wasted_steps_total": float(wasted),
                   "hub/experience_held_steps": float(use.held)}
        if use.used + wasted:
            numbers["hub/experience_used_fraction"] = use.used / (use.used + wasted)
        return numbers

    def maybe_flush(self, progress: LearnerProgress, replay_stats: dict[str, int], receiver: ReceiverStats,
                    force: bool = False) -> None:
        """Log and report once ``learner.metrics_every_s`` passed since the last flush (or ``force``).
        ``replay_stats``: the feed's :meth:`~surreal_redis.replay.feeds.Feed.stats`. Blocks for a
        few Redis round trips; hub numbers are skipped (logged) if Redis errs."""
        now = time.monotonic()
        dt = now - self._last_flush
        if not force and dt < self.config.learner.metrics_every_s:
            self._observe_agents(now)
            return
        self._last_flush = now
        metrics = self._metrics(progress, replay_stats, receiver, dt)
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, progress.iteration)
        status = self._status(progress, metrics, receiver, now)
        try:
            self.control.write_learner_status(status, ttl_s=max(60, int(10 * self.config.learner.metrics_every_s)))
        except redis.exceptions.OutOfMemoryError as exc:  # a report: the next flush replaces it
            log.warning("learner status not written, Redis is full (%s)", exc)
        self._reported = status
        self._log_line(progress, metrics, status)
        self.busy_s = 0.0
        for window in (self.losses, self.staleness, self.publish_s, self.episode_returns, self.episode_lengths):
            window.clear()

    def _metrics(self, progress: LearnerProgress, replay_stats: dict[str, int], receiver: ReceiverStats,
                 dt: float) -> dict[str, float | None]:
        """Everything one flush logs to MLflow, by name; ``dt``: seconds since the last flush."""
        metrics: dict[str, float | None] = {
            "charts/env_steps": float(progress.env_steps),
            "charts/env_steps_per_s": self._rate("steps", progress.env_steps, dt),
            "charts/updates_per_s": self._rate("updates", progress.iteration, dt),
            "charts/param_version": float(progress.param_version),
            "charts/episode_return_mean": progress.mean_return,
            "hub/ingest_mb_per_s": self._rate("bytes", self.ingest_bytes, dt) / 2**20,
            **receiver.as_metrics(),
            **self.janitor_totals.as_metrics(),
            "system/elapsed_s": progress.elapsed_s,
        }
        metrics.update(self._window_numbers())
        metrics["system/learner_busy_fraction"] = self.busy_s / dt if dt > 0 else 0.0
        metrics.update(self._experience_numbers(progress.use))
        if progress.use is not None:
            metrics["hub/lockstep_topups_total"] = float(progress.topups)
        if self.publish_s:
            metrics["hub/publish_delay_ms"] = 1000 * float(np.mean(self.publish_s))
        # a trainer's bare names go under losses/; a name with its own group (DDPG's "losses/...") stays
        metrics.update({k if "/" in k else f"losses/{k}": float(np.mean(v)) for k, v in self.losses.items() if v})
        metrics.update({f"system/replay_{k}": float(v) for k, v in replay_stats.items()})
        for numbers in (lambda: self._agent_numbers(progress.param_version), self._hub_numbers):
            try:
                metrics.update(numbers())
            except redis.RedisError as exc:
                log.warning("hub metrics unavailable: %s", exc)
        return metrics

    def _window_numbers(self) -> dict[str, float]:
        """Episodes, the latest eval, staleness (this flush window) and policy lag (whole run)."""
        numbers: dict[str, float] = {}
        if self.episode_returns:
            numbers["charts/episode_return"] = float(np.mean(self.episode_returns))
            numbers["charts/episode_length"] = float(np.mean(self.episode_lengths))
        if self.eval_score is not None:
            numbers["charts/eval_return"] = self.eval_score
        if self.staleness:
            values = np.asarray(self.staleness)
            numbers.update({f"hub/policy_staleness_p{q}": float(np.percentile(values, q)) for q in (50, 90)})
            numbers["hub/policy_staleness_max"] = float(values.max())
        if self.lags:
            numbers.update({f"hub/policy_lag_p{q}": float(lag_percentile(self.lags, q)) for q in (50, 90)})
            numbers["hub/policy_lag_max"] = float(max(self.lags))
            numbers.update({f"hub/policy_lag_share_{label.replace('+', '_up').replace('-', '_')}": share
                            for label, share in lag_shares(self.lags).items()})
        return numbers

    def _status(self, progress: LearnerProgress, metrics: dict[str, float | None], receiver: ReceiverStats,
                now: float) -> dict[str, Any]:
        """The learner status hash (``launch``'s progress line, ``status``, the summary)."""
        return {"iteration": progress.iteration, "version": progress.param_version, "env_steps": progress.env_steps,
                "mean_return": progress.mean_return, "eval_return": self.eval_score,
                "steps_per_s": metrics["charts/env_steps_per_s"], "updates_per_s": metrics["charts/updates_per_s"],
                "pid": os.getpid(), "time": time.time(), "elapsed_s": progress.elapsed_s, "state": "running",
                "every_s": self.config.learner.metrics_every_s,
                "sync": self.config.learner.on_policy_sync if progress.use is not None else "off-policy",
                "experience_used_fraction": metrics.get("hub/experience_used_fraction"),
                "experience_wasted_steps": metrics.get("hub/experience_wasted_steps_total"),
                "experience_unused_at_stop": self.unused_at_stop,
                "policy_lag_p50": metrics.get("hub/policy_lag_p50"), "policy_lag_p90": metrics.get("hub/policy_lag_p90"),
                "policy_lag_max": metrics.get("hub/policy_lag_max"),
                "policy_lag_shares": lag_shares(self.lags) if self.lags else None,
                "rho_clipped_fraction": metrics.get("losses/rho_clipped_fraction",
                                                    self._reported.get("rho_clipped_fraction")),
                "learner_busy": metrics["system/learner_busy_fraction"],
                "learner_busy_total": self.busy_total_s / max(now - self.started, 1e-9),
                "agent_idle": metrics.get("hub/agent_idle_fraction"), "agent_idle_total": self.agent_clocks.total(),
                "epochs_per_update": metrics.get("losses/epochs", self._reported.get("epochs_per_update")),
                "epochs_per_update_total": self.epochs_total / self.epoch_updates if self.epoch_updates else None,
                "kl_per_update": metrics.get("losses/approx_kl", self._reported.get("kl_per_update")),
                "dead_entries": receiver.dead, "pending_trimmed": receiver.pending_trimmed,
                "unread_trimmed": self.janitor_totals.unread_dropped,
                "agent_chunks_dropped": metrics.get("hub/agent_chunks_dropped_total")}

    def _log_line(self, progress: LearnerProgress, metrics: dict[str, float | None], status: dict[str, Any]) -> None:
        """The flush's line in the learner's log."""
        log.info("update %d | v%d | %d env steps (%.0f/s) | %.1f updates/s | return %s | eval %s | %s",
                 progress.iteration, progress.param_version, progress.env_steps, metrics["charts/env_steps_per_s"],
                 metrics["charts/updates_per_s"], fmt_number(progress.mean_return), fmt_number(self.eval_score),
                 use_summary(status))


def fmt_number(value: float | None, spec: str = ".1f", scale: float = 1.0, unit: str = "") -> str:
    """``value * scale`` formatted with ``spec`` and followed by ``unit``; ``-`` for None."""
    return "-" if value is None else f"{scale * value:{spec}}{unit}"


def _percent(value: float | None) -> str:
    return fmt_number(value, ".0f", 100, "%")


def progress_line(status: dict[str, Any], agents: int, num_agents: int) -> str:
    """A launch's progress line from the learner's last report ``status`` ({} before the first)
    and the ``agents`` alive of the ``num_agents`` configured."""
    if not status:
        return f"waiting for the learner... agents {agents}/{num_agents}"
    return (f"env steps {status['env_steps']} ({status['steps_per_s']:.0f}/s) | updates "
            f"{status['iteration']} ({status['updates_per_s']:.1f}/s) | params v{status['version']} | return "
            f"{fmt_number(status['mean_return'])} | eval {fmt_number(status['eval_return'])} | agents "
            f"{agents}/{num_agents} | {use_summary(status)} | {status['elapsed_s']:.0f}s")


def use_summary(status: dict[str, Any], whole_run: bool = False) -> str:
    """One line on how a learner status (:meth:`LearnerMetrics.maybe_flush`) says the run uses its
    experience and time: the used fraction, policy lag p90 (its shares, V-trace's clipped share),
    on-policy the passes per sample and the KL per update, learner busy, agents idle. Fields an
    older learner did not report show as ``-``. ``whole_run``: busy and idle over the whole run
    (else over the last flush window), and the steps left unused at the stop."""
    used = status.get("experience_used_fraction")
    line = "experience used " + fmt_number(used, ".1f", 100, "%")
    if whole_run and status.get("experience_unused_at_stop") is not None:
        line += f" (+{status['experience_unused_at_stop']} steps unused at the stop)"
    lag = status.get("policy_lag_p90")
    busy = status.get("learner_busy_total" if whole_run else "learner_busy")
    idle = status.get("agent_idle_total" if whole_run else "agent_idle")
    sync = f" [{status['sync']}]" if status.get("sync") else ""
    shares = status.get("policy_lag_shares")
    histogram = "" if not shares else " (" + " ".join(f"{k}:{_percent(v)}" for k, v in shares.items() if v) + ")"
    clipped = status.get("rho_clipped_fraction")
    rho = "" if clipped is None else f", rho clipped {_percent(clipped)}"
    epochs = status.get("epochs_per_update_total" if whole_run else "epochs_per_update")
    reuse = "" if epochs is None else f", passes/sample {epochs:.1f}"  # one gradient pass per epoch
    kl = status.get("kl_per_update")
    reuse += "" if kl is None else f", kl/update {kl:.2g}"
    return (f"{line}, policy lag p90 {fmt_number(lag, '.0f')}{histogram}{rho}{reuse}, "
            f"learner busy {_percent(busy)}, agents idle {_percent(idle)}{sync}")
