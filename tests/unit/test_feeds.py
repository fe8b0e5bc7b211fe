"""The learner's feeds: on-policy (FIFO, staleness) and off-policy (n-step replay, replay ratio,
rate limiter, priorities) behind one ingest/wants_data/train/on_publish/refill/stats face."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from surreal_redis.chunks import Chunk, TransitionBatch
from surreal_redis.replay import ReplayConfig
from surreal_redis.replay.feeds import ExperienceUse, OffPolicyConfig, OffPolicyFeed, OnPolicyFeed
from surreal_redis.replay.fifo import FIFOReplayConfig
from surreal_redis.replay.rate_limiter import RateLimiterConfig


def chunk(env_index: int, start: int, steps: int, version: int = 0) -> Chunk:
    """``steps`` steps of one env with no episode end; obs[t] = [env, start + t, 0] identifies the step."""
    t = np.arange(start, start + steps + 1, dtype=np.float32)
    obs = np.stack([np.full_like(t, env_index), t, np.zeros_like(t)], axis=1)
    return Chunk(agent_id=0, env_index=env_index, obs=obs, actions=np.zeros((steps, 1), np.float32),
                 rewards=np.ones(steps, np.float32), terminated=np.zeros(steps, bool),
                 truncated=np.zeros(steps, bool), final_obs={}, policy_version=np.full(steps, version, np.int64),
                 extras={})


def stream(env_index: int, chunks: int, steps: int, first: int = 0) -> list[Chunk]:
    return [chunk(env_index, (first + i) * steps, steps) for i in range(chunks)]


def never_iterated():
    raise AssertionError("the on-policy feed must not read the retained window")
    yield  # a generator: reading it is what fails


class ChunkTrainer:
    """Records each on-policy update's chunks; sets ``stop_after`` updates' stop if given."""

    def __init__(self, stop: threading.Event | None = None, stop_after: int = 0) -> None:
        self.updates: list[list[Chunk]] = []
        self.skips: list[list] = []  # each call's SkippedSteps
        self.stop, self.stop_after = stop, stop_after

    def update(self, chunks: list[Chunk]) -> dict[str, float]:
        self.updates.append(chunks)
        if self.stop is not None and len(self.updates) == self.stop_after:
            self.stop.set()
        return {"steps": float(sum(c.num_steps for c in chunks))}

    def skipped(self, steps) -> None:
        self.skips.append(steps)


class BatchTrainer:
    """Records each off-policy batch and the observations handed over as inserted (``observed``,
    with the number of updates before each); TD errors from ``td(batch)`` (zeros by default)."""

    def __init__(self, td=None) -> None:
        self.batches: list[TransitionBatch] = []
        self.observed: list[tuple[int, np.ndarray]] = []
        self.td = td or (lambda batch: np.zeros(len(batch.rewards)))

    def update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        self.batches.append(batch)
        return {"loss": 0.0}, self.td(batch)

    def observe_inserted(self, obs: np.ndarray) -> None:
        self.observed.append((len(self.batches), obs))


def off_policy(selector: str = "uniform", **overrides) -> OffPolicyFeed:
    settings = dict(n_step=1, batch_size=4, learning_starts=10, updates_per_step=0.5, max_train_s=None,
                    replay=ReplayConfig(capacity=1000, selector=selector))
    return OffPolicyFeed(OffPolicyConfig(**{**settings, **overrides}), gamma=0.99, seed=0)


# ---------------------------------------------------------------- on-policy

def test_on_policy_feed_updates_once_per_steps_per_update_in_arrival_order():
    feed = OnPolicyFeed(FIFOReplayConfig(max_policy_lag=None), steps_per_update=8)
    chunks = [chunk(env, 0, 4) for env in range(5)]
    for c in chunks:
        feed.ingest(c)
    trainer = ChunkTrainer()
    stats = list(feed.train(trainer, threading.Event()))
    assert stats == [{"steps": 8.0}, {"steps": 8.0}]
    assert [[c.env_index for c in update] for update in trainer.updates] == [[0, 1], [2, 3]]
    assert feed.stats()["size"] == 4 and feed.stats()["taken_steps"] == 16
    assert list(feed.train(trainer, threading.Event())) == []  # 4 steps wait for 4 more
    assert feed.wants_data()


def test_on_policy_feed_drops_chunks_too_stale_for_the_published_version():
    feed = OnPolicyFeed(FIFOReplayConfig(max_policy_lag=1), steps_per_update=4)
    feed.ingest(chunk(0, 0, 4, version=0))
    feed.on_publish(2)  # version 0 is now 2 behind
    feed.ingest(chunk(1, 0, 4, version=0))  # arrives too stale
    feed.ingest(chunk(2, 0, 4, version=1))
    trainer = ChunkTrainer()
    assert len(list(feed.train(trainer, threading.Event()))) == 1
    assert [c.env_index for c in trainer.updates[0]] == [2]
    assert feed.stats()["dropped_stale_chunks"] == 2
    assert [[s.env_index for s in steps] for steps in trainer.skips] == [[0, 1]]  # before the update


def test_on_policy_feed_stops_between_updates():
    feed = OnPolicyFeed(FIFOReplayConfig(max_policy_lag=None), steps_per_update=4)
    for env in range(3):
        feed.ingest(chunk(env, 0, 4))
    stop = threading.Event()
    trainer = ChunkTrainer(stop, stop_after=1)
    assert len(list(feed.train(trainer, stop))) == 1
    assert feed.stats()["size"] == 8  # the rest waits for the next run


def test_on_policy_feed_does_not_read_old_experience_on_refill():
    feed = OnPolicyFeed(FIFOReplayConfig(), steps_per_update=4)
    assert feed.refill(never_iterated()) == 0
    assert feed.stats()["size"] == 0


def test_on_policy_feed_says_what_its_next_update_still_needs_and_what_became_of_each_step():
    feed = OnPolicyFeed(FIFOReplayConfig(max_policy_lag=1, capacity_steps=12), steps_per_update=8)
    assert feed.steps_needed() == 8 and feed.use() == ExperienceUse(used=0, dropped=0, held=0)
    feed.ingest(chunk(0, 0, 4, version=0))
    feed.ingest(chunk(1, 0, 4, version=1))
    feed.ingest(chunk(2, 0, 4, version=1))
    assert feed.steps_needed() == 0 and feed.steps_needed(ahead=1) == 4  # 12 held: an update and a half
    assert len(list(feed.train(ChunkTrainer(), threading.Event()))) == 1
    assert feed.use() == ExperienceUse(used=8, dropped=0, held=4) and feed.steps_needed() == 4
    feed.on_publish(3)  # the held version-1 chunk is 2 behind now: dropped, and needed again
    assert feed.use() == ExperienceUse(used=8, dropped=4, held=0) and feed.steps_needed() == 8
    for env in range(4):  # 16 steps into a 12-step capacity: the oldest 4 are pushed out
        feed.ingest(chunk(env, 4, 4, version=3))
    assert feed.use() == ExperienceUse(used=8, dropped=8, held=12) and feed.steps_needed() == 0


def test_off_policy_feed_grants_nothing_and_has_no_use_to_report():
    feed = off_policy()
    feed.ingest(chunk(0, 0, 6))
    assert feed.steps_needed() is None and feed.use() is None


# ---------------------------------------------------------------- off-policy

def test_off_policy_feed_owes_updates_at_the_ratio_once_the_replay_can_be_sampled():
    feed, trainer, stop = off_policy(), BatchTrainer(), threading.Event()
    feed.ingest(chunk(0, 0, 6))
    assert list(feed.train(trainer, stop)) == []  # 6 < learning_starts: these 6 earn no updates
    feed.ingest(chunk(0, 6, 6))  # 12 >= 10: the 6 new transitions earn 0.5 updates each
    assert len(list(feed.train(trainer, stop))) == 3
    feed.ingest(chunk(0, 12, 6))
    feed.ingest(chunk(0, 18, 5))
    assert len(list(feed.train(trainer, stop))) == 5  # int(17 * 0.5) - 3
    assert feed.stats() == {"size": 23, "inserted_transitions": 23, "updates": 8, "owed_updates": 0}
    assert all(batch.rewards.shape == (4,) for batch in trainer.batches)


def test_off_policy_feed_pauses_reading_while_updates_are_owed():
    feed, trainer, stop = off_policy(updates_per_step=1.0, pause_reading_at=4, max_train_s=0.0), BatchTrainer(), \
        threading.Event()
    feed.ingest(chunk(0, 0, 6))
    assert list(feed.train(trainer, stop)) == [] and feed.wants_data()  # 6 < learning_starts
    feed.ingest(chunk(0, 6, 4))
    assert feed.owed_updates() == 4
    assert list(feed.train(trainer, stop)) == []  # no time to train (max_train_s=0): still owed
    assert not feed.wants_data()
    feed.config = dataclasses.replace(feed.config, max_train_s=None)
    assert len(list(feed.train(trainer, stop))) == 4
    assert feed.wants_data()


def test_off_policy_feed_samples_only_what_the_rate_limiter_allows():
    # about 4 samples per inserted transition once 10 are in, give or take 8
    limiter = RateLimiterConfig(min_size_to_sample=10, samples_per_insert=4.0, error_buffer=8.0)
    feed, trainer = off_policy(rate_limiter=limiter, updates_per_step=None, pause_reading_at=1), BatchTrainer()
    feed.ingest(chunk(0, 0, 6))
    assert list(feed.train(trainer, threading.Event())) == []
    feed.ingest(chunk(0, 6, 6))
    # 12 inserts: sampling 4 more is allowed while 12 * 4 - samples - 4 >= 10 * 4 - 8
    assert len(list(feed.train(trainer, threading.Event()))) == 4
    assert feed.owed_updates() == 0
    assert feed.wants_data()  # only new data lets the limiter sample again
    feed.ingest(chunk(0, 12, 1))
    assert len(list(feed.train(trainer, threading.Event()))) == 1


@pytest.mark.parametrize("samples_per_insert, batch_size", [(512.0, 256), (64.0, 256), (8.0, 4)])
def test_the_rate_limiter_sets_the_replay_ratio_above_and_below_one(samples_per_insert, batch_size):
    """``samples_per_insert / batch_size`` updates per inserted transition, as its docstring says:
    512 samples per insert at batch 256 is 2 updates per transition (a run made 1.01 when the
    limiter could only hold back what ``updates_per_step`` allowed)."""
    limiter = RateLimiterConfig(min_size_to_sample=batch_size, samples_per_insert=samples_per_insert,
                                error_buffer=max(1.0, samples_per_insert))
    feed = off_policy(rate_limiter=limiter, updates_per_step=None, batch_size=batch_size, learning_starts=0,
                      replay=ReplayConfig(capacity=100_000))
    trainer, stop, steps = BatchTrainer(), threading.Event(), 64
    for i in range(80):
        feed.ingest(chunk(0, i * steps, steps))
        list(feed.train(trainer, stop))
    inserted = 80 * steps - batch_size  # the ratio holds from min_size_to_sample on
    assert len(trainer.batches) / inserted == pytest.approx(samples_per_insert / batch_size, rel=0.02)


def test_refilled_transitions_earn_no_updates_and_new_ones_do():
    """A restarted learner refills its replay from the hub: trained on before, so not owed again;
    what arrives afterwards is trained on at the ratio, whatever the restored update count."""
    feed, trainer, stop = off_policy(), BatchTrainer(), threading.Event()
    assert feed.refill(stream(0, 3, 6)) == 18
    assert feed.ready() and feed.owed_updates() == 0
    assert list(feed.train(trainer, stop)) == []
    feed.ingest(chunk(0, 18, 6))
    assert len(list(feed.train(trainer, stop))) == 3
    assert feed.stats()["inserted_transitions"] == 6


def test_the_rate_limiter_counts_from_learning_starts_like_updates_per_step():
    """A limiter whose own ``min_size_to_sample`` is below ``learning_starts`` counted every
    transition before the first update: 1001 updates at the 1000th transition. The ratio counts
    from ``learning_starts`` (Reverb's ``min_size_to_sample``): the limiter owes what
    ``updates_per_step`` owes, up to a chunk and its error buffer."""
    limiter = RateLimiterConfig(samples_per_insert=4.0, error_buffer=8.0)  # min_size_to_sample 1
    by_ratio = off_policy(updates_per_step=1.0, learning_starts=100)
    by_limiter = off_policy(updates_per_step=None, learning_starts=100, rate_limiter=limiter)
    trainers, stop = (BatchTrainer(), BatchTrainer()), threading.Event()
    for i in range(10):
        for feed, trainer in zip((by_ratio, by_limiter), trainers):
            feed.ingest(chunk(0, i * 10, 10))
            list(feed.train(trainer, stop))
    at_start = [len(trainer.batches) for trainer in trainers]
    assert at_start[0] == 10 and at_start[1] <= 8 / 4  # the crossing chunk; the error buffer
    for i in range(10, 30):
        for feed, trainer in zip((by_ratio, by_limiter), trainers):
            feed.ingest(chunk(0, i * 10, 10))
            list(feed.train(trainer, stop))
    ratio, limited = (len(trainer.batches) for trainer in trainers)
    assert ratio == 210 and abs(limited - ratio) <= 10 + 8 / 4
    assert by_limiter.limiter.min_size_to_sample == 100


@pytest.mark.parametrize("checkpointed", [True, False])
def test_refilled_transitions_give_the_rate_limiter_no_allowance(checkpointed):
    """5000 refilled transitions once led to 4002 updates on old data before any new one: refills
    are no inserts. The limiter's counts come back from the feed's state; without them (an older
    checkpoint) the ratio starts again after ``learning_starts`` new transitions."""
    limiter = RateLimiterConfig(samples_per_insert=4.0, error_buffer=4.0)  # one update per transition
    settings = dict(updates_per_step=None, rate_limiter=limiter)
    before, trainer, stop = off_policy(**settings), BatchTrainer(), threading.Event()
    for c in stream(0, 5, 6):
        before.ingest(c)
        list(before.train(trainer, stop))
    assert before.limiter.inserts == 30 and before.owed_updates() == 0
    restarted, trainer = off_policy(**settings), BatchTrainer()
    if checkpointed:
        restarted.load_state_dict(before.state_dict())
    assert restarted.refill(stream(0, 100, 6, first=5)) == 600
    assert len(list(restarted.train(trainer, stop))) == 0 and trainer.observed == []  # nothing owed, nothing new
    assert restarted.limiter.inserts == (30 if checkpointed else 0)
    restarted.ingest(chunk(0, 630, 6))
    # checkpointed: 6 new transitions, 6 updates; else 6 < learning_starts (10) new ones: none yet
    assert len(list(restarted.train(trainer, stop))) == (6 if checkpointed else 0)
    if not checkpointed:
        restarted.ingest(chunk(0, 636, 6))  # 12 new: 12 * 4 - 0 >= 10 * 4 - 4 + 4 * updates
        assert len(list(restarted.train(trainer, stop))) == 3


def test_each_ingested_transition_reaches_the_trainer_once_before_it_is_sampled():
    """Running statistics (the z-filter) take in the inserted data, each transition once, before
    updates; refilled transitions never, and sampled batches are no inserts."""
    feed, trainer, stop = off_policy(n_step=2), BatchTrainer(), threading.Event()
    feed.refill(stream(1, 2, 6))
    feed.ingest(chunk(0, 0, 6))  # n-step 2: the stream's last step waits for the next chunk
    assert list(feed.train(trainer, stop)) != []
    feed.ingest(chunk(0, 6, 6))
    list(feed.train(trainer, stop))
    assert [updates for updates, _ in trainer.observed] == [0, 2] and len(trainer.batches) == 5  # 0.5 per step
    observed = np.concatenate([obs for _, obs in trainer.observed])
    np.testing.assert_array_equal(observed[:, 1], np.arange(11))  # obs[t] = [env, t, 0] of env 0, once each
    assert (observed[:, 0] == 0).all() and feed.stats()["inserted_transitions"] == 11


def test_stop_ends_off_policy_training_between_updates():
    feed, stop = off_policy(updates_per_step=1.0), threading.Event()
    feed.ingest(chunk(0, 0, 6))
    list(feed.train(BatchTrainer(), stop))
    feed.ingest(chunk(0, 6, 6))
    updates = feed.train(BatchTrainer(), stop)
    next(updates)
    stop.set()
    assert list(updates) == []
    assert feed.owed_updates() == 5


def test_prioritized_feed_turns_td_errors_into_priorities():
    marked: list[int] = []

    def td(batch: TransitionBatch) -> np.ndarray:  # a huge error for the first slot sampled, none elsewhere
        if not marked:
            marked.append(int(batch.indices[0]))
        return np.where(batch.indices == marked[0], 1000.0, 0.0)

    feed, trainer = off_policy("prioritized", batch_size=16, learning_starts=90, updates_per_step=1.0), \
        BatchTrainer(td)
    feed.ingest(chunk(0, 0, 90))
    list(feed.train(trainer, threading.Event()))
    feed.ingest(chunk(0, 90, 12))
    assert len(list(feed.train(trainer, threading.Event()))) == 12
    # the marked slot holds most of the priority mass by now (uniform sampling: 1 in 102)
    assert np.count_nonzero(trainer.batches[-1].indices == marked[0]) >= 3


def test_state_dict_restores_the_sampling_sequence():
    first, second = off_policy(), off_policy()
    for feed in (first, second):
        feed.refill(stream(0, 3, 6))
    first.replay.sample(4, first.rng)  # advance first's generator
    second.load_state_dict(first.state_dict())
    assert (first.replay.sample(4, first.rng).indices == second.replay.sample(4, second.rng).indices).all()


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="batch_size"):
        OffPolicyConfig(batch_size=0)
    with pytest.raises(ValueError, match="updates_per_step must be > 0 or null, got -1"):
        OffPolicyConfig(updates_per_step=-1)
    with pytest.raises(ValueError, match="updates_per_step .2.0. and rate_limiter.samples_per_insert .4.0. both"):
        OffPolicyConfig(updates_per_step=2.0, rate_limiter=RateLimiterConfig(samples_per_insert=4.0, error_buffer=4.0))
    with pytest.raises(ValueError, match="selector must be 'uniform' or 'prioritized', got 'per'"):
        ReplayConfig(selector="per")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps_per_update must be >= 1, got 0"):
        OnPolicyFeed(FIFOReplayConfig(), 0)


def test_the_reward_scaler_restarts_its_return_at_an_episode_end_held_by_a_dropped_chunk():
    """A chunk dropped for lag ended an episode: the stream's next chunk starts a new return, as
    it would have had the chunk been trained on."""
    import gymnasium as gym
    import torch

    from surreal_redis.algos.ppo.trainer import PPOConfig, PPOTrainer

    def trainer() -> PPOTrainer:
        box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        return PPOTrainer(PPOConfig(normalize_reward=True, gamma=0.5, update_epochs=1, num_minibatches=1),
                          box, gym.spaces.Discrete(2), device="cpu")

    def extras(c: Chunk) -> Chunk:
        return c._replace(actions=np.zeros(c.num_steps, np.int64), extras={"logp": np.zeros(c.num_steps, np.float32)})

    first, dropped, last = (extras(c) for c in stream(0, 3, 4))
    dropped.terminated[3] = True  # its last step ended the episode
    dropped = dropped._replace(final_obs={3: dropped.obs[4]})
    last = last._replace(policy_version=np.full(4, 2, np.int64))
    feed = OnPolicyFeed(FIFOReplayConfig(max_policy_lag=1), steps_per_update=4)
    learner = trainer()
    feed.ingest(first)
    assert len(list(feed.train(learner, threading.Event()))) == 1
    feed.ingest(dropped._replace(policy_version=np.zeros(4, np.int64)))
    feed.on_publish(2)  # the learner moved on: the chunk is dropped for lag
    feed.ingest(last)
    assert len(list(feed.train(learner, threading.Event()))) == 1
    assert feed.stats()["dropped_stale_chunks"] == 1

    reference = trainer().reward_scaler  # the stream as it was made: first, dropped, last
    for c in (first, dropped, last):
        reference.update(torch.as_tensor(c.rewards), torch.as_tensor(c.terminated), stream=(0, 0))
    assert learner.reward_scaler.get_extra_state() == pytest.approx(reference.get_extra_state())
    assert learner.reward_scaler.get_extra_state()[(0, 0)] == pytest.approx(1.875)  # 4 steps since the end
