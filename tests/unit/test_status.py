import numpy as np

from surreal_redis.hub.experience.backlog import dedup_ratio
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.keys import RunKeys
from surreal_redis.status import render_status


def send_frame_stacks(client, steps=40, num_envs=2):
    """A 4-frame stack stream: each step brings one new 84x84 frame per env."""
    sender = ExperienceSender(client, SenderConfig(flush_steps=10, dedup_min_bytes=1024), "st", 0, 1)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (num_envs, 84, 84), dtype=np.uint8) for _ in range(4)]
    for _ in range(steps):
        obs = tuple(frames)
        frames = frames[1:] + [rng.integers(0, 255, (num_envs, 84, 84), dtype=np.uint8)]
        sender.add(obs, np.zeros(num_envs, np.int64), np.ones(num_envs, np.float32),
                   np.zeros(num_envs, bool), np.zeros(num_envs, bool))
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
