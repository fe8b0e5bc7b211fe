"""Rate limiters with Reverb's semantics: when may the learner sample, and when may data go in.

A limiter counts inserted and sampled items (each transition in a batch is one sample). It never
blocks: a False answer is the caller's cue to do the other thing (read more experience, or train).

- ``can_sample(n)``: at least ``min_size_to_sample`` items were inserted, and
  ``inserts * samples_per_insert - samples - n >= min_diff``.
- ``can_insert(n)``: always while ``inserts + n <= min_size_to_sample``; after that,
  ``(inserts + n) * samples_per_insert - samples <= max_diff``.

Unlike Reverb, deletions are not counted: a ring replay never shrinks once full.
"""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass


class RateLimiter:
    """Counts inserts and samples, and keeps ``inserts * samples_per_insert - samples`` inside
    ``[min_diff, max_diff]`` once ``min_size_to_sample`` items are in. Thread-safe; no method blocks.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float,
                 max_diff: float) -> None:
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        if not min_diff <= max_diff:
            raise ValueError(f"min_diff ({min_diff}) must be <= max_diff ({max_diff})")
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.min_diff = min_diff
        self.max_diff = max_diff
        self._lock = threading.Lock()
        self._inserts = 0
        self._samples = 0

    @property
    def inserts(self) -> int:
        return self._inserts

    @property
    def samples(self) -> int:
        return self._samples

    def can_sample(self, n: int = 1) -> bool:
        """Whether sampling ``n`` more items keeps the ratio in bounds (and the replay is big enough)."""
        _check_count(n)
        with self._lock:
            if self._inserts < self.min_size_to_sample:
                return False
            return self._inserts * self.samples_per_insert - self._samples - n >= self.min_diff

    def sample_allowance(self) -> int:
        """How many items may be sampled now without leaving the bounds (0 before
        ``min_size_to_sample`` inserts; ``sys.maxsize`` when nothing bounds sampling)."""
        with self._lock:
            if self._inserts < self.min_size_to_sample:
                return 0
            allowance = self._inserts * self.samples_per_insert - self._samples - self.min_diff
        if math.isinf(allowance):
            return sys.maxsize
        return max(0, math.floor(allowance))

    def can_insert(self, n: int = 1) -> bool:
        """Whether inserting ``n`` more items keeps the ratio in bounds."""
        _check_count(n)
        with self._lock:
            if self._inserts + n <= self.min_size_to_sample:
                return True
            return (self._inserts + n) * self.samples_per_insert - self._samples <= self.max_diff

    def record_insert(self, n: int = 1) -> None:
        """Count ``n`` inserted items (whether or not :meth:`can_insert` allowed them)."""
        _check_count(n)
        with self._lock:
            self._inserts += n

    def record_sample(self, n: int = 1) -> None:
        """Count ``n`` sampled items (a learner step's batch size)."""
        _check_count(n)
        with self._lock:
            self._samples += n

    def state_dict(self) -> dict[str, int]:
        """The counts (``inserts``, ``samples``), for a checkpoint: a limiter restored with them
        keeps the ratio where the checkpointed one left it."""
        with self._lock:
            return {"inserts": self._inserts, "samples": self._samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Inverse of :meth:`state_dict`."""
        inserts, samples = int(state["inserts"]), int(state["samples"])
        if inserts < 0 or samples < 0:
            raise ValueError(f"rate limiter counts must be >= 0, got inserts {inserts}, samples {samples}")
        with self._lock:
            self._inserts, self._samples = inserts, samples


def _check_count(n: int) -> None:
    if n < 1:
        raise ValueError(f"item count must be >= 1, got {n}")


class MinSize(RateLimiter):
    """Blocks sampling until ``min_size_to_sample`` items were inserted; never blocks inserts."""

    def __init__(self, min_size_to_sample: int) -> None:
        super().__init__(1.0, min_size_to_sample, -math.inf, math.inf)


class SampleToInsertRatio(RateLimiter):
    """Keeps ``samples / inserts`` near ``samples_per_insert`` once ``min_size_to_sample`` items are in
    (inserts are free until then). ``error_buffer``: how far ``(inserts - min_size_to_sample) *
    samples_per_insert - samples`` may drift either way before sampling (below) or inserting (above)
    is refused; at least ``max(1, samples_per_insert)``, or one side could block forever.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float) -> None:
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
        if not error_buffer >= max(1.0, samples_per_insert):
            raise ValueError(
                f"error_buffer ({error_buffer}) must be >= max(1, samples_per_insert) = "
                f"{max(1.0, samples_per_insert)}: a smaller buffer can block samples or inserts forever")
        offset = samples_per_insert * min_size_to_sample  # count only what happens after stage 1
        super().__init__(samples_per_insert, min_size_to_sample, offset - error_buffer, offset + error_buffer)


@dataclass(frozen=True)
class RateLimiterConfig:
    """Which limiter the learner uses: :class:`MinSize` when ``samples_per_insert`` is None,
    else :class:`SampleToInsertRatio`."""

    min_size_to_sample: int = 1
    """items (transitions) in replay before the first sample."""
    samples_per_insert: float | None = None
    """target replay ratio (sampled transitions per inserted one), or None."""
    error_buffer: float | None = None
    """allowed drift of the ratio, in samples; required with ``samples_per_insert``."""

    def __post_init__(self) -> None:
        if self.min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {self.min_size_to_sample}")
        if (self.samples_per_insert is None) != (self.error_buffer is None):
            raise ValueError(f"samples_per_insert ({self.samples_per_insert}) and error_buffer "
                             f"({self.error_buffer}) must be set together")
        if self.samples_per_insert is not None:
            self.make()  # the limiter's own checks, at config time

    def make(self) -> RateLimiter:
        """A fresh limiter with zero counts."""
        if self.samples_per_insert is None or self.error_buffer is None:
            return MinSize(self.min_size_to_sample)
        return SampleToInsertRatio(self.samples_per_insert, self.min_size_to_sample, self.error_buffer)
