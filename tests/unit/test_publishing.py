"""The learner's after-update publish on its own thread (surreal_redis.learner.publishing): the
next update runs while it is in flight, and a publish that fails there loses nothing."""

from __future__ import annotations

import threading

import pytest

from surreal_redis.hub.params import PublishBackpressure
from surreal_redis.keys import RunKeys
from surreal_redis.learner.prefetch import PrefetchQueue

from .test_grants import started
from .test_learner import send_steps


def live_version(client, config) -> int:
    return int(client.hget(RunKeys(config.run).params.meta, "version") or 0)


def two_batches_queued(client, config, learner) -> PrefetchQueue:
    """Two batches of 64 steps read ahead; the learner's housekeeping put off (it settles a
    publish in flight) until a test asks for it."""
    learner._next_housekeeping = float("inf")
    batches = PrefetchQueue(1000)
    for agent in (0, 1):  # the second still queued after the first update
        send_steps(client, config, learner, 32, agent_id=agent)
        batches.put(learner.receiver.receive(1000, block_ms=0))
    return batches


def fail_next_publish(learner, error: BaseException) -> None:
    """The learner's next publish raises ``error`` (on whichever thread runs it); later ones go through."""
    publish = learner.publisher.publish_encoded
    errors = [error]

    def failing_once(encoded, carry, grant):
        if errors:
            raise errors.pop()
        return publish(encoded, carry, grant)

    learner.publisher.publish_encoded = failing_once


def test_the_next_update_runs_while_the_last_publish_is_in_flight(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.on_policy_sync=overlap")
    assert quota.claim(1, 64).status == "OK"
    batches = two_batches_queued(fake_redis, config, learner)
    sent, release = threading.Event(), threading.Event()
    publish = learner.publisher.publish_encoded

    def held(encoded, carry, grant):
        sent.set()
        assert release.wait(10), "the publish was never released"
        return publish(encoded, carry, grant)

    learner.publisher.publish_encoded = held
    learner.iterate(batches)
    assert learner.algo.iteration == 1 and sent.wait(10)
    assert learner.param_version == 2 and live_version(fake_redis, config) == 1  # made by the publish in flight
    seen = []
    train = learner.algo.update

    def update_beside_the_publish(chunks):
        seen.append(live_version(fake_redis, config))
        stats = train(chunks)
        release.set()
        return stats

    learner.algo.update = update_beside_the_publish
    learner.iterate(batches)
    assert learner.algo.iteration == 2 and seen == [1]  # the second update ran while v2 was on its way
    learner.publishing.settle(wait=True)
    assert learner.param_version == 3 and live_version(fake_redis, config) == 3
    assert quota.left() == (3, 64)  # the grant made with v2, carried over to v3: nothing lost
    assert learner.feed.fifo.learner_version == 3


def test_a_publish_lost_on_its_thread_is_raised_on_the_main_thread_and_made_again(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.on_policy_sync=overlap")
    assert quota.claim(1, 64).status == "OK"
    batches = two_batches_queued(fake_redis, config, learner)
    fail_next_publish(learner, ConnectionError("Redis went away"))
    learner.iterate(batches)  # update 1; its publish (v2, granting the batch after next) fails on the thread
    with pytest.raises(ConnectionError, match="went away"):
        learner.iterate(batches)  # update 2 ran; settling the lost publish raises (the run's guard retries)
    assert learner.algo.iteration == 2
    assert learner.param_version == 1 and learner.publishing.failed  # taken back: v2 never landed
    assert not learner.grants._ahead_published  # its grant is left to the next update
    assert live_version(fake_redis, config) == 1 and quota.left() == (1, 64)  # the grant ahead of update 1 stands
    learner._next_housekeeping = 0.0
    learner.iterate(PrefetchQueue(1))  # the housekeeping publishes update 2's parameters and grants for them
    assert learner.param_version == 2 and live_version(fake_redis, config) == 2 and not learner.publishing.failed
    assert quota.left() == (2, 64)  # the next update's batch, granted for the version that landed


def test_a_publish_refused_for_memory_on_its_thread_keeps_training(fake_redis, tmp_path, caplog):
    config, learner, quota = started(fake_redis, tmp_path, "learner.on_policy_sync=overlap", "learner.gc_every_s=1000")
    assert quota.claim(1, 64).status == "OK"
    batches = two_batches_queued(fake_redis, config, learner)
    fail_next_publish(learner, PublishBackpressure("OOM at the staging SET"))
    learner.iterate(batches)
    learner.iterate(batches)  # the refusal is logged when settled; update 2 publishes again at once
    assert "Redis is full" in caplog.text
    learner.publishing.settle(wait=True)  # update 2's publish
    assert learner.algo.iteration == 2 and learner.param_version == 2 and live_version(fake_redis, config) == 2
    assert not learner.publishing.failed
