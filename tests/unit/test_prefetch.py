"""The prefetch queue holds chunks, not reads: however few chunks each read brings, the queue
fills to its capacity, so the learner sees its next batch arrive in full."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from surreal_redis.chunks import Chunk
from surreal_redis.hub.experience.receiver import ReceivedChunk
from surreal_redis.learner.prefetch import READ_WAIT_MS, Prefetcher, PrefetchQueue


def item(steps: int = 4) -> ReceivedChunk:
    zeros = np.zeros(steps, np.float32)
    chunk = Chunk(0, 0, np.zeros((steps + 1, 2), np.float32), zeros, zeros, zeros.astype(bool), zeros.astype(bool),
                  {}, np.zeros(steps, np.int64), {})
    return ReceivedChunk(chunk, 0, b"1-0", 100)


class TrickleReceiver:
    """Hands out at most ``per_read`` chunks a read, from an endless supply; records each ask."""

    def __init__(self, per_read: int) -> None:
        self.per_read, self.asked, self.waits = per_read, [], []

    def receive(self, max_chunks: int, block_ms: int | None = None) -> list[ReceivedChunk]:
        self.asked.append(max_chunks)
        self.waits.append(block_ms)
        time.sleep(0.001)
        return [item() for _ in range(min(self.per_read, max_chunks))]


def test_queue_counts_chunks_and_never_blocks_a_put():
    batches = PrefetchQueue(3)
    assert batches.room() == 3 and batches.steps() == 0 and len(batches) == 0
    batches.put([item(), item()])
    batches.put([])  # nothing to queue
    assert batches.room() == 1 and batches.steps() == 8 and len(batches) == 1
    batches.put([item(), item()])  # over capacity by one: a read may round up
    assert batches.room(timeout=0.01) == 0 and batches.steps() == 16
    assert len(batches.get(timeout=0)) == 2 and batches.room() == 1
    assert len(batches.get(timeout=0)) == 2
    with pytest.raises(queue.Empty):
        batches.get(timeout=0.01)
    with pytest.raises(ValueError, match="capacity"):
        PrefetchQueue(0)


@pytest.mark.parametrize("per_read", [1, 3, 8])
def test_small_reads_fill_the_queue_to_its_capacity(per_read):
    """Reads of 1 or 3 chunks (asked for 4) once filled a queue of 2 reads with 2 or 6 chunks."""
    receiver, batches, stop = TrickleReceiver(per_read), PrefetchQueue(8), threading.Event()
    prefetcher = Prefetcher(receiver, batches, 4, stop)  # type: ignore[arg-type]  (a stand-in receiver)
    prefetcher.start()
    try:
        deadline = time.monotonic() + 10
        while batches.room() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # a prefetcher that overfilled would have by now
        assert batches.steps() == 8 * 4  # exactly full: it never asked for more than the room
        assert max(receiver.asked) <= 4 and prefetcher.error is None
        taken = batches.get(timeout=1)
        deadline = time.monotonic() + 10
        while batches.room() and time.monotonic() < deadline:  # refilled after a take
            time.sleep(0.005)
        assert batches.steps() == 8 * 4 and len(taken) == min(per_read, 4)
    finally:
        prefetcher.halt()
        prefetcher.join(timeout=5)
    assert not prefetcher.is_alive()


def test_a_prefetcher_waiting_for_room_sleeps_until_room_or_its_halt():
    """A full queue is the off-policy learner's usual state. The wait for room wakes the thread
    only when room comes (every wake-up takes the GIL from the update beside it), and a halt ends
    it at once, not after ROOM_WAIT_S."""
    receiver, batches = TrickleReceiver(4), PrefetchQueue(4)
    prefetcher = Prefetcher(receiver, batches, 4, threading.Event())  # type: ignore[arg-type]
    wakes = []
    wait_for = threading.Condition.wait_for

    def counted(self, predicate, timeout=None):
        if threading.current_thread() is prefetcher:
            wakes.append(timeout)
        return wait_for(self, predicate, timeout)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Condition, "wait_for", counted)
        prefetcher.start()
        deadline = time.monotonic() + 10
        while batches.room() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.3)
        assert len(receiver.asked) == 1 and len(wakes) <= 2  # one wait for room, begun at most twice
        started = time.monotonic()
        prefetcher.halt()
        prefetcher.join(timeout=5)
    assert not prefetcher.is_alive() and time.monotonic() - started < 0.5
    assert batches.room() == 0 and batches.steps() == 16  # closed: no room, what was read still counted


def test_a_reader_error_ends_the_thread_and_is_kept():
    class Broken:
        def receive(self, max_chunks: int, block_ms: int | None = None) -> list:
            raise RuntimeError("decoder bug")

    prefetcher = Prefetcher(Broken(), PrefetchQueue(4), 4, threading.Event())  # type: ignore[arg-type]
    prefetcher.start()
    prefetcher.join(timeout=5)
    assert isinstance(prefetcher.error, RuntimeError)


def test_reads_wait_briefly_so_a_stop_ends_the_thread_soon():
    """Each read waits at most READ_WAIT_MS (or the wait asked for) for new entries, not
    hub.receiver.block_ms: the stopping learner joins this thread before its final checkpoint."""
    for wait_ms, expected in ((None, READ_WAIT_MS), (50, 50)):
        receiver, stop = TrickleReceiver(1), threading.Event()
        extra = {} if wait_ms is None else {"wait_ms": wait_ms}
        prefetcher = Prefetcher(receiver, PrefetchQueue(2), 1, stop, **extra)  # type: ignore[arg-type]
        prefetcher.start()
        deadline = time.monotonic() + 10
        while not receiver.waits and time.monotonic() < deadline:
            time.sleep(0.005)
        prefetcher.halt()
        prefetcher.join(timeout=5)
        assert receiver.waits and set(receiver.waits) == {expected}
