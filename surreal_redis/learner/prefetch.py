"""The learner's prefetch: a thread that reads and decodes experience ahead of the training loop
into a queue bounded by chunks.

Bounded by chunks, not by reads: a read often returns fewer chunks than asked for, so a queue of
a few reads could hold less than an update needs while keeping the prefetcher from reading (the
agents then wait on the backlog and produce in bursts). The prefetcher asks for no more chunks
than the queue has room for, so the queue fills to its capacity.
"""

from __future__ import annotations

import queue
import threading
from collections import deque

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceivedChunk
from surreal_redis.outage import OutageGuard

ROOM_WAIT_S = 1.0
"""How long the prefetcher waits for room before it looks at its stop event again. A full queue is
the off-policy learner's usual state (it stops taking batches while it owes updates), so this
wait is long: each wake-up takes the GIL from the update beside it. :meth:`Prefetcher.halt`
ends the wait at once."""
READ_WAIT_MS = 50
"""How long a read waits at most for new entries (less when ``hub.receiver.block_ms`` is less)
before the prefetcher looks at its stop event again: a stopping learner joins the thread before
it reports its stop (the final eval waits for that report), and once waited out a whole
``block_ms`` (1 s) there. An idle learner reads 20 times a second."""


class PrefetchQueue:
    """Batches of received chunks, oldest first, holding about ``capacity`` chunks: :meth:`room`
    says how many more fit, :meth:`put` never blocks (a read may return a few more than asked for:
    the receiver rounds up to its shard count). Thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 chunk, got {capacity}")
        self.capacity = capacity
        self._batches: deque[list[ReceivedChunk]] = deque()
        self._chunks = 0
        self._closed = False
        self._changed = threading.Condition()

    def put(self, batch: list[ReceivedChunk]) -> None:
        """Queue ``batch`` (an empty one is ignored)."""
        if not batch:
            return
        with self._changed:
            self._batches.append(batch)
            self._chunks += len(batch)
            self._changed.notify_all()

    def get(self, timeout: float) -> list[ReceivedChunk]:
        """The oldest batch, waiting up to ``timeout`` seconds for one (then ``queue.Empty``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._batches, timeout):
                raise queue.Empty
            batch = self._batches.popleft()
            self._chunks -= len(batch)
            self._changed.notify_all()
            return batch

    def room(self, timeout: float = 0.0) -> int:
        """Chunks that still fit, waiting up to ``timeout`` seconds for some room (0 if none came,
        or once the queue is closed)."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or self._chunks < self.capacity, timeout)
            return 0 if self._closed else max(0, self.capacity - self._chunks)

    def close(self) -> None:
        """No more room from now on: a :meth:`room` wait ends at once. :meth:`put` still queues
        (a read under way when the learner stops is counted by :meth:`steps`)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def steps(self) -> int:
        """Env steps queued (read from Redis, not in the feed yet)."""
        with self._changed:
            return sum(item.chunk.num_steps for batch in self._batches for item in batch)

    def __len__(self) -> int:
        """Batches queued."""
        with self._changed:
            return len(self._batches)


class Prefetcher(threading.Thread):
    """Reads batches of decoded chunks, at most ``batch`` chunks a read and never more than its
    queue has room for, until ``stop`` is set. Redis outages are ridden out with capped backoff;
    any other error is kept in ``error`` and ends the thread (the learner exits non-zero). A read
    waits at most ``wait_ms`` for new entries (:data:`READ_WAIT_MS`)."""

    def __init__(self, receiver: ExperienceReceiver, out: PrefetchQueue, batch: int, stop: threading.Event,
                 wait_ms: int = READ_WAIT_MS) -> None:
        super().__init__(name="prefetch", daemon=True)
        self.receiver, self.out, self.batch, self.stop, self.wait_ms = receiver, out, batch, stop, wait_ms
        self.error: BaseException | None = None

    def halt(self) -> None:
        """Stop: the thread ends after the read under way, if any (up to ``wait_ms``)."""
        self.stop.set()
        self.out.close()

    def run(self) -> None:
        guard = OutageGuard("prefetch", self.stop)
        try:
            while not self.stop.is_set():
                room = self.out.room(ROOM_WAIT_S)
                if not room:
                    continue
                items = guard.call(lambda: self.receiver.receive(min(self.batch, room), self.wait_ms))  # noqa: B023
                if items is None:  # stopped while Redis was away
                    return
                self.out.put(items)
        except BaseException as exc:  # handed to the main thread, which logs it and exits non-zero
            self.error = exc
