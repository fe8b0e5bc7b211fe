"""The learner on fakeredis, built from its parts: one round trains, publishes and acks; the
off-policy feed pauses reading while updates are owed; stop conditions; run() to the end; a
resumed learner credits only evals of its own parameters; the registry builds each regime; the
experience-use, lag, busy and idle figures (lockstep grants and top-ups: test_grants.py)."""

from __future__ import annotations

import dataclasses
import queue
import time
from collections import Counter

import pytest

from surreal_redis.agent import with_final_rows
from surreal_redis.algos.ddpg.policy import DDPGConfig
from surreal_redis.algos.learning import chunk_needs, make_trainer
from surreal_redis.algos.policies import make_policy
from surreal_redis.algos.ppo.policy import PPOConfig
from surreal_redis.algos.registry import UnknownAlgorithm
from surreal_redis.config import ExperimentConfig, load_config
from surreal_redis.envs import make_env, make_vector_env, step_vector_env
from surreal_redis.hub.experience.sender import ExperienceSender
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeRecord
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.keys import CONSUMER_GROUP, RunKeys
from surreal_redis.learner import loop
from surreal_redis.learner.chunk_check import ChunkCheck
from surreal_redis.learner.loop import Learner
from surreal_redis.learner.metrics import AgentClocks, lag_percentile, use_summary
from surreal_redis.learner.parts import FeedSettings, LearnerParts, make_feed
from surreal_redis.learner.prefetch import PrefetchQueue
from surreal_redis.replay import ReplayConfig
from surreal_redis.replay.feeds import Feed, OffPolicyConfig, OffPolicyFeed, OnPolicyFeed
from surreal_redis.replay.fifo import FIFOReplayConfig
from surreal_redis.replay.prioritized import PrioritizedReplay
from surreal_redis.runtime import StopFlag


def ppo_config(tmp_path, *overrides: str) -> ExperimentConfig:
    """CartPole PPO: 2 envs, chunks of 16 steps, one update per 64 steps, a checkpoint per update."""
    return load_config("smoke", [f"experiment.root={tmp_path}", "experiment.name=learner_unit",
                                 "tracking.enabled=false", "ppo.device=cpu", "ppo.hidden_sizes=[16, 16]",
                                 "hub.sender.flush_steps=16", "learner.steps_per_update=64",
                                 "checkpoint.every_updates=1", "stop.max_env_steps=null", "stop.max_seconds=null",
                                 *overrides])


def ddpg_config(tmp_path, *overrides: str) -> ExperimentConfig:
    return ppo_config(tmp_path, "algo=ddpg", "ppo=null", "env.env_id=Pendulum-v1", "ddpg.device=cpu",
                      "ddpg.actor_hidden=[8]", "ddpg.critic_hidden=[8]", "off_policy.batch_size=16",
                      "off_policy.n_step=1", "off_policy.learning_starts=32", *overrides)


def parts(config: ExperimentConfig, feed: Feed | None = None) -> LearnerParts:
    env = make_env(config.env, seed=0)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    section = config.algo_config
    if feed is None:
        feed = make_feed(section, FeedSettings.of(config), seed=0)
    return LearnerParts(make_trainer(section, obs_space, action_space, seed=0), feed,
                        ChunkCheck.for_experiment(config, obs_space, action_space))


def learner_for(config: ExperimentConfig, client, feed: Feed | None = None) -> Learner:
    return Learner(config, client, StopFlag(install_handlers=False), parts(config, feed))


def send_steps(client, config: ExperimentConfig, learner: Learner, steps: int, agent_id: int = 0) -> None:
    """An agent's data path: the learner's current policy acts in 2 envs for ``steps`` vector
    steps, and the real ExperienceSender puts the chunks into Redis."""
    envs = make_vector_env(config.env, config.env.num_envs, seed=agent_id)
    policy = make_policy(config.algo_config, envs.single_observation_space, envs.single_action_space,
                         envs.num_envs, agent_id, num_agents=8, seed=agent_id)
    policy.load_params(learner.algo.actor_params(), learner.param_version)
    sender = ExperienceSender(client, config.hub.sender, config.run, agent_id, config.redis.num_shards)
    obs, _ = envs.reset(seed=agent_id)
    for _ in range(steps):
        out = policy.act(obs)
        step = step_vector_env(envs, out.actions)
        sender.add(obs, out.actions, step.rewards, step.terminated, step.truncated,
                   with_final_rows(step.obs, step.final_obs), out.extras, policy.version)
        obs = step.obs
    sender.flush(obs)
    envs.close()


def received(learner: Learner) -> PrefetchQueue:
    """What the prefetch thread would hand the main loop: one batch of everything unread."""
    batches = PrefetchQueue(1000)
    batches.put(learner.receiver.receive(1000, block_ms=0))
    return batches


def pending(client, config: ExperimentConfig) -> int:
    return client.xpending(RunKeys(config.run).shard(0).exp, CONSUMER_GROUP)["pending"]


def episode(mode: str, episode_return: float, version: int, agent: str = "0") -> EpisodeRecord:
    return EpisodeRecord(agent if mode == "train" else "eval-0", mode, episode_return, 10, version, time.time())


def test_one_round_trains_publishes_and_acks(fake_redis, tmp_path):
    config = ppo_config(tmp_path)
    learner = learner_for(config, fake_redis)
    learner.start()
    assert learner.param_version == 1
    send_steps(fake_redis, config, learner, 32)  # 2 envs x 32 steps: 4 chunks, one update's worth
    learner.iterate(received(learner))
    assert learner.env_steps == 64 and learner.algo.iteration == 1
    assert learner.param_version == 2
    assert int(fake_redis.hget(RunKeys(config.run).params.meta, "version")) == 2
    assert pending(fake_redis, config) == 4  # acked by the prefetch thread's next read, in its round trip
    assert learner.receiver.receive(8, block_ms=0) == [] and pending(fake_redis, config) == 0
    assert learner.checkpoints.iterations() == [1]
    assert learner.feed.stats()["taken_steps"] == 64


def test_the_stop_sends_the_acks_the_prefetch_thread_would_have_carried(fake_redis, tmp_path):
    config = ppo_config(tmp_path)
    learner = learner_for(config, fake_redis)
    learner.start()
    send_steps(fake_redis, config, learner, 32)
    learner.iterate(received(learner))
    assert learner.algo.iteration == 1 and pending(fake_redis, config) == 4
    learner._finish("FINISHED")
    assert pending(fake_redis, config) == 0


def test_chunks_that_do_not_fit_are_set_aside_not_trained_on(fake_redis, tmp_path):
    config = ppo_config(tmp_path)
    learner = learner_for(config, fake_redis)
    learner.start()
    pendulum = ddpg_config(tmp_path / "other")
    other_env = dataclasses.replace(pendulum, experiment=config.experiment)  # same run, another env
    send_steps(fake_redis, other_env, learner_for(pendulum, fake_redis), 16)
    learner.iterate(received(learner))
    assert learner.env_steps == 0 and learner.algo.iteration == 0
    assert learner.receiver.stats().dead == 2 and pending(fake_redis, config) == 0


def test_off_policy_learner_stops_reading_while_updates_are_owed(fake_redis, tmp_path):
    config = ddpg_config(tmp_path)
    # no time to train at first (max_train_s=0), so the owed updates pile up
    feed = OffPolicyFeed(OffPolicyConfig(batch_size=16, learning_starts=32, pause_reading_at=4, max_train_s=0.0,
                                         replay=ReplayConfig(capacity=10_000)), gamma=0.99)
    learner = learner_for(config, fake_redis, feed)
    learner.start()
    send_steps(fake_redis, config, learner, 16)
    learner.iterate(received(learner))  # 2 chunks, 32 transitions: 32 updates owed
    assert learner.env_steps == 32 and feed.owed_updates() == 32 and learner.algo.iteration == 0
    send_steps(fake_redis, config, learner, 16, agent_id=1)
    batches = received(learner)
    learner.iterate(batches)
    assert len(batches) == 1 and learner.env_steps == 32  # not read: the backlog waits
    assert pending(fake_redis, config) == 2  # handed to the reader, not stored: not acked
    feed.config = dataclasses.replace(feed.config, max_train_s=None)
    learner.iterate(batches)  # trains what is owed first
    assert learner.algo.iteration == 32 and len(batches) == 1
    learner.iterate(batches)
    assert len(batches) == 0 and learner.env_steps == 64 and learner.algo.iteration == 64
    assert learner.receiver.receive(8, block_ms=0) == [] and pending(fake_redis, config) == 0  # the acks went along


def test_a_resumed_off_policy_learner_trains_only_on_new_data_at_the_limiters_ratio(fake_redis, tmp_path):
    """The checkpoint keeps the rate limiter's counts and the z-filter; the replay refilled from
    the hub on resume earns no updates (it once earned 4002 on old data) and reaches no statistics."""
    config = ddpg_config(tmp_path, "off_policy.rate_limiter.samples_per_insert=16.0", "ddpg.normalize_obs=true",
                         "off_policy.rate_limiter.error_buffer=16.0", "off_policy.max_train_s=null")  # 1 per transition past 32
    first = learner_for(config, fake_redis)
    first.start()
    for round_ in range(2):  # 2 x 32 transitions
        send_steps(fake_redis, config, first, 16, agent_id=round_)
        first.iterate(received(first))
    assert first.algo.iteration == 33 and first.checkpoints.iterations()[-1] == 33  # 1 + 32: from learning_starts
    statistics = first.algo.obs_normalizer.stats["_"]
    assert statistics.count.item() == 64

    resumed = learner_for(config, fake_redis)
    resumed.restore("latest")
    assert len(resumed.feed.replay) == 64  # refilled
    assert (resumed.feed.limiter.inserts, resumed.feed.limiter.samples) == (64, 33 * 16)
    resumed.iterate(PrefetchQueue(1))
    assert resumed.algo.iteration == 33  # nothing owed on the old data
    restored = resumed.algo.obs_normalizer.stats["_"]
    assert restored.count.item() == 64 and restored.mean.tolist() == statistics.mean.tolist()
    send_steps(fake_redis, config, resumed, 16, agent_id=2)
    resumed.iterate(received(resumed))
    assert resumed.algo.iteration == 33 + 32 and restored.count.item() == 96


@pytest.mark.parametrize("condition", ["max_env_steps", "train_return", "eval_return", "stop_request"])
def test_stop_conditions(fake_redis, tmp_path, condition):
    overrides = {"max_env_steps": ["stop.max_env_steps=64"],
                 "train_return": ["stop.target_return=100", "stop.return_window=4"],
                 "eval_return": ["stop.target_return=100", "stop.target_metric=eval", "eval.episodes=2"],
                 "stop_request": []}[condition]
    config = ppo_config(tmp_path, *overrides)
    learner = learner_for(config, fake_redis)
    learner.start()
    episodes = EpisodeLog(fake_redis, config.run)
    if condition == "max_env_steps":
        send_steps(fake_redis, config, learner, 32)
    elif condition == "train_return":  # agent means 150, 100, 100: 2 of 3 reach the target
        episodes.record([episode("train", r, 1, agent) for r, agent in
                         ((150.0, "0"), (90.0, "1"), (110.0, "1"), (100.0, "2"))])
    elif condition == "eval_return":
        episodes.record([episode("eval", 100.0, 1), episode("eval", 120.0, 1)])
    else:
        RunControl(fake_redis, config.run).request_stop("operator says so")
    learner.iterate(received(learner))
    expected = {"max_env_steps": "stop.max_env_steps=64", "train_return": "train return 100.0 (lower median over agents",
                "eval_return": "eval return 110.0", "stop_request": "operator says so"}[condition]
    assert learner.stop and expected in learner.stop.reason
    assert RunControl(fake_redis, config.run).stopping()[0]


def test_one_agent_alone_cannot_stop_the_run_by_train_return(fake_redis, tmp_path):
    config = ppo_config(tmp_path, "stop.target_return=100", "stop.return_window=4")
    learner = learner_for(config, fake_redis)
    learner.start()
    EpisodeLog(fake_redis, config.run).record([episode("train", r, 1, agent) for r, agent in
                                               ((1000.0, "0"), (0.0, "1"), (0.0, "2"), (1000.0, "0"))])
    learner.iterate(PrefetchQueue(1))
    assert learner.mean_return() == 500.0 and not learner.stop


def test_run_trains_until_a_stop_condition_and_leaves_a_checkpoint(fake_redis, tmp_path):
    config = ppo_config(tmp_path, "stop.max_env_steps=128", "learner.receive_batch=4", "learner.prefetch_chunks=8",
                        "replay.fifo.max_policy_lag=null")  # all chunks come from version 0
    learner = learner_for(config, fake_redis)
    send_steps(fake_redis, config, learner, 64)
    assert learner.run() == 0
    assert learner.env_steps == 128 and learner.algo.iteration == 2
    assert learner.checkpoints.iterations() == [1, 2] and pending(fake_redis, config) == 0
    assert RunControl(fake_redis, config.run).learner_status()["state"] == "stopped"


def test_resumed_learner_credits_only_evals_of_its_own_parameters(fake_redis, tmp_path):
    config = ppo_config(tmp_path, "eval.episodes=2", "checkpoint.keep_best=1")
    first = learner_for(config, fake_redis)
    first.start()  # v1
    for round_ in range(3):  # each update: checkpoint (with the version in use), then publish
        send_steps(fake_redis, config, first, 32, agent_id=round_)
        first.iterate(received(first))
    assert first.checkpoints.iterations()[-1] == 3 and first.param_version == 4
    episodes = EpisodeLog(fake_redis, config.run)
    episodes.record([episode("eval", 500.0, 2), episode("eval", 500.0, 2), episode("train", 30.0, 3)])

    resumed = learner_for(config, fake_redis)
    resumed.restore("latest")
    assert resumed.param_version == 3 and resumed.algo.iteration == 3
    assert resumed.mean_return() == 30.0  # the stop window still counts earlier episodes
    resumed.start()  # v5
    episodes.record([episode("eval", 400.0, 2), episode("eval", 400.0, 2),  # older than the restored v3
                     episode("eval", 50.0, 5), episode("eval", 70.0, 5)])
    resumed.iterate(PrefetchQueue(1))
    assert resumed.checkpoints.best() == [(60.0, 3)]
    assert resumed.scores.last_eval == 60.0


def test_each_regime_is_built_from_its_spec_and_the_shared_sections():
    off_policy = OffPolicyConfig(batch_size=8, n_step=3, updates_per_step=0.5,
                                 replay=ReplayConfig(capacity=100, selector="prioritized"))
    settings = FeedSettings(FIFOReplayConfig(), steps_per_update=64, off_policy=off_policy)
    assert isinstance(make_feed(PPOConfig(), settings, seed=0), OnPolicyFeed)
    feed = make_feed(DDPGConfig(gamma=0.9), settings, seed=0)
    assert isinstance(feed, OffPolicyFeed) and isinstance(feed.replay, PrioritizedReplay)
    assert (feed.config.n_step, feed.config.batch_size, feed.config.updates_per_step, feed.nstep.gamma) == \
        (3, 8, 0.5, 0.9)
    env = make_env(load_config("smoke").env, seed=0)
    assert chunk_needs(PPOConfig(), env.action_space).extras == ("logp",)
    assert chunk_needs(DDPGConfig(), env.action_space).extras == ()
    with pytest.raises(UnknownAlgorithm, match="FIFOReplayConfig"):
        make_trainer(FIFOReplayConfig(), env.observation_space, env.action_space)
    env.close()


def test_learner_reports_experience_use_lag_busy_and_idle(fake_redis, tmp_path):
    config = ppo_config(tmp_path, "learner.metrics_every_s=3600")
    learner = learner_for(config, fake_redis)
    learner.start()
    Heartbeat(fake_redis, config.run, 0, ttl_s=30).beat(0, 0, 1, idle_s=1.0, running_s=4.0)
    learner.metrics.maybe_flush(learner.progress(), learner.feed.stats(), learner.receiver.stats(), force=True)
    send_steps(fake_redis, config, learner, 48)  # 96 steps of v1
    learner.iterate(received(learner))  # one update (64 steps), v2; 32 held
    learner.feed.on_publish(3)  # the held v1 steps are 2 behind now: dropped as stale
    Heartbeat(fake_redis, config.run, 0, ttl_s=30).beat(96, 0, 1, idle_s=4.0, running_s=8.0)
    learner.metrics.maybe_flush(learner.progress(), learner.feed.stats(), learner.receiver.stats(), force=True)
    status = RunControl(fake_redis, config.run).learner_status()
    assert status["experience_used_fraction"] == 64 / 96 and status["experience_wasted_steps"] == 32
    assert status["policy_lag_p90"] == 0 and status["sync"] == "lockstep"
    assert 0 < status["learner_busy_total"] <= 1
    assert status["agent_idle"] == 3.0 / 4.0 and status["agent_idle_total"] == 4.0 / 8.0
    learner._finish("FINISHED", unread_steps=16)
    status = RunControl(fake_redis, config.run).learner_status()
    assert status["experience_unused_at_stop"] == 16 and status["state"] == "stopped"
    summary = use_summary(status, whole_run=True)
    epochs = learner.algo.config.update_epochs  # each sample's gradient passes
    assert summary.startswith("experience used 66.7% (+16 steps unused at the stop), policy lag p90 0 (0:100%), "
                              f"passes/sample {epochs:.1f}, kl/update ")
    assert status["kl_per_update"] is not None and ", learner busy " in summary
    assert status["policy_lag_shares"] == {"0": 1.0, "1": 0.0, "2": 0.0, "3-4": 0.0, "5-8": 0.0, "9+": 0.0}
    assert summary.endswith("agents idle 50% [lockstep]")


def test_lag_percentiles_and_agent_clocks():
    lags = Counter({0: 80, 1: 15, 3: 5})
    assert [lag_percentile(lags, q) for q in (0, 50, 80, 81, 90, 96, 100)] == [0, 0, 0, 1, 1, 3, 3]
    with pytest.raises(ValueError, match="at least one"):
        lag_percentile(Counter(), 50)
    clocks = AgentClocks()
    assert clocks.update([("0", 10, 1.0, 2.0)]) is None and clocks.total() == 0.5
    assert clocks.update([("0", 10, 2.0, 4.0), ("1", 11, 0.0, 1.0)]) == 0.5
    # agent 0 restarted (new pid, clocks from 0), agent 1 left: its last report still counts in the total
    assert clocks.update([("0", 12, 0.0, 1.0)]) is None
    assert clocks.total() == (2.0 + 0.0 + 0.0) / (4.0 + 1.0 + 1.0)
    # an idle stretch reported late (it began before the previous report) never makes it more than all
    assert clocks.update([("0", 12, 3.0, 2.0)]) == 1.0
    # reports looked at between updates count in the total but leave the window where it was
    between = AgentClocks()
    between.observe([("0", 10, 1.0, 4.0)])  # the agent leaves before any update sees it
    assert between.update([]) is None and between.total() == 0.25
    assert between.update([("0", 10, 2.0, 8.0)]) is None  # the window starts at the first update
    between.observe([("0", 10, 6.0, 10.0)])
    assert between.update([("0", 10, 6.0, 12.0)]) == 4.0 / 4.0 and between.total() == 0.5


# ---------------------------------------------------------------- seams (issue 8 §2)

def test_lockstep_grants_stop_at_max_env_steps(fake_redis, tmp_path):
    config = ppo_config(tmp_path, "stop.max_env_steps=100")
    assert config.lockstep
    learner = learner_for(config, fake_redis)
    learner.start()
    quota = ProductionQuota(fake_redis, config.run)
    assert quota.left() == (1, 64)
    send_steps(fake_redis, config, learner, 32)
    learner.iterate(received(learner))
    assert learner.env_steps == 64 and learner.param_version == 2
    assert quota.left() == (2, 36)  # not a whole update's 64: the run needs 36 more


def test_unusable_chunks_are_set_aside_before_the_ack(fake_redis, tmp_path):
    """An ack error must not leave the unusable entries pending until a restart."""
    config = ppo_config(tmp_path)
    learner = learner_for(config, fake_redis)
    learner.start()
    pendulum = ddpg_config(tmp_path / "other")
    send_steps(fake_redis, dataclasses.replace(pendulum, experiment=config.experiment), learner_for(pendulum, fake_redis), 16)
    items = learner.receiver.receive(100, block_ms=0)

    def lost(batch, later=False):
        raise ConnectionError("reply lost")

    learner.receiver.ack = lost
    with pytest.raises(ConnectionError):
        learner._ingest(items)
    assert learner.receiver.stats().dead == 2 and pending(fake_redis, config) == 0


def test_a_publish_refused_for_memory_keeps_training_and_is_retried(fake_redis, tmp_path):
    from surreal_redis.hub.params import PublishBackpressure

    config = ppo_config(tmp_path, "learner.gc_every_s=1000")
    learner = learner_for(config, fake_redis)
    learner.start()
    publish = learner.publisher.publish
    refusals = [PublishBackpressure("OOM at the staging SET")] * 2

    def full(*args, **kwargs):
        if refusals:
            raise refusals.pop()
        return publish(*args, **kwargs)

    learner.publisher.publish = full
    send_steps(fake_redis, config, learner, 32)
    learner.iterate(received(learner))  # the update's publish, then housekeeping's retry: both refused
    assert learner.algo.iteration == 1 and learner.param_version == 1 and learner._publish_failed
    quota = ProductionQuota(fake_redis, config.run)
    assert quota.left() == (1, 64)  # training goes on: agents make the next update with v1
    send_steps(fake_redis, config, learner, 32)
    learner.iterate(received(learner))
    assert learner.algo.iteration == 2 and learner.param_version == 2 and not learner._publish_failed
    assert quota.left() == (2, 64)  # granted for the new version


def test_start_rides_out_an_outage_with_housekeeping_before_the_first_publish(fake_redis, tmp_path):
    config = ppo_config(tmp_path)
    learner = learner_for(config, fake_redis)
    calls = []
    run_once, publish = learner.janitor.run_once, learner.publisher.publish
    failures = [ConnectionError("Redis restarting"), ConnectionError("Redis restarting")]

    def janitor():
        calls.append("gc")
        return run_once()

    def flaky(*args, **kwargs):
        calls.append("publish")
        if failures:
            raise failures.pop()
        return publish(*args, **kwargs)

    learner.janitor.run_once, learner.publisher.publish = janitor, flaky
    learner.stop.wait = lambda timeout: False  # no backoff sleeps in the test
    assert learner.start() is True
    assert calls == ["gc", "publish"] * 3 and learner.param_version == 1
    assert fake_redis.hget(RunKeys(config.run).control, "state") == b"running"


def test_start_stopped_while_redis_is_away_returns_false(fake_redis, tmp_path):
    learner = learner_for(ppo_config(tmp_path), fake_redis)

    def away():
        learner.stop.set("test")
        raise ConnectionError("no Redis")

    learner.janitor.run_once = away
    assert learner.start() is False and learner.param_version == 0


def test_a_learner_with_an_lstm_policy_sets_aside_chunks_without_its_state(fake_redis, tmp_path):
    config = ppo_config(tmp_path, "ppo.use_lstm=true")
    learner = Learner.from_config(config, fake_redis, StopFlag(install_handlers=False))
    learner.start()
    plain = ppo_config(tmp_path / "plain")
    send_steps(fake_redis, dataclasses.replace(plain, experiment=config.experiment), learner_for(plain, fake_redis), 16)
    learner.iterate(received(learner))
    assert learner.env_steps == 0 and learner.receiver.stats().dead == 2


def test_rejections_rising_under_the_same_live_version_republish_it(fake_redis, tmp_path):
    config = ppo_config(tmp_path)
    learner = learner_for(config, fake_redis)
    learner.start()
    beat = Heartbeat(fake_redis, config.run, 0, ttl_s=30)
    # a rise under the version live at the previous look republishes; the look after a republish
    # only takes the counts (heartbeats lag); rising again later republishes again
    for rejections, expected_version in [(0, 1), (2, 2), (3, 2), (3, 2), (4, 3)]:
        beat.beat(10, 0, 1, force=True, param_rejections=rejections)
        learner.rejections._next_check = 0
        learner._republish_if_rejected()
        assert learner.param_version == expected_version, rejections
    assert learner.rejections.republished == 2
    assert int(fake_redis.hget(RunKeys(config.run).params.meta, "version")) == 3
    assert ProductionQuota(fake_redis, config.run).left() == (3, 64)


def test_a_restarted_learner_continues_its_mlflow_run(tmp_path):
    from surreal_redis.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = Tracker(tmp_path / "exp", "exp", "exp", tracking_uri=uri)
    first.log_metrics({"a": 1.0}, 1)
    again = Tracker(tmp_path / "exp", "exp", "exp", tracking_uri=uri)  # restarted before any checkpoint
    assert again.run_id == first.run_id
    (tmp_path / "exp" / "mlflow_run_id").write_text("0" * 32)  # a run the store does not have
    assert Tracker(tmp_path / "exp", "exp", "exp", tracking_uri=uri).run_id not in (first.run_id, "0" * 32)


def test_lag_shares_bucket_the_whole_runs_histogram():
    from surreal_redis.learner.metrics import lag_shares

    shares = lag_shares(Counter({0: 5, 1: 2, 3: 1, 4: 1, 7: 0, 12: 1}))
    assert shares == {"0": 0.5, "1": 0.2, "2": 0.0, "3-4": 0.2, "5-8": 0.0, "9+": 0.1}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert set(lag_shares(Counter()).values()) == {0.0}


def test_the_run_stops_where_its_annealing_schedule_ends(fake_redis, tmp_path):
    """After total_updates annealed updates the learning rate is 0: the learner stops the run
    there rather than train on with nothing to learn."""
    config = ppo_config(tmp_path, "ppo.anneal_lr=true", "ppo.total_updates=1")
    learner = learner_for(config, fake_redis)
    learner.start()
    send_steps(fake_redis, config, learner, 64)  # two updates' worth
    learner.iterate(received(learner))
    assert learner.algo.iteration == 1 and learner.feed.stats()["taken_steps"] == 64
    assert learner.stop and "annealing schedule ended" in learner.stop.reason
    stopping, why = RunControl(fake_redis, config.run).stopping()
    assert stopping and "total_updates 1" in why


def test_annealing_spans_the_run_s_step_budget_unless_given(caplog):
    derived = load_config("ppo_cartpole", ["ppo.total_updates=0", "stop.max_env_steps=100000"])
    assert derived.algorithm.for_run(derived).total_updates == 100000 // 256
    appo = load_config("appo_cartpole", ["appo.total_updates=0", "stop.max_env_steps=51200"])
    assert appo.algorithm.for_run(appo).total_updates == 200
    shipped = load_config("ppo_cartpole")
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert shipped.algorithm.for_run(shipped) is shipped.algo_config  # its schedule is its budget
        assert not caplog.records
        short = load_config("ppo_cartpole", ["stop.max_env_steps=2000000"])
        assert short.algorithm.for_run(short).total_updates == 781
    assert "ppo.total_updates 781 ends the annealing at 199936 env steps, before stop.max_env_steps 2000000" in caplog.text
    with pytest.raises(ValueError, match=r"ppo.anneal_lr and anneal_clip need ppo.total_updates >= 1 or stop.max_env_steps"):
        load_config("ppo_cartpole", ["ppo.total_updates=0", "stop.max_env_steps=null"])


def test_a_stop_requested_while_the_learner_starts_is_kept(fake_redis, tmp_path):
    """A launcher stopping the run while its restarted learner is still starting: the learner's
    start must not write the run back to running (the launcher would wait out its stop grace)."""
    config = ppo_config(tmp_path)
    control = RunControl(fake_redis, config.run)
    learner = learner_for(config, fake_redis)  # this process started before the stop below
    control.request_stop("launcher exiting")
    assert learner.start()
    assert control.stopping() == (True, "launcher exiting")
    assert learner.stop and "launcher exiting" in learner.stop.reason


def test_a_stop_from_an_earlier_life_of_the_run_does_not_stop_a_new_learner(fake_redis, tmp_path, monkeypatch):
    config = ppo_config(tmp_path)
    control = RunControl(fake_redis, config.run)
    control.request_stop("the previous launch ended")
    monkeypatch.setattr("surreal_redis.learner.loop.process_started_at", lambda: time.time() + 1.0)
    learner = learner_for(config, fake_redis)
    assert learner.start()
    assert control.stopping() == (False, "") and not learner.stop


class RecordingQueue(PrefetchQueue):
    """An empty prefetch queue that records how long each get was allowed to wait."""

    def __init__(self) -> None:
        super().__init__(1)
        self.timeouts: list[float] = []

    def get(self, timeout: float) -> list:
        self.timeouts.append(timeout)
        raise queue.Empty


def test_off_policy_learner_with_updates_owed_does_not_wait_for_data(fake_redis, tmp_path):
    config = ddpg_config(tmp_path)
    feed = OffPolicyFeed(OffPolicyConfig(batch_size=16, learning_starts=32, pause_reading_at=64, max_train_s=0.0,
                                         replay=ReplayConfig(capacity=10_000)), gamma=0.99)
    learner = learner_for(config, fake_redis, feed)
    learner.start()
    waits = RecordingQueue()
    learner.iterate(waits)  # nothing in hand: waits for data
    send_steps(fake_redis, config, learner, 16)
    learner.iterate(received(learner))  # 32 updates owed, none run (max_train_s=0), reading goes on
    assert feed.owed_updates() == 32 and feed.wants_data()
    feed.config = dataclasses.replace(feed.config, max_train_s=1e-9)  # time for no update yet
    learner.iterate(waits)
    assert waits.timeouts == [0.2, 0.0]


def test_a_reached_target_return_stops_the_run_between_housekeepings(fake_redis, tmp_path, monkeypatch):
    """With ``stop.target_return`` the learner reads the episodes and applies the stop rules
    every STOP_CHECK_EVERY_S (here at every round), not only at the once-a-second housekeeping:
    a run that reached its target stops within 0.2 s."""
    monkeypatch.setattr(loop, "STOP_CHECK_EVERY_S", 0.0)
    config = ppo_config(tmp_path, "stop.target_return=100", "stop.return_window=4")
    learner = learner_for(config, fake_redis)
    learner.start()
    learner.iterate(PrefetchQueue(1))  # housekeeping: the next is a second away
    assert not learner.stop
    EpisodeLog(fake_redis, config.run).record([episode("train", r, 1, agent) for r, agent in
                                               ((150.0, "0"), (90.0, "1"), (110.0, "1"), (100.0, "2"))])
    learner.iterate(PrefetchQueue(1))
    assert learner.stop and "train return" in learner.stop.reason
    assert RunControl(fake_redis, config.run).stopping()[0]
