"""Replies lost after the server ran the command: inserts, XREADGROUP, acks."""

import numpy as np
import pytest
import redis

from surreal_redis.connection import CONNECTION_ERRORS, RedisSettings, connect, retry_idempotent
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

from .conftest import add_steps, assert_exactly_once, drain, noise_frames

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "faults"
KEYS = RunKeys(RUN).shard(0)


def test_refused_batch_is_stored_when_a_later_one_was_and_the_replies_were_lost(real_redis, lossy_proxy):
    """One pipeline carries s1 < s2: s1 is refused (its frame was collected since the sender
    stored it), s2 is stored, and both replies are lost. The resend must store s1."""
    agent = connect(lossy_proxy.url)
    sender = ExperienceSender(agent, SenderConfig(flush_steps=2, max_chunks_per_insert=1, retry_base_s=0.01),
                              RUN, 0, 1)
    rng = np.random.default_rng(0)
    still = noise_frames(rng, 1)[0]  # env 0 looks at the same frame all the time

    def frames(k):
        return np.stack([still, noise_frames(rng, 1)[0]])

    add_steps(sender, 0, 3, rng, frames=frames)  # one flush: the sender now knows `still` is stored
    move_inbox(Scripts(real_redis), KEYS)
    still_digest = next(f[b"o"].decode() for _, f in real_redis.xrange(KEYS.exp) if f[b"e"] == b"0")
    real_redis.delete(KEYS.obs(still_digest))  # as gc would have, had no entry referenced it any more
    real_redis.zrem(KEYS.obsref, still_digest)
    lossy_proxy.lose_replies(b"EVALSHA")
    add_steps(sender, 3, 2, rng, frames=frames)  # s1 (env 0): MISSING, s2 (env 1): OK; replies lost
    stats = sender.stats()
    assert lossy_proxy.lost[b"EVALSHA"] == 1 and stats.error_retries == 1 and stats.chunks == 4
    assert stats.missing_retries == 1 and stats.chunks_dropped == 0
    moved = move_inbox(Scripts(real_redis), KEYS)  # s2, then s1 once re-uploaded (s2's resend: DUP at the door)
    assert (moved.taken, moved.added, moved.duplicates, moved.left) == (2, 2, 0, 0)
    assert real_redis.xlen(KEYS.exp) == 4  # every chunk counted as sent is there, once
    got = drain(ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1))
    assert assert_exactly_once(got) == {(0, e, 1000.0 * k + e) for e in (0, 1) for k in (0, 2)}
    agent.close()


def test_entries_of_a_lost_read_reply_come_back_from_the_pending_list(real_redis, lossy_proxy):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 0, 7, np.random.default_rng(1))  # 3 flushes x 2 envs
    learner = connect(lossy_proxy.url)
    receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 1)
    receiver.start()
    lossy_proxy.lose_replies(b"$1\r\n>\r\n")  # XREADGROUP ... STREAMS <key> >: entries move to our pending list
    got = drain(receiver, errors=CONNECTION_ERRORS)
    assert lossy_proxy.lost[b"$1\r\n>\r\n"] == 1
    assert assert_exactly_once(got) == {(0, e, 1000.0 * k + e) for e in (0, 1) for k in (0, 2, 4)}
    assert receiver.stats().reread == 6 and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    learner.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_random_lost_replies_on_every_command_keep_every_chunk_exactly_once(real_redis, lossy_proxy, seed):
    """A quarter of the replies to inserts, reads, claims and acks are lost; everything arrives once."""
    for pattern in (b"EVALSHA", b"XREADGROUP", b"XACK", b"XAUTOCLAIM"):
        lossy_proxy.lose_replies(pattern, times=1000, rate=0.25)
    agent, learner = connect(lossy_proxy.url), connect(lossy_proxy.url)
    config = SenderConfig(flush_steps=2, max_chunks_per_insert=1, retry_base_s=0.001, retry_cap_s=0.01)
    sender = ExperienceSender(agent, config, RUN, 3, 1)
    receiver = ExperienceReceiver(learner, ReceiverConfig(claim_every_s=0), RUN, 1)
    rng = np.random.default_rng(seed)
    got = []
    for flush in range(12):
        add_steps(sender, 2 * flush, 2, rng, n=3)
        got += drain(receiver, rounds=1, errors=CONNECTION_ERRORS)
    got += drain(receiver, errors=CONNECTION_ERRORS)
    expected = {(3, e, 1000.0 * k + e) for e in range(3) for k in range(0, 22, 2)}  # 11 full chunks per env
    assert assert_exactly_once(got) == expected
    assert sender.stats().chunks == len(expected) and sender.stats().chunks_dropped == 0
    assert sum(lossy_proxy.lost.values()) > 5
    lossy_proxy.heal()
    assert real_redis.xlen(KEYS.exp) == len(expected) and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    agent.close()
    learner.close()


def test_the_client_never_repeats_a_command_whose_reply_was_lost(real_redis, lossy_proxy):
    client = connect(lossy_proxy.url)
    lossy_proxy.lose_replies(b"INCR")
    with pytest.raises(redis.ConnectionError):
        client.incr("counter")
    assert real_redis.get("counter") == b"1"  # ran once, and the caller knows its fate is unknown
    # an idempotent call may be retried, explicitly
    lossy_proxy.lose_replies(b"GET", times=2)
    assert retry_idempotent(lambda: client.get("counter"), RedisSettings(retries=2, backoff_base=0.001)) == b"1"
    lossy_proxy.lose_replies(b"GET", times=3)
    with pytest.raises(redis.ConnectionError):
        retry_idempotent(lambda: client.get("counter"), RedisSettings(retries=2, backoff_base=0.001))
    assert lossy_proxy.lost[b"GET"] == 5
    client.close()
