import time

import numpy as np
import pytest

from surreal_redis.hub.experience.backlog import dedup_ratio
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import Heartbeat, read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts
from surreal_redis.status import render_status


def send_frame_stacks(client, steps=40, num_envs=2):
    """A 4-frame stack stream: each step brings one new 84x84 frame per env (moved from the inbox
    into the stream, as the learner does)."""
    sender = ExperienceSender(client, SenderConfig(flush_steps=10, dedup_min_bytes=1024), "st", 0, 1)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (num_envs, 84, 84), dtype=np.uint8) for _ in range(4)]
    for _ in range(steps):
        obs = tuple(frames)
        frames = frames[1:] + [rng.integers(0, 255, (num_envs, 84, 84), dtype=np.uint8)]
        sender.add(obs, np.zeros(num_envs, np.int64), np.ones(num_envs, np.float32),
                   np.zeros(num_envs, bool), np.zeros(num_envs, bool))
    move_inbox(Scripts(client), RunKeys("st").shard(0))
    return sender


def test_dedup_ratio_counts_frame_sharing(fake_redis):
    send_frame_stacks(fake_redis)
    keys = RunKeys("st").shard(0)
    entries = fake_redis.xlen(keys.exp)
    ratio, blobs = dedup_ratio(fake_redis, keys, entries)
    # each entry: 11 stacked observations x 4 frames, of which 10 + 3 are distinct (boundary
    # observations are shared with the neighbouring chunk, so blobs are fewer still)
    assert entries >= 6
    assert blobs <= entries * 13
    assert ratio >= 44 / 13


def test_render_status_lists_agents_shards_and_memory(real_redis):
    send_frame_stacks(real_redis)
    RunControl(real_redis, "st").start()
    Heartbeat(real_redis, "st", 0, ttl_s=30).beat(steps=80, episodes=3, param_version=5)
    text = render_status(real_redis, "st")
    assert "state: running" in text and "learner: no report" in text
    assert "agents: 1 alive, 0 stale" in text and " v5" in text
    assert "shard 0: " in text and ("dedup 3." in text or "dedup 4." in text), text
    assert "redis memory:" in text


def test_render_status_shows_how_the_run_uses_experience_and_time(fake_redis, monkeypatch):
    monkeypatch.setattr(fake_redis, "info", lambda section: {"used_memory_human": "1M"})  # fakeredis lacks INFO
    RunControl(fake_redis, "st").write_learner_status(
        {"iteration": 3, "version": 4, "env_steps": 300, "steps_per_s": 10.0, "updates_per_s": 0.1, "mean_return": None,
         "eval_return": None, "pid": 1, "time": time.time(), "state": "running", "sync": "lockstep",
         "experience_used_fraction": 0.987, "policy_lag_p90": 1, "learner_busy": 0.6, "agent_idle": 0.25,
         "learner_busy_total": 0.5, "agent_idle_total": 0.2}, ttl_s=60)
    Heartbeat(fake_redis, "st", 0, ttl_s=30).beat(steps=80, episodes=3, param_version=4, idle_s=3.0, running_s=12.0)
    Heartbeat(fake_redis, "st", 1, ttl_s=30).beat(steps=80, episodes=3, param_version=4)  # loop not started yet
    text = render_status(fake_redis, "st")
    assert ("  experience used 98.7%, policy lag p90 1, learner busy 60%, agents idle 25% [lockstep]" in text), text
    rows = [line for line in text.splitlines() if " v4 " in line]
    assert rows[0].split()[-1] == "25%" and rows[1].split()[-1] == "-", rows


def test_render_status_of_an_older_learner_shows_dashes(fake_redis, monkeypatch):
    monkeypatch.setattr(fake_redis, "info", lambda section: {"used_memory_human": "1M"})
    RunControl(fake_redis, "st").write_learner_status(
        {"iteration": 3, "version": 4, "env_steps": 300, "steps_per_s": 10.0, "updates_per_s": 0.1, "mean_return": None,
         "eval_return": None, "pid": 1, "time": time.time(), "state": "stopped"}, ttl_s=60)
    assert "  experience used -, policy lag p90 -, learner busy -, agents idle -\n" in render_status(fake_redis, "st")


def test_heartbeats_carry_idle_time_and_refuse_negative_seconds(fake_redis):
    beat = Heartbeat(fake_redis, "st", 5, ttl_s=30)
    beat.beat(10, 0, 1, idle_s=1.5, running_s=6.0)
    (agent,) = read_agents(fake_redis, "st", ttl_s=30)
    assert (agent.idle_s, agent.running_s, agent.idle_fraction) == (1.5, 6.0, 0.25)
    with pytest.raises(ValueError, match="-1.0"):
        beat.beat(10, 0, 1, idle_s=-1.0, running_s=6.0)
