"""A pub/sub subscription on a connection of its own, for waits that a message may end early (an
agent's for a grant, a sender's for the learner to read its shard). A message only says "look
again": whoever waits reads its state after each one and after a timeout of its own, since a
message published while the subscription was down (a reconnect) is never delivered."""

from __future__ import annotations

import logging
import time

import redis

from surreal_redis.connection import CONNECTION_ERRORS, RedisClient
from surreal_redis.redis_cluster import refresh_topology

log = logging.getLogger(__name__)


class Subscription:
    """``channel``, subscribed by :meth:`open` and left by :meth:`pause` (keeping the connection)
    or :meth:`close`. A connection error propagates from any method and closes the subscription;
    the next :meth:`open` subscribes again on a new connection. Not thread-safe.
    """

    def __init__(self, client: RedisClient, channel: str) -> None:
        self.client, self.channel = client, channel
        self._pubsub: redis.client.PubSub | None = None
        self._subscribed = False

    @property
    def is_open(self) -> bool:
        return self._subscribed

    def open(self, timeout_s: float = 5.0) -> None:
        """Subscribe (a no-op when subscribed) and wait for the server's confirmation, so every
        message published after it returns is heard; at most ``timeout_s``, then
        ``redis.TimeoutError``."""
        if self._subscribed:
            return
        if self._pubsub is None:
            self._pubsub = self.client.pubsub()
        try:
            self._pubsub.subscribe(self.channel)
            deadline = time.monotonic() + timeout_s
            while True:  # what came before the confirmation (a paused subscription's tail) is old news
                left = deadline - time.monotonic()
                if left <= 0:
                    raise redis.TimeoutError(f"no confirmation of SUBSCRIBE {self.channel} in {timeout_s}s")
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message["type"] == "subscribe":
                    break
        except BaseException as exc:
            self.close()
            if isinstance(exc, CONNECTION_ERRORS):
                refresh_topology(self.client, exc)  # a cluster's pubsub never refreshes its slot map
            raise
        self._subscribed = True

    def drain(self) -> list[bytes]:
        """The messages received so far, oldest first, without blocking (subscribes first)."""
        self.open()
        received = []
        while (data := self._next(0.0)) is not None:
            received.append(data)
        return received

    def next(self, timeout: float) -> bytes | None:
        """The next message's data, waiting up to ``timeout`` seconds (subscribes first); None when
        none came."""
        self.open()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            data = self._next(left)
            if data is not None:
                return data
        return None

    def _next(self, timeout: float) -> bytes | None:
        assert self._pubsub is not None
        try:
            message = self._pubsub.get_message(timeout=timeout)
        except BaseException:
            self.close()
            raise
        if message is None or message["type"] != "message":
            return None
        data = message["data"]
        return data if isinstance(data, bytes) else str(data).encode()

    def pause(self) -> None:
        """Unsubscribe, keeping the connection, without waiting (the next :meth:`open` skips the
        confirmation). Messages published meanwhile are not delivered."""
        if not self._subscribed or self._pubsub is None:
            return
        self._subscribed = False
        try:
            self._pubsub.unsubscribe(self.channel)
        except CONNECTION_ERRORS as exc:  # nothing to leave on a broken connection
            log.debug("leaving %s failed: %s", self.channel, exc)
            self.close()

    def close(self) -> None:
        """Unsubscribe and drop the connection; harmless when closed."""
        self._subscribed = False
        if self._pubsub is not None:
            pubsub, self._pubsub = self._pubsub, None
            try:
                pubsub.close()
            except redis.RedisError as exc:  # closing a broken connection: nothing left to do
                log.debug("closing the subscription to %s failed: %s", self.channel, exc)
