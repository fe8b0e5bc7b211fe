"""A full Redis (maxmemory reached, noeviction): backpressure for agents, never a dead learner."""

import threading
import time

import numpy as np
import pytest
import redis

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys

from .conftest import add_steps, assert_exactly_once, drain

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "oom"
KEYS = RunKeys(RUN).shard(0)
FAST = {"retry_base_s": 0.01, "retry_cap_s": 0.05}


def fill_up(client: redis.Redis) -> None:
    """Lower maxmemory below what is used: every write that allocates is refused from now on."""
    client.config_set("maxmemory", client.info("memory")["used_memory"] - 1_000_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.xadd("probe", {"x": "y"})


def test_a_full_redis_stalls_agents_and_never_stops_the_learner(real_redis):
    real_redis.config_set("stream-node-max-entries", 2)
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, max_wait_s=60, **FAST), RUN, 0, 1)
    rng = np.random.default_rng(0)
    add_steps(sender, 0, 9, rng)  # 4 flushes x 2 envs
    first = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = first.receive(4, block_ms=0)
    first.ack(got)
    real_redis.xadd(KEYS.exp, {"a": "-1", "e": "0", "o": "", "d": b"x"})  # malformed: to be set aside
    add_steps(sender, 8, 4, rng)  # 2 more flushes
    fill_up(real_redis)

    # Agents back off (nothing written, nothing lost) until memory comes back.
    errors = []

    def agent():
        try:
            add_steps(sender, 12, 4, rng)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    try:
        restarted, delivered_then = learner_in_a_full_redis(real_redis, sender, thread)
    finally:
        real_redis.config_set("maxmemory", "128mb")  # as if the janitor had freed enough
        thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    time.sleep(0.06)  # the set-aside backoff runs out
    late = drain(restarted)
    assert restarted.dead_by_reason == {"format": 1, "unusable": 1} and restarted.stats().dead == 2
    reasons = sorted(f[b"reason"] for _, f in real_redis.xrange(KEYS.dead))
    assert reasons == [b"format", b"unusable"]
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    # every chunk counted as sent: stored once, or set aside with its reason
    delivered = assert_exactly_once(got + delivered_then + late)
    assert sender.stats().chunks == 16 == len(delivered) + 1 and sender.stats().chunks_dropped == 0


def learner_in_a_full_redis(client: redis.Redis, sender: ExperienceSender,
                            agent: threading.Thread) -> tuple[ExperienceReceiver, list]:
    """A learner restarted now starts in the full Redis, reads, and cannot set aside yet: the
    malformed entry stays pending (retried with backoff), the good ones come through. Returns the
    receiver and the chunks it stored."""
    restarted = ExperienceReceiver(client, ReceiverConfig(**FAST), RUN, 1)
    batch = restarted.receive(64, block_ms=0)
    assert len(batch) == 8 and restarted.stats().dead == 0 and restarted.stats().dead_retries >= 1
    restarted.set_aside(batch[0], "unusable", "does not fit this learner")  # waits too, never raises
    restarted.ack(batch[1:])
    assert client.xpending(KEYS.exp, "learner")["pending"] == 2
    assert restarted.receive(64, block_ms=0) == [] and restarted.stats().dead == 0
    # The janitor runs in the full Redis, even with its scripts flushed (they load again).
    client.script_flush()
    janitor = HubJanitor(client, RetentionConfig(max_entries=None, max_age_s=0.001), RUN, 1)
    assert janitor.run_once().trimmed >= 4
    assert sender.stats().oom_retries > 0 and agent.is_alive()  # agents wait
    return restarted, batch[1:]


def test_a_refused_write_makes_the_janitor_trim_acked_entries_even_without_the_high_water_mark(real_redis):
    """With memory_high_water off (or INFO refused), an OOM the learner met is the only sign of
    pressure: the next run trims what the learner acked, never an unread entry."""
    real_redis.config_set("stream-node-max-entries", 2)
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, **FAST), RUN, 0, 1)
    rng = np.random.default_rng(3)
    add_steps(sender, 0, 9, rng)  # 4 flushes x 2 envs
    reader = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    reader.ack(reader.receive(4, block_ms=0))
    add_steps(sender, 9, 4, rng)
    janitor = HubJanitor(real_redis, RetentionConfig(max_entries=None, memory_high_water=None), RUN, 1)
    assert janitor.run_once().trimmed == 0  # no sign of pressure: acked entries are kept
    janitor.note_oom()
    stats = janitor.run_once()
    assert stats.trimmed == stats.pressure_trimmed == 4 and stats.unread_dropped == 0
    assert janitor.run_once().trimmed == 0  # once per refusal
    assert len(drain(reader)) == real_redis.xlen(KEYS.exp) == 8  # the unread ones all arrive
