"""Riding out a Redis outage in a long-running loop: :data:`OUTAGE_ERRORS` names what counts as
one, :class:`OutageGuard` backs off between attempts and wakes at once when the loop is stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

import redis

from surreal_redis.connection import CONNECTION_ERRORS, Backoff

log = logging.getLogger(__name__)

# A server that is still loading its dataset after a restart is an outage too, and so is a cluster
# that has lost a primary and not yet promoted its replica (CLUSTERDOWN, no node for a slot).
OUTAGE_ERRORS = (*CONNECTION_ERRORS, redis.exceptions.BusyLoadingError, redis.exceptions.ClusterDownError,
                 redis.exceptions.SlotNotCoveredError, redis.exceptions.TryAgainError)


class Waiter(Protocol):
    """What a loop stops on: ``threading.Event`` and :class:`~surreal_redis.runtime.StopFlag`."""

    def wait(self, timeout: float) -> bool: ...

    def is_set(self) -> bool: ...


T = TypeVar("T")


class OutageGuard:
    """Capped jittered backoff, one warning per failed attempt, one info line when Redis answers
    again. :meth:`call` retries one call until it succeeds; a loop of its own shape calls
    :meth:`failed` in its ``except OUTAGE_ERRORS`` branch and :meth:`succeeded` after a good round.
    """

    def __init__(self, who: str, stop: Waiter, base: float = 0.1, cap: float = 5.0,
                 errors: tuple[type[BaseException], ...] | None = None) -> None:
        self.who, self.stop = who, stop
        self.errors = OUTAGE_ERRORS if errors is None else errors
        self.backoff = Backoff(base, cap)

    @property
    def failing(self) -> bool:
        return self.backoff.failures > 0

    def failed(self, exc: BaseException) -> None:
        """Log the outage and block for the next backoff delay (or until ``stop``)."""
        delay = self.backoff.next_delay()
        log.warning("%s: Redis unavailable (%s); retrying in %.1fs", self.who, exc, delay)
        self.stop.wait(delay)

    def succeeded(self) -> None:
        if self.backoff.failures:
            log.info("%s: Redis reachable again", self.who)
            self.backoff.reset()

    def call(self, fn: Callable[[], T]) -> T | None:
        """``fn()`` once it succeeds; blocks through the outage; None when stopped first."""
        while not self.stop.is_set():
            try:
                result = fn()
            except self.errors as exc:
                self.failed(exc)
                continue
            self.succeeded()
            return result
        return None

