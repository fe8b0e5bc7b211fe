"""On-policy FIFO replay: each chunk is handed to the learner once, in arrival order. Nothing is
dropped silently: chunks too stale for the learner's parameters, and chunks pushed out by the
capacity bound, are counted (:meth:`FIFOReplay.stats`) and logged. A dropped chunk leaves its
rewards and episode ends in its place (:class:`SkippedSteps`), handed out in stream order
(:meth:`FIFOReplay.skipped`): the learner's reward scaler continues each env stream through them
and resets its running return at the episodes they end.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Literal

from surreal_redis.chunks import Chunk, SkippedSteps

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FIFOReplayConfig:
    """Settings of :class:`FIFOReplay`."""

    capacity_steps: int = 65_536
    """most env steps held; beyond it chunks are dropped (see ``when_full``)."""
    max_policy_lag: int | None = 1
    """a chunk is dropped once ``learner_version - min(chunk.policy_version)`` exceeds this; None
    keeps every chunk however old."""
    when_full: Literal["drop_oldest", "drop_newest"] = "drop_oldest"
    """``"drop_oldest"`` makes room for the new chunk, ``"drop_newest"`` rejects it."""

    def __post_init__(self) -> None:
        if self.capacity_steps < 1:
            raise ValueError(f"capacity_steps must be >= 1, got {self.capacity_steps}")
        if self.max_policy_lag is not None and self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0 or None, got {self.max_policy_lag}")
        if self.when_full not in ("drop_oldest", "drop_newest"):
            raise ValueError(f"when_full must be 'drop_oldest' or 'drop_newest', got {self.when_full!r}")


class FIFOReplay:
    """Queue of experience chunks for PPO. Thread-safe (hub reader threads insert while the learner
    takes); no method blocks.

    A dropped chunk stays in the queue as its :class:`SkippedSteps` (no steps held), where it was:
    an env stream's steps come out in the order it made them. Dropping keeps that order simple:
    a stream's chunks carry growing policy versions, so the stale ones are its oldest, as are those
    ``drop_oldest`` pushes out; only ``drop_newest`` drops one behind chunks still queued."""

    def __init__(self, config: FIFOReplayConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._queue: collections.deque[Chunk | SkippedSteps] = collections.deque()
        self._skipped_before: list[SkippedSteps] = []  # popped: before the chunks taken with them
        self._skipped_after: list[SkippedSteps] = []  # popped: after a chunk taken of their stream
        self._taken_streams: set[tuple[int, int]] = set()  # (agent, env) of the chunks taken since skipped()
        self._steps = 0
        self._learner_version = 0
        self._stats = dict.fromkeys(
            ("inserted_steps", "taken_steps", "dropped_stale_chunks", "dropped_stale_steps",
             "dropped_full_chunks", "dropped_full_steps"), 0)

    def __len__(self) -> int:
        return self._steps  # env steps waiting to be taken

    @property
    def learner_version(self) -> int:
        return self._learner_version  # staleness is measured against it

    def stats(self) -> dict[str, int]:
        with self._lock:  # cumulative counters
            return dict(self._stats)

    def insert(self, chunk: Chunk) -> None:
        """Queue ``chunk`` unless it is already too stale; may drop chunks to respect capacity
        (a chunk longer than ``capacity_steps`` is dropped as full)."""
        if chunk.num_steps < 1:
            raise ValueError(f"chunk from agent {chunk.agent_id} env {chunk.env_index} has no steps")
        with self._lock:
            # a dropped newest chunk stays last of its stream: its skipped steps go to the end
            if self._is_stale(chunk):
                self._queue.append(self._drop("stale", chunk))
                return
            if chunk.num_steps > self.config.capacity_steps:  # could never fit
                self._queue.append(self._drop("full", chunk))
                return
            if self._steps + chunk.num_steps > self.config.capacity_steps and self.config.when_full == "drop_newest":
                self._queue.append(self._drop("full", chunk))
                return
            front: list[SkippedSteps] = []
            while self._steps + chunk.num_steps > self.config.capacity_steps:
                oldest = self._queue.popleft()
                if isinstance(oldest, Chunk):
                    self._steps -= oldest.num_steps
                    oldest = self._drop("full", oldest)
                front.append(oldest)
            self._queue.extendleft(reversed(front))  # the oldest steps stay first
            self._queue.append(chunk)
            self._steps += chunk.num_steps
            self._stats["inserted_steps"] += chunk.num_steps

    def set_learner_version(self, version: int) -> None:
        """Advance the learner's parameter version and drop the chunks that became too stale."""
        with self._lock:
            if version < self._learner_version:
                raise ValueError(f"learner version must not go back: {version} < {self._learner_version}")
            self._learner_version = version
            if self.config.max_policy_lag is None:
                return
            kept: collections.deque[Chunk | SkippedSteps] = collections.deque()
            for chunk in self._queue:
                if isinstance(chunk, Chunk) and self._is_stale(chunk):
                    self._steps -= chunk.num_steps
                    kept.append(self._drop("stale", chunk))
                else:
                    kept.append(chunk)
            self._queue = kept

    def take(self, num_steps: int) -> list[Chunk]:
        """Remove and return the fewest oldest chunks holding at least ``num_steps`` steps (up to a
        chunk's length more); ``[]`` if fewer are waiting."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        with self._lock:
            if self._steps < num_steps:
                return []
            taken: list[Chunk] = []
            count = 0
            while count < num_steps:
                chunk = self._queue.popleft()
                if isinstance(chunk, SkippedSteps):
                    self._pass_over(chunk)
                    continue
                taken.append(chunk)
                self._taken_streams.add((chunk.agent_id, chunk.env_index))
                count += chunk.num_steps
            self._steps -= count
            self._stats["taken_steps"] += count
            return taken

    def skipped(self) -> tuple[list[SkippedSteps], list[SkippedSteps]]:
        """The dropped chunks' steps that :meth:`take` passed over, and those at the head of the
        queue (before every chunk held), as two lists to hand to the learner in order: ``before``
        the last take's chunks (or now, when nothing was taken) and ``after`` them (each follows a
        chunk of its own stream in that take; with ``drop_newest`` only). Clears both."""
        with self._lock:
            while self._queue and isinstance(head := self._queue[0], SkippedSteps):
                self._queue.popleft()
                self._pass_over(head)
            before, after = self._skipped_before, self._skipped_after
            self._skipped_before, self._skipped_after = [], []
            self._taken_streams.clear()
            return before, after

    def _pass_over(self, skipped: SkippedSteps) -> None:
        """``skipped`` leaves the queue: after the last take's chunks if one was of its stream."""
        after = (skipped.agent_id, skipped.env_index) in self._taken_streams
        (self._skipped_after if after else self._skipped_before).append(skipped)

    def _is_stale(self, chunk: Chunk) -> bool:
        lag = self.config.max_policy_lag
        return lag is not None and self._learner_version - int(chunk.policy_version.min()) > lag

    def _drop(self, reason: str, chunk: Chunk) -> SkippedSteps:
        """Count and log ``chunk``'s drop; returns what stays of it in the queue."""
        chunks = self._stats[f"dropped_{reason}_chunks"] + 1
        self._stats[f"dropped_{reason}_chunks"] = chunks
        self._stats[f"dropped_{reason}_steps"] += chunk.num_steps
        # warn on the 1st, 10th, 100th... drop: visible without flooding the log
        level = logging.WARNING if str(chunks).rstrip("0") == "1" else logging.DEBUG
        logger.log(level, "FIFO replay dropped a %s chunk (agent %s env %s, %d steps, policy versions "
                   "%d..%d, learner version %d); %d %s chunks dropped so far", reason, chunk.agent_id,
                   chunk.env_index, chunk.num_steps, int(chunk.policy_version.min()),
                   int(chunk.policy_version.max()), self._learner_version, chunks, reason)
        return SkippedSteps.of(chunk)
