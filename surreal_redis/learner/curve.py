"""The points of a run's return curves, as the learner logs them to MLflow (``curve/`` metrics,
whose MLflow step is env steps, not the learner's update count):

- ``curve/train_return``: the mean return of the last ``tracking.curve_window`` training episodes,
  a point at the run's first episode and then each time the env steps of the finished training
  episodes pass another ``tracking.curve_every_env_steps``. Its step is the env steps those
  episodes played, summed over every record in the ``episodes`` stream (their ``length``), so a
  15 s CartPole run has tens of points from its first episodes on, whatever the learner's report
  interval. ``curve/train_elapsed_s``: the learner's wall seconds when each such episode ended.
- ``curve/eval_return``: each complete eval (``eval.episodes`` of one parameter version), at the
  env steps and wall seconds of the learner when it published that version (the untrained v1 at
  0); ``curve/eval_elapsed_s`` beside it. The launcher appends the final eval
  (:mod:`surreal_redis.launcher.final_curve`), also as ``curve/final_eval_return``.

Two records of one point share step and timestamp, which is how :mod:`surreal_redis.plots` pairs
them. Points wait in :class:`CurveLog` until :meth:`CurveLog.flush` hands them to the tracker,
which writes them in one batch in its own process.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from surreal_redis.hub.run.episodes import EpisodeRecord

TRAIN_RETURN = "curve/train_return"
TRAIN_ELAPSED_S = "curve/train_elapsed_s"
EVAL_RETURN = "curve/eval_return"
EVAL_ELAPSED_S = "curve/eval_elapsed_s"
FINAL_EVAL_RETURN = "curve/final_eval_return"
MAX_VERSIONS = 10_000  # publish points kept for the evals still to come (oldest forgotten first)

CurveRecord = tuple[str, float, int, int]
"""One MLflow metric record: (key, value, step = env steps, timestamp in unix ms)."""


class PointLog(Protocol):
    """Where points go: a :class:`~surreal_redis.tracking.Tracker` or one of its wrappers."""

    def log_points(self, records: list[CurveRecord]) -> None: ...


class CurvePoint(NamedTuple):
    """One point of a curve: the run's env steps and the learner's wall seconds at it."""

    env_steps: int
    elapsed_s: float
    value: float


def point_records(point: CurvePoint, value_key: str, elapsed_key: str, timestamp_ms: int) -> list[CurveRecord]:
    """The MLflow records of ``point``: its value and its seconds, sharing step and timestamp."""
    return [(value_key, point.value, point.env_steps, timestamp_ms),
            (elapsed_key, point.elapsed_s, point.env_steps, timestamp_ms)]


class TrainCurve:
    """The train curve from training episode records, in the order the learner reads them:
    :meth:`add` returns a point for the first record and for each record that takes the summed
    episode lengths past the next multiple of ``every_env_steps``."""

    def __init__(self, window: int, every_env_steps: int) -> None:
        if window < 1:
            raise ValueError(f"tracking.curve_window must be >= 1 episodes, got {window}")
        if every_env_steps < 1:
            raise ValueError(f"tracking.curve_every_env_steps must be >= 1, got {every_env_steps}")
        self.window, self.every = window, every_env_steps
        self.returns: deque[float] = deque(maxlen=window)
        self.env_steps = 0
        self.episodes = 0
        self._next = 0  # the env steps at which the next point is due (0: at the first episode)

    def count(self, record: EpisodeRecord) -> bool:
        """Take ``record`` into the window and the step count; True when a point is due."""
        self.returns.append(record.episode_return)
        self.env_steps += max(0, record.length)
        self.episodes += 1
        if self.env_steps < self._next:
            return False
        self._next = (self.env_steps // self.every + 1) * self.every
        return True

    def add(self, record: EpisodeRecord, elapsed_s: float) -> CurvePoint | None:
        """The point ``record`` completes (the window's mean at ``elapsed_s``), or None."""
        if not self.count(record):
            return None
        return CurvePoint(self.env_steps, elapsed_s, sum(self.returns) / len(self.returns))

    def resume(self, env_steps: int) -> None:
        """After the records of an earlier run of the experiment were counted (no points):
        continue from at least ``env_steps`` (the checkpoint's), which a Redis that lost or
        trimmed those records makes the larger."""
        self.env_steps = max(self.env_steps, env_steps)
        self._next = (self.env_steps // self.every + 1) * self.every


class CurveLog:
    """Collects the learner's curve points and hands them to ``tracker`` at :meth:`flush`, at
    most once per ``every_s`` seconds (the learner's report interval: one write each).
    ``elapsed()``: the learner's training seconds (earlier runs of a resumed experiment included);
    ``env_steps()``: its env steps."""

    def __init__(self, tracker: PointLog | None, window: int, every_env_steps: int,
                 elapsed: Callable[[], float], env_steps: Callable[[], int], every_s: float = 0.0) -> None:
        self.tracker, self.elapsed, self.env_steps, self.every_s = tracker, elapsed, env_steps, every_s
        self._flushed = time.monotonic()
        self.train = TrainCurve(window, every_env_steps)
        self.published: dict[int, tuple[int, float]] = {}  # version -> (env steps, elapsed s) at its publish
        self.pending: list[CurveRecord] = []
        self._train_s = 0.0  # the seconds of the last train point
        self._stamp = 0  # the last timestamp given (ms): each point gets its own

    def count(self, records: Iterable[EpisodeRecord]) -> None:
        """Count the training ``records`` an earlier run of the experiment already drew (a
        resume reads them again): into the window and the steps, no point."""
        for record in records:
            if record.mode == "train":
                self.train.count(record)

    def resumed(self) -> None:
        """Every earlier record counted: continue from at least the learner's env steps."""
        self.train.resume(self.env_steps())

    def episodes(self, records: Iterable[EpisodeRecord]) -> None:
        """Training ``records`` just read (oldest first). A point's seconds are the learner's when
        its episode ended (the record's time), kept between this read and the previous point."""
        now_unix, elapsed = time.time(), self.elapsed()
        for record in records:
            if record.mode != "train":
                continue
            ended = elapsed - min(max(0.0, now_unix - record.time), 60.0)  # another host's clock: bounded
            point = self.train.add(record, max(ended, self._train_s))
            if point is not None:
                self._train_s = point.elapsed_s
                self.pending += point_records(point, TRAIN_RETURN, TRAIN_ELAPSED_S, self._timestamp(record.time))

    def _timestamp(self, unix_s: float) -> int:
        """``unix_s`` in ms (at most now: another host's clock may be ahead), after every timestamp
        given before, so that no two points share one."""
        self._stamp = max(int(min(unix_s, time.time()) * 1000), self._stamp + 1)
        return self._stamp

    def publish(self, version: int) -> None:
        """Parameter ``version`` was just published: its eval is drawn at these env steps and seconds."""
        self.published[version] = (self.env_steps(), self.elapsed())
        while len(self.published) > MAX_VERSIONS:
            del self.published[next(iter(self.published))]

    def evaluated(self, version: int, score: float) -> None:
        """A complete eval of ``version`` scored ``score``; drawn where it was published (at the
        learner's env steps now for a version this learner did not publish: an earlier run's)."""
        steps, seconds = self.published.get(version) or (self.env_steps(), self.elapsed())
        self.pending += point_records(CurvePoint(steps, seconds, score), EVAL_RETURN, EVAL_ELAPSED_S,
                                      self._timestamp(time.time()))

    def flush(self, force: bool = False) -> None:
        """Hand the points collected since the last flush to the tracker (it writes them off
        this thread), once ``every_s`` passed since the last flush (or ``force``); without a
        tracker they are dropped."""
        if not force and time.monotonic() - self._flushed < self.every_s:
            return
        self._flushed = time.monotonic()
        if self.pending and self.tracker is not None:
            self.tracker.log_points(self.pending)
        self.pending = []

