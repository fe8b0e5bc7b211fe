"""Backpressure on the agent side: after each flush, the sender waits while the learner's unread
backlog on its shard is over ``max_lag`` (less the other agents' flushes), listening on the shard's
``reads`` channel for the learner's reads."""

from __future__ import annotations

import logging
import time
from typing import Protocol

import redis

from surreal_redis.connection import CONNECTION_ERRORS, Backoff, RedisClient
from surreal_redis.hub.channel import Subscription
from surreal_redis.hub.experience.backlog import read_backlog
from surreal_redis.hub.experience.insert import HubUnavailableError
from surreal_redis.keys import ShardKeys
from surreal_redis.outage import Waiter

log = logging.getLogger(__name__)

STOP_LOOK_S = 0.25  # a backpressure wait looks at the stop flag at least this often


class WaitSettings(Protocol):
    """What :class:`Backpressure` reads of the sender's config (seconds); read-only properties, so
    a frozen config satisfies it (like the receiver's settings protocols)."""

    @property
    def max_lag(self) -> int | None: ...
    @property
    def retry_base_s(self) -> float: ...
    @property
    def retry_cap_s(self) -> float: ...
    @property
    def backpressure_timeout_s(self) -> float | None: ...


class Backpressure:
    """One sender's waits on its shard's backlog (not thread-safe, like the sender).

    ``admit_below``: the unread backlog at or under which a flush goes out; ``stop`` ends a wait
    (the run is stopping). Counts: ``waits`` (flushes after which it waited), ``waited_s``.
    """

    def __init__(self, client: RedisClient, keys: ShardKeys, config: WaitSettings, admit_below: int,
                 stop: Waiter | None) -> None:
        self.client, self.keys, self.config, self.admit_below, self.stop = client, keys, config, admit_below, stop
        self.shard = keys.shard
        self._reads = Subscription(client, keys.reads)  # subscribed only while waiting on the backlog
        self.waits = 0
        self.waited_s = 0.0

    def close(self) -> None:
        """Drop the connection the wait listens on (opened again by the next wait)."""
        self._reads.close()

    def wait(self) -> None:
        """After a flush: block while the learner's unread backlog on our shard exceeds
        ``admit_below``, or until ``stop`` is set.

        Once over, the sender subscribes to the shard's ``reads`` channel and looks at the backlog
        again after each read the learner announces there (a backoff alone oversleeps while the
        learner drains the backlog), and at the latest after a capped backoff delay (a lost
        message or subscription); it leaves the channel when the wait ends."""
        cfg, stop = self.config, self.stop
        if not cfg.max_lag:
            return
        backoff = Backoff(cfg.retry_base_s, cfg.retry_cap_s)  # between looks at a backlog over max_lag
        failures = Backoff(cfg.retry_base_s, cfg.retry_cap_s)  # between looks that failed
        start = time.monotonic()
        listening = counted = False
        try:
            while stop is None or not stop.is_set():
                try:
                    unread = read_backlog(self.client, self.keys, self.admit_below + 1).unread
                except CONNECTION_ERRORS as exc:
                    log.warning("shard %d: backlog check failed (%s); retrying", self.shard, exc)
                    unread = None
                if unread is not None:
                    failures.reset()
                    if unread <= self.admit_below:
                        break
                    if not counted:  # the first look over: this flush waits
                        counted = True
                        self.waits += 1
                waited = time.monotonic() - start
                if cfg.backpressure_timeout_s is not None and waited > cfg.backpressure_timeout_s:
                    raise HubUnavailableError(
                        f"shard {self.shard}: learner backlog {unread} > max_lag {cfg.max_lag} for "
                        f"{waited:.1f}s (sender.backpressure_timeout_s)")
                if unread is None:  # the read that woke this look is not announced again: retry soon
                    self._await_read(failures.next_delay(), listening=False)
                    continue
                if not listening:
                    listening = self._listen_for_reads()
                    if listening:
                        continue  # a read before the subscription went unheard: look again first
                self._await_read(backoff.next_delay(), listening)
        finally:
            if listening:
                self._reads.pause()
            self.waited_s += time.monotonic() - start

    def _listen_for_reads(self) -> bool:
        """Subscribe to the shard's reads channel; False when that failed (logged)."""
        try:
            self._reads.open()
        except (*CONNECTION_ERRORS, redis.ResponseError) as exc:
            log.warning("shard %d: not listening for the learner's reads (%s); polling the backlog", self.shard, exc)
            return False
        return True

    def _await_read(self, timeout: float, listening: bool) -> None:
        """Up to ``timeout`` seconds: until the learner announces a read (when ``listening``) or
        ``stop`` is set, which is looked at every :data:`STOP_LOOK_S` at least."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.stop is not None and self.stop.is_set():
                return
            if not listening:
                if self.stop is None:
                    time.sleep(left)
                else:
                    self.stop.wait(left)
                return
            try:
                if self._reads.next(min(left, STOP_LOOK_S)) is not None:
                    self._reads.drain()  # reads announced meanwhile: one look covers them all
                    return
            except CONNECTION_ERRORS as exc:
                log.debug("shard %d: the reads subscription broke (%s); polling", self.shard, exc)
                listening = False
