"""A learner consumer restarted within a minute, other consumers dying while we run, and entries
trimmed while pending."""

import time

import numpy as np
import pytest

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys

from .conftest import add_steps, assert_exactly_once, drain

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "restart"
KEYS = RunKeys(RUN).shard(0)


def every_chunk(flushes: int, envs: int = 2) -> set:
    return {(0, e, 1000.0 * k + e) for e in range(envs) for k in range(0, 2 * flushes, 2)}


def test_learner_restarted_within_a_minute_gets_its_own_pending_entries_at_once(real_redis):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 0, 7, np.random.default_rng(0))  # 3 flushes x 2 envs
    first = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    taken = first.receive(4, block_ms=0)
    first.ack(taken[:1])  # then it dies with 3 entries pending, read and never stored
    restarted = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)  # same consumer name, seconds later
    got = taken[:1] + drain(restarted)
    assert assert_exactly_once(got) == every_chunk(3)
    assert restarted.stats().reread == 3 and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0


def test_entries_of_a_consumer_that_dies_later_are_claimed_on_a_period(real_redis):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    rng = np.random.default_rng(1)
    add_steps(sender, 0, 3, rng)
    survivor = ExperienceReceiver(real_redis, ReceiverConfig(consumer="a", claim_min_idle_ms=100, claim_every_s=0.1),
                                  RUN, 1)
    got = drain(survivor)  # started: its one claim pass at start found nothing
    add_steps(sender, 3, 4, rng)
    doomed = ExperienceReceiver(real_redis, ReceiverConfig(consumer="b"), RUN, 1)
    assert len(doomed.receive(10, block_ms=0)) == 4  # and b dies without acking
    time.sleep(0.25)
    got += drain(survivor)
    assert assert_exactly_once(got) == every_chunk(3)
    assert survivor.stats().claimed == 4 and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    # b has nothing pending any more: the next pass removes it
    time.sleep(0.15)
    survivor.receive(1, block_ms=0)
    assert [c["name"] for c in real_redis.xinfo_consumers(KEYS.exp, "learner")] == [b"a"]


@pytest.mark.parametrize("same_name", [True, False])
def test_entries_trimmed_while_pending_are_counted_not_lost_silently(real_redis, same_name):
    real_redis.config_set("stream-node-max-entries", 2)
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 0, 9, np.random.default_rng(2))  # 4 flushes x 2 envs: 8 entries, 4 nodes
    dead = ExperienceReceiver(real_redis, ReceiverConfig(consumer="old"), RUN, 1)
    taken = dead.receive(5, block_ms=0)  # 5 pending; the learner dies
    janitor = HubJanitor(real_redis, RetentionConfig(max_entries=2), RUN, 1)
    stats = janitor.run_once()  # hard cap: the 5 pending entries go, and 1 unread one (whole nodes)
    assert real_redis.xlen(KEYS.exp) == 2 and stats.trimmed == 6 and stats.unread_dropped == 1
    config = ReceiverConfig(consumer="old" if same_name else "new", claim_min_idle_ms=0)
    fresh = ExperienceReceiver(real_redis, config, RUN, 1)
    got = drain(fresh)
    assert len(taken) == 5 and len(got) == 2
    # sent = delivered + trimmed while pending + trimmed unread
    assert fresh.stats().pending_trimmed == 5
    assert sender.stats().chunks == len(got) + fresh.stats().pending_trimmed + janitor.unread_dropped_total
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
