"""A sender waiting on ``hub.sender.max_lag`` wakes when the learner reads its shard (the read is
announced on the shard's ``reads`` channel), not when a backoff timer runs out; it leaves the
channel when the wait ends, and falls back to polling when the subscription breaks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys
from tests.integration.test_processes import wait_until

pytestmark = pytest.mark.integration

RUN = "backpressure"
SHARD = RunKeys(RUN).shard(0)


def step(sender: ExperienceSender) -> None:
    sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))


def waiting_sender(client, backoff_s: float) -> tuple[ExperienceReceiver, ExperienceSender, threading.Thread]:
    """A receiver, and a sender (max_lag 1, ``backoff_s`` between its own looks) that steps until
    the backlog passes max_lag (two entries sent), then steps once more in a thread, which waits on
    the learner: returned once it listens on the reads channel."""
    receiver = ExperienceReceiver(client, ReceiverConfig(), RUN, 1)
    receiver.start()
    sender = ExperienceSender(client, SenderConfig(flush_steps=1, max_lag=1, retry_base_s=backoff_s,
                                                   retry_cap_s=backoff_s), RUN, 0, 1)
    for _ in range(3):
        step(sender)  # the 2nd and 3rd each send a chunk: backlog 2 > max_lag 1
    thread = threading.Thread(target=step, args=(sender,), daemon=True)
    thread.start()
    wait_until(lambda: listeners(client) == 1, 10, "the sender to listen for reads")
    return receiver, sender, thread


def listeners(client) -> int:
    return dict(client.pubsub_numsub(SHARD.reads))[SHARD.reads.encode()]


def test_a_waiting_sender_looks_again_when_the_learner_reads(real_redis):
    """The backoff's first delay here is 30-60 s: only the announced read can end the wait in
    time. While waiting the sender listens on the channel; once through, it has left it."""
    receiver, sender, thread = waiting_sender(real_redis, 60)
    assert thread.is_alive()  # it waits
    receiver.ack(receiver.receive(10, 0))
    thread.join(timeout=20)
    assert not thread.is_alive(), "the sender slept on after the learner read its backlog"
    assert real_redis.llen(SHARD.inbox) + real_redis.xlen(SHARD.exp) == 3  # the wait lost nothing
    assert listeners(real_redis) == 0 and sender.stats().backpressure_wait_s > 0
    sender.close()


def test_a_broken_subscription_falls_back_to_polling(real_redis):
    """The server drops the sender's pub/sub connection mid-wait: it polls the backlog on its
    backoff (here 0.05-0.1 s) and goes on once the learner has read."""
    receiver, sender, thread = waiting_sender(real_redis, 0.1)
    assert real_redis.client_kill_filter(_type="pubsub") == 1
    time.sleep(0.3)  # it notices, and polls
    assert thread.is_alive()
    receiver._announce = False  # reads go unannounced: only a poll can see the backlog drop
    receiver.ack(receiver.receive(10, 0))
    thread.join(timeout=20)
    assert not thread.is_alive(), "the sender did not poll once its subscription broke"
    step(sender)  # the backlog passes max_lag again (2 entries unread): the next step waits, listening again
    thread = threading.Thread(target=step, args=(sender,), daemon=True)
    thread.start()
    wait_until(lambda: listeners(real_redis) == 1, 10, "the sender to listen for reads again")
    receiver._announce = True
    receiver.ack(receiver.receive(10, 0))
    thread.join(timeout=20)
    assert not thread.is_alive()
    sender.close()
