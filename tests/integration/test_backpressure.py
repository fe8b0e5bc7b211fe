"""A sender waiting on ``hub.sender.max_lag`` wakes when the learner reads its shard (the read is
announced on the shard's ``reads`` channel), not when a backoff timer runs out; it leaves the
channel when the wait ends, and falls back to polling when the subscription breaks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig, shard_peer_chunks
from surreal_redis.keys import RunKeys
from tests.integration.test_processes import wait_until

pytestmark = pytest.mark.integration

RUN = "backpressure"
SHARD = RunKeys(RUN).shard(0)


def step(sender: ExperienceSender) -> None:
    sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))


def waiting_sender(client, backoff_s: float) -> tuple[ExperienceReceiver, ExperienceSender, threading.Thread]:
    """A receiver, and a sender (max_lag 1, ``backoff_s`` between its own looks) that sends one
    chunk, then steps once more in a thread, which sends the second (backlog 2 > max_lag 1) and
    waits on the learner: returned once it listens on the reads channel."""
    receiver = ExperienceReceiver(client, ReceiverConfig(), RUN, 1)
    receiver.start()
    sender = ExperienceSender(client, SenderConfig(flush_steps=1, max_lag=1, retry_base_s=backoff_s,
                                                   retry_cap_s=backoff_s), RUN, 0, 1)
    for _ in range(2):
        step(sender)  # the 2nd sends the first chunk: backlog 1, no wait
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
    assert real_redis.llen(SHARD.inbox) + real_redis.xlen(SHARD.exp) == 2  # the wait lost nothing
    assert sender.learner_waits == 1
    assert listeners(real_redis) == 0 and sender.stats().backpressure_wait_s > 0
    sender.close()


def test_a_broken_subscription_falls_back_to_polling(real_redis):
    """The server drops the sender's pub/sub connection mid-wait: it polls the backlog on its
    backoff (here 0.05-0.1 s) and goes on once the learner has read."""
    receiver, sender, thread = waiting_sender(real_redis, 0.1)
    assert real_redis.client_kill_filter(_type="pubsub") == 1
    time.sleep(0.3)  # it notices, and polls
    assert thread.is_alive()
    receiver._new.announce = False  # reads go unannounced: only a poll can see the backlog drop
    receiver.ack(receiver.receive(10, 0))
    thread.join(timeout=20)
    assert not thread.is_alive(), "the sender did not poll once its subscription broke"
    step(sender)  # 1 entry unread: no wait; the next step sends the 2nd and waits, listening again
    thread = threading.Thread(target=step, args=(sender,), daemon=True)
    thread.start()
    wait_until(lambda: listeners(real_redis) == 1, 10, "the sender to listen for reads again")
    receiver._new.announce = True
    receiver.ack(receiver.receive(10, 0))
    thread.join(timeout=20)
    assert not thread.is_alive()
    sender.close()


def test_agents_woken_by_one_read_stay_within_one_flush_of_max_lag(real_redis):
    """Five agents of one shard send a chunk each and wait on a backlog over max_lag 6 (1 env each,
    so a flush is one chunk and each counts 4 chunks of peers: it goes on at 2 unread or fewer).
    One read that leaves 4 unread wakes all five at once: none goes on (each alone would fit under
    max_lag, and all five together would leave 9 unread). From a read down to 2 on, those that look
    before the others' next chunks land go on and send again, the rest wait for the next read:
    never more than 7 unread, max_lag plus one flush, and every chunk arrives once."""
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    receiver.start()
    filler = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 9, 1)
    for _ in range(10):
        step(filler)  # 9 chunks sent
    config = SenderConfig(flush_steps=1, max_lag=6, retry_base_s=60, retry_cap_s=60)
    senders = [ExperienceSender(real_redis, config, RUN, agent, 1, peer_chunks=4) for agent in range(5)]
    assert {sender.admit_below for sender in senders} == {2}
    for sender in senders:
        step(sender)  # the first step only starts its chunk
    threads = [threading.Thread(target=lambda s=sender: (step(s), step(s)), daemon=True) for sender in senders]
    for thread in threads:
        thread.start()  # each sends a chunk (14 unread), then waits
    wait_until(lambda: listeners(real_redis) == 5, 10, "the five senders to listen for reads")

    def unread() -> int:
        return real_redis.llen(SHARD.inbox) + sum(group["lag"] for group in real_redis.xinfo_groups(SHARD.exp))

    read = receiver.ack(receiver.receive(10, 0))  # 4 left unread, announced
    time.sleep(0.5)
    assert unread() == 4, "an agent went on over its share of max_lag"
    assert all(sender.learner_waits == 1 for sender in senders)
    read += receiver.ack(receiver.receive(2, 0))  # 2 left: the turn of those that look first
    wait_until(lambda: any(sender.learner_waits == 2 or not thread.is_alive()
                           for sender, thread in zip(senders, threads)), 10, "an agent to go on")
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.2)  # those woken together have sent by now
        assert unread() <= 7, "the woken agents together overshot max_lag 6 by more than one flush"
        read += receiver.ack(receiver.receive(1, 0))
    assert read + unread() == 9 + 10  # every chunk arrived once
    for sender in [filler, *senders]:
        sender.close()


def test_shard_peer_chunks_counts_the_other_agents_of_the_shard():
    assert shard_peer_chunks(0, 15, 1, 2) == 28
    assert shard_peer_chunks(1, 15, 4, 3) == 3 * 3  # shard 1 holds agents 1, 5, 9, 13
    assert shard_peer_chunks(0, 1, 1, 8) == 0
    assert shard_peer_chunks(20, 4, 2, 1) == 2  # an agent beyond num_agents: agents 0 and 2 share its shard
