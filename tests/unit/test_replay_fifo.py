"""FIFOReplay: arrival order, one use per chunk, staleness and capacity drops (all counted)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from surreal_redis.chunks import Chunk
from surreal_redis.replay.fifo import FIFOReplay, FIFOReplayConfig


def chunk(agent_id: int, steps: int = 4, version: int = 0, oldest: int | None = None) -> Chunk:
    versions = np.full(steps, version, dtype=np.int64)
    if oldest is not None:
        versions[0] = oldest
    return Chunk(agent_id=agent_id, env_index=0, obs=np.zeros((steps + 1, 2), np.float32),
                 actions=np.zeros(steps, np.int64), rewards=np.zeros(steps, np.float32),
                 terminated=np.zeros(steps, bool), truncated=np.zeros(steps, bool), final_obs={},
                 policy_version=versions, extras={})


def test_chunks_come_out_once_in_arrival_order():
    replay = FIFOReplay(FIFOReplayConfig(capacity_steps=100, max_policy_lag=None))
    for agent in range(5):
        replay.insert(chunk(agent))
    assert len(replay) == 20
    assert replay.take(21) == []  # not enough yet: nothing is consumed
    assert [c.agent_id for c in replay.take(6)] == [0, 1]  # fewest chunks with >= 6 steps
    assert [c.agent_id for c in replay.take(12)] == [2, 3, 4]
    assert len(replay) == 0 and replay.take(1) == []
    assert replay.stats()["taken_steps"] == 20


def test_stale_chunks_are_dropped_and_counted(caplog):
    replay = FIFOReplay(FIFOReplayConfig(capacity_steps=100, max_policy_lag=1))
    replay.set_learner_version(5)
    replay.insert(chunk(0, version=5))
    replay.insert(chunk(1, version=4))  # lag 1: kept
    replay.insert(chunk(2, version=5, oldest=3))  # its oldest step lags by 2: dropped
    assert len(replay) == 8
    replay.set_learner_version(6)  # agent 1's chunk (version 4) is now 2 behind
    assert [c.agent_id for c in replay.take(1)] == [0]
    assert len(replay) == 0
    stats = replay.stats()
    assert stats["dropped_stale_chunks"] == 2 and stats["dropped_stale_steps"] == 8
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "stale chunk (agent 2" in warnings[0]  # 1st, 10th, 100th... drop
    with pytest.raises(ValueError, match="must not go back: 2 < 6"):
        replay.set_learner_version(2)


def test_capacity_drops_oldest_or_newest():
    oldest_first = FIFOReplay(FIFOReplayConfig(capacity_steps=10, max_policy_lag=None))
    newest_out = FIFOReplay(FIFOReplayConfig(capacity_steps=10, max_policy_lag=None, when_full="drop_newest"))
    for agent in range(4):
        oldest_first.insert(chunk(agent))
        newest_out.insert(chunk(agent))
    assert [c.agent_id for c in oldest_first.take(8)] == [2, 3]
    assert [c.agent_id for c in newest_out.take(8)] == [0, 1]
    for replay in (oldest_first, newest_out):
        assert replay.stats()["dropped_full_chunks"] == 2 and replay.stats()["dropped_full_steps"] == 8


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="when_full must be 'drop_oldest' or 'drop_newest', got 'oldest'"):
        FIFOReplayConfig(when_full="oldest")
    with pytest.raises(ValueError, match="max_policy_lag must be >= 0 or None, got -1"):
        FIFOReplayConfig(max_policy_lag=-1)
    replay = FIFOReplay(FIFOReplayConfig(capacity_steps=3))
    replay.insert(chunk(0))  # longer than the capacity: dropped and counted, not queued
    assert len(replay) == 0 and replay.stats()["dropped_full_steps"] == 4
    with pytest.raises(ValueError, match="num_steps must be >= 1, got 0"):
        replay.take(0)


def ended(agent_id: int, version: int, end_at: int, steps: int = 4) -> Chunk:
    c = chunk(agent_id, steps, version)
    c.terminated[end_at] = True
    return c._replace(rewards=np.arange(1, steps + 1, dtype=np.float32))


def test_a_dropped_chunk_leaves_its_rewards_and_ends_in_stream_order():
    replay = FIFOReplay(FIFOReplayConfig(capacity_steps=100, max_policy_lag=1))
    replay.insert(ended(0, version=0, end_at=1))
    replay.insert(chunk(1, version=0))
    replay.set_learner_version(2)  # both stale: dropped in place
    replay.insert(ended(2, version=0, end_at=3))  # stale on arrival
    replay.insert(chunk(0, version=2))
    assert len(replay) == 4 and replay.stats()["dropped_stale_chunks"] == 3
    taken = replay.take(4)
    before, after = replay.skipped()
    assert [c.agent_id for c in taken] == [0] and after == []
    assert [(s.agent_id, s.ends.tolist()) for s in before] == [
        (0, [False, True, False, False]), (1, [False] * 4), (2, [False, False, False, True])]
    assert before[0].rewards.tolist() == [1, 2, 3, 4]
    assert replay.skipped() == ([], [])  # handed out once


def test_skipped_steps_at_the_head_come_out_without_a_take_and_full_drops_keep_their_place():
    oldest = FIFOReplay(FIFOReplayConfig(capacity_steps=8, max_policy_lag=None))
    for agent in range(3):
        oldest.insert(chunk(agent))  # the third pushes agent 0's chunk out
    before, after = oldest.skipped()
    assert [s.agent_id for s in before] == [0] and after == []
    newest = FIFOReplay(FIFOReplayConfig(capacity_steps=8, max_policy_lag=None, when_full="drop_newest"))
    for _ in range(3):
        newest.insert(chunk(0))  # the third is rejected: it follows the two queued of its stream
    assert newest.skipped() == ([], [])
    assert len(newest.take(8)) == 2
    before, after = newest.skipped()
    assert before == [] and [s.agent_id for s in after] == [0]
