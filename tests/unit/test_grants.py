"""The learner's grants under lockstep and overlap production (surreal_redis.learner.grants):
what each grant holds, the top-up rule, and what a claim that never arrives costs."""

from __future__ import annotations

import json
import logging
import time

import pytest

from surreal_redis.config import ExperimentConfig
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.keys import ParamKeys, RunKeys
from surreal_redis.learner import grants
from surreal_redis.learner.loop import Learner
from surreal_redis.learner.prefetch import PrefetchQueue

from .test_learner import ddpg_config, learner_for, ppo_config, received, send_steps


def started(client, tmp_path, *overrides: str) -> tuple[ExperimentConfig, Learner, ProductionQuota]:
    """A started PPO learner on grants (``ppo_config`` with ``overrides``) and its run's quota."""
    config = ppo_config(tmp_path, *overrides)
    learner = learner_for(config, client)
    learner.start()
    return config, learner, ProductionQuota(client, config.run)


def test_lockstep_learner_grants_what_the_next_update_still_needs(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path)
    assert config.lockstep  # the default for PPO
    assert quota.left() == (1, 64)  # v1, one update's worth
    send_steps(fake_redis, config, learner, 48)  # 96 steps: one update takes 64, 32 stay for the next
    learner.iterate(received(learner))
    assert learner.algo.iteration == 1 and learner.param_version == 2
    assert quota.left() == (2, 32)
    assert quota.claim(1, 16).status == "STALE" and quota.claim(2, 32) == ("OK", 32, 2)


def test_lockstep_learner_grants_again_for_the_same_version_when_no_publish_was_due(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.publish_every_updates=2")
    send_steps(fake_redis, config, learner, 32)
    learner.iterate(received(learner))
    assert learner.algo.iteration == 1 and learner.param_version == 1  # not published: agents keep v1
    assert quota.left() == (1, 64)


def silence(learner: Learner, seconds: float) -> None:
    """As if the last chunk arrived, and the last grant was made, ``seconds`` ago."""
    learner.grants._last_chunk_at = learner.grants._granted_at = time.monotonic() - seconds


def test_lockstep_learner_tops_up_a_grant_that_was_claimed_but_never_delivered(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5")
    assert quota.claim(1, 64).status == "OK"  # an agent claims everything, then dies
    silence(learner, 4)
    learner.iterate(PrefetchQueue(1))
    assert quota.left() == (1, 0) and learner.grants.topups == 0  # too early to tell
    silence(learner, 5)
    learner._next_housekeeping = 0.0
    learner.iterate(PrefetchQueue(1))
    assert quota.left() == (1, 64) and learner.grants.topups == 1


def test_lockstep_learner_does_not_top_up_while_a_live_agent_is_still_making_its_claim(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5", "agent.heartbeat_every_s=2")
    assert quota.claim(1, 64).status == "OK"
    slow = Heartbeat(fake_redis, config.run, 0, ttl_s=30)
    slow.beat(0, 0, 1, claimed=64)  # a slow agent (an Atari agent's first flush), beating as it goes
    silence(learner, 6)
    learner.iterate(PrefetchQueue(1))
    assert quota.left() == (1, 0) and learner.grants.topups == 0
    entry = json.loads(fake_redis.hget(RunKeys(config.run).agents, "0"))
    fake_redis.hset(RunKeys(config.run).agents, "0", json.dumps(dict(entry, ts=time.time() - 7)))  # silent 7 s: dead
    silence(learner, 6)
    learner._next_housekeeping = 0.0
    learner.iterate(PrefetchQueue(1))
    assert quota.left() == (1, 64) and learner.grants.topups == 1


def test_lockstep_learner_does_not_top_up_while_steps_are_left_to_claim(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5")
    assert quota.claim(1, 32).status == "OK"
    silence(learner, 6)
    learner.iterate(PrefetchQueue(1))
    assert quota.left() == (1, 32) and learner.grants.topups == 0


def test_lockstep_learner_publishes_again_when_redis_lost_its_parameters(fake_redis, tmp_path):
    config, learner, quota = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5")
    fake_redis.flushall()  # Redis restarted empty: no meta, no quota, no insert/claim scripts
    silence(learner, 6)
    learner.iterate(PrefetchQueue(1))
    assert learner.param_version == 2 and quota.live_version() == 2
    assert quota.left() == (2, 64) and learner.grants.topups == 1
    assert quota.claim(2, 16).status == "OK"


@pytest.mark.parametrize("sync", ["lockstep", "overlap"])
def test_overlap_grants_the_next_batch_while_training_and_carries_the_unclaimed_rest_over(fake_redis, tmp_path, sync):
    config, learner, quota = started(fake_redis, tmp_path, f"learner.on_policy_sync={sync}")
    assert quota.left() == (1, 64)  # both: the first batch
    assert quota.claim(1, 64).status == "OK"  # the agents claim it all and make it
    send_steps(fake_redis, config, learner, 32)
    claims = []
    train = learner.algo.update

    def update_while_an_agent_claims(chunks):
        claims.append(quota.claim(1, 48))  # an agent asks for more while the learner trains
        return train(chunks)

    learner.algo.update = update_while_an_agent_claims
    learner.iterate(received(learner))
    assert learner.algo.iteration == 1 and learner.param_version == 2
    if sync == "overlap":  # granted 64 ahead for v1 before training; 16 unclaimed carried over to v2
        assert claims == [("OK", 48, 1)] and quota.left() == (2, 16)
    else:  # nothing to claim while training; the next batch is granted for v2 afterwards
        assert claims == [("WAIT", 0, 1)] and quota.left() == (2, 64)


def test_an_overlap_update_carries_the_grant_over_in_its_publish_without_more_round_trips(fake_redis, tmp_path,
                                                                                         monkeypatch):
    """Overlap: a grant before the first update; the publish script carries the unclaimed rest
    over to the new version, or, when the next update's batch came in meanwhile (in the feed or
    the prefetch queue), grants the batch after next itself: no read of the quota and no grant
    between those updates."""
    config, learner, quota = started(fake_redis, tmp_path, "learner.on_policy_sync=overlap")
    assert quota.claim(1, 64).status == "OK"
    batches = PrefetchQueue(1000)
    for agent in (0, 1):  # two batches, queued apart: the second still queued after the first update
        send_steps(fake_redis, config, learner, 32, agent_id=agent)
        batches.put(learner.receiver.receive(1000, block_ms=0))
    calls: list[str] = []
    for name in ("left", "grant"):
        method = getattr(learner.grants.quota, name)
        monkeypatch.setattr(learner.grants.quota, name,
                            lambda *args, _name=name, _method=method: calls.append(_name) or _method(*args))
    grants_published: list = []
    publish = learner.publisher.publish
    monkeypatch.setattr(learner.publisher, "publish",
                        lambda *args, **kwargs: grants_published.append(kwargs["grant"]) or publish(*args, **kwargs))
    learner.iterate(batches)
    assert learner.algo.iteration == 1 and learner.param_version == 2 and len(batches) == 1
    assert calls == ["grant"] and grants_published == [64]  # the next batch queued: the one after it granted
    assert quota.left() == (2, 64)
    learner.iterate(batches)
    assert learner.algo.iteration == 2 and learner.param_version == 3 and len(batches) == 0
    assert calls == ["grant"]  # the grant ahead before the first update, none since
    assert grants_published == [64, None]  # nothing queued after the second: the rest carried
    assert quota.left() == (3, 64)  # v2's 64 unclaimed, carried over to v3


def test_overlap_grants_no_step_past_the_runs_env_step_limit(fake_redis, tmp_path, monkeypatch):
    config, learner, quota = started(fake_redis, tmp_path, "learner.on_policy_sync=overlap",
                                     "stop.max_env_steps=160")
    batches = PrefetchQueue(1000)
    for agent in (0, 1):
        send_steps(fake_redis, config, learner, 32, agent_id=agent)
        batches.put(learner.receiver.receive(1000, block_ms=0))
    grants_published: list = []
    publish = learner.publisher.publish
    monkeypatch.setattr(learner.publisher, "publish",
                        lambda *args, **kwargs: grants_published.append(kwargs["grant"]) or publish(*args, **kwargs))
    learner.iterate(batches)
    assert learner.algo.iteration == 1 and grants_published == [160 - 128]  # 128 steps read: 32 more at most


def test_free_and_off_policy_learners_grant_nothing(fake_redis, tmp_path):
    for config in (ppo_config(tmp_path, "learner.on_policy_sync=free"), ddpg_config(tmp_path)):
        assert not config.lockstep
        learner = learner_for(config, fake_redis)
        learner.start()
        assert learner.grants.quota is None and ProductionQuota(fake_redis, config.run).left() is None


def beat_claiming(client, config, agent: int = 0) -> None:
    """A heartbeat now from ``agent``, saying it is making a claimed flush of 64 steps."""
    Heartbeat(client, config.run, agent, ttl_s=30).beat(0, 0, 1, claimed=64)


def test_a_claim_that_never_arrives_holds_a_top_up_back_for_a_bounded_time(fake_redis, tmp_path, caplog):
    # An agent stuck in its flush, or a hostile one writing its heartbeat by hand, says forever that
    # it is making what it claimed: the learner must not wait for it forever.
    config, learner, quota = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5", "agent.heartbeat_every_s=2")
    assert quota.claim(1, 64).status == "OK"
    patience_s = grants.CLAIM_PATIENCE * 5
    for silent_s in (6, patience_s - 1):
        beat_claiming(fake_redis, config)
        silence(learner, silent_s)
        learner._next_housekeeping = 0.0
        learner.iterate(PrefetchQueue(1))
        assert quota.left() == (1, 0) and learner.grants.topups == 0
    beat_claiming(fake_redis, config)
    silence(learner, patience_s)
    learner._next_housekeeping = 0.0
    with caplog.at_level(logging.WARNING, logger="surreal_redis.learner.grants"):
        learner.iterate(PrefetchQueue(1))
    assert quota.left() == (1, 64) and learner.grants.topups == 1
    assert f"agents 0 claimed flushes and sent nothing for {patience_s}s; granting again" in caplog.text


def test_a_learner_waiting_long_for_experience_says_why_once_per_period(fake_redis, tmp_path, caplog):
    _, learner, _ = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5")  # v1 granted, never claimed
    for silent_s in (6, grants.STALL_WARNING_S + 1, grants.STALL_WARNING_S + 2):
        silence(learner, silent_s)
        learner._next_housekeeping = 0.0
        with caplog.at_level(logging.WARNING, logger="surreal_redis.learner.grants"):
            learner.iterate(PrefetchQueue(1))
    warnings = [r.getMessage() for r in caplog.records if "no experience for" in r.getMessage()]
    assert warnings == [f"lockstep: no experience for {grants.STALL_WARNING_S + 1:.0f}s while the update needs "
                        "64 more steps: 64 steps of v1 are granted and no agent claims them (are agents running?)"]
    assert learner.grants.topups == 0


def test_a_live_version_not_the_learners_own_is_published_again_though_steps_are_left(fake_redis, tmp_path):
    # A failover to a replica that missed the last publish leaves a version nobody can claim for.
    config, learner, quota = started(fake_redis, tmp_path, "learner.lockstep_topup_s=5")
    assert quota.left() == (1, 64)
    fake_redis.hset(ParamKeys(config.run).meta, "version", 0)
    assert quota.claim(1, 16).status == "STALE"  # every agent holding v1 is told so, and waits
    silence(learner, 6)
    learner.iterate(PrefetchQueue(1))
    assert learner.param_version == 2 and quota.live_version() == 2 and quota.left() == (2, 64)
    assert quota.claim(2, 16).status == "OK"
