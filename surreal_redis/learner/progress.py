"""How far the run got: the episode scores agents and evaluators record, and the rules that stop
the run by itself (``stop.max_env_steps``, ``stop.max_seconds``, ``stop.target_return`` on the
train or the eval return, the end of the trainer's annealing schedule). A stop request or a
signal is the loop's business, not these rules'."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from surreal_redis.checkpoint import CheckpointManager
from surreal_redis.hub.run.episodes import EpisodeReader, TrainReturns
from surreal_redis.hub.run.heartbeat import AgentStatus
from surreal_redis.learner.curve import CurveLog
from surreal_redis.learner.metrics import LearnerMetrics

if TYPE_CHECKING:
    from surreal_redis.config import ExperimentConfig, StopConfig

log = logging.getLogger(__name__)


class Scores:
    """Episode records read from the hub: training returns (the charts' mean, the train-return
    stop rule) and complete evals (``eval.episodes`` of one parameter version: the latest score,
    the best-k checkpoints), both also drawn into ``curve`` (:mod:`surreal_redis.learner.curve`).
    ``iteration()`` and ``state()``: the learner's update count and its checkpoint state, for a
    best-k checkpoint of the current parameters."""

    def __init__(self, episodes: EpisodeReader, config: ExperimentConfig, metrics: LearnerMetrics,
                 checkpoints: CheckpointManager, curve: CurveLog, *, iteration: Callable[[], int],
                 state: Callable[[], dict[str, Any]]) -> None:
        self._episodes, self._config, self._metrics, self._checkpoints = episodes, config, metrics, checkpoints
        self.curve = curve
        self._iteration, self._state = iteration, state
        self.train_returns = TrainReturns(config.stop.return_window)
        self.eval_by_version: dict[int, list[float]] = {}  # scores of evals not complete yet
        self.evals_from_version = 0  # evals of older parameters are not this learner's (see resume)
        self.last_eval: float | None = None

    def resume(self, version: int) -> None:
        """After a restore to parameter ``version``: skip the episodes already recorded (their
        evals were credited by the run that wrote them; train returns still count for the stop
        window and the train curve's steps). Reads the episode stream to its end."""
        self.evals_from_version = version
        while records := self._episodes.read_new():
            self.train_returns.add(records)
            self.curve.count(records)
        self.curve.resumed()

    def read(self) -> None:
        """Take the episodes recorded since the last read (one XREAD per 10k records)."""
        records = self._episodes.read_new()
        self.curve.episodes(records)
        for record in records:
            if record.mode == "train":
                self.train_returns.add([record])
                self._metrics.observe_episode(record)
                continue
            if record.version < self.evals_from_version:
                continue
            scores = self.eval_by_version.setdefault(record.version, [])
            scores.append(record.episode_return)
            if len(scores) == self._config.eval.episodes:
                del self.eval_by_version[record.version]
                self._on_eval(record.version, float(np.mean(scores)))

    def mean_return(self) -> float | None:
        """Mean of the recent training returns (None before the first episode)."""
        return self.train_returns.mean()

    def _on_eval(self, version: int, score: float) -> None:
        """A complete eval of parameter version ``version``: log it and keep the best-k."""
        self.last_eval = score
        self._metrics.observe_eval(score)
        self.curve.evaluated(version, score)
        keep = self._config.checkpoint.keep_best
        best = self._checkpoints.best()
        if keep and (len(best) < keep or score > best[-1][0]):
            # The current state is at most a few updates past the evaluated version.
            iteration = self._iteration()
            if not self._checkpoints.path_for(iteration).exists():
                self._checkpoints.save(self._state(), iteration)
            self._checkpoints.record_score(iteration, score)
            log.info("eval of v%d scored %.2f: checkpoint %d kept among the best", version, score, iteration)


class StopRules:
    """The conditions that stop a run by itself. ``read_agents()``: the agents that heartbeat
    (live ones), for the train-return rule's window per agent; ``schedule_done()``: the trainer's
    :meth:`~surreal_redis.algos.base.Trainer.schedule_done`."""

    def __init__(self, stop: StopConfig, scores: Scores, read_agents: Callable[[], Sequence[AgentStatus]],
                 schedule_done: Callable[[], str] = lambda: "") -> None:
        self._stop, self._scores, self._read_agents = stop, scores, read_agents
        self._schedule_done = schedule_done

    def update_reason(self) -> str:
        """Why the run stops before its next update ("" if it goes on): the trainer's schedule
        is done (a learning rate annealed to 0 learns nothing). Asked before every update; no
        Redis call."""
        return self._schedule_done()

    def limit_reason(self, env_steps: int, elapsed_s: float) -> str:
        """Why the step or time limit stops the run ("" if neither is reached); no Redis call."""
        stop = self._stop
        if stop.max_env_steps is not None and env_steps >= stop.max_env_steps:
            return f"reached {env_steps} env steps (stop.max_env_steps={stop.max_env_steps})"
        if stop.max_seconds is not None and elapsed_s >= stop.max_seconds:
            return f"ran {elapsed_s:.0f}s (stop.max_seconds={stop.max_seconds})"
        return ""

    def stop_reason(self, env_steps: int, elapsed_s: float) -> str:
        """Why the run stops now ("" if it goes on). The train-return rule reads the agents'
        heartbeats (one HGETALL)."""
        stop = self._stop
        limit = self.limit_reason(env_steps, elapsed_s)
        if limit:
            return limit
        if stop.target_return is None:
            return ""
        last_eval = self._scores.last_eval
        if stop.target_metric == "eval":
            if last_eval is not None and last_eval >= stop.target_return:
                return f"eval return {last_eval:.1f} reached stop.target_return={stop.target_return}"
            return ""
        # one agent's records alone cannot reach it: a window per agent id, over the agents that heartbeat
        score = self._scores.train_returns.stop_score([a.agent_id for a in self._read_agents()])
        if score is not None and score >= stop.target_return:
            return (f"train return {score:.1f} (lower median over agents of each one's mean over its share of "
                    f"the last {stop.return_window} episodes) reached stop.target_return={stop.target_return}")
        return ""
