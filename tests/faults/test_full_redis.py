"""A Redis filled to maxmemory below the retention caps (``hub.retention.max_entries`` not reached,
no ``max_age_s``): the janitor frees memory by pressure, acked experience first, then unread
entries oldest first (counted), until writes succeed; a learner that cannot get a write through
still honours ``stop.max_seconds``; the eval process backs off instead of dying."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from surreal_redis.algos.learning import make_trainer
from surreal_redis.config import load_config
from surreal_redis.envs import make_env
from surreal_redis.evaluator import Evaluator
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, HubUnavailableError, SenderConfig
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.keys import RunKeys
from surreal_redis.learner.chunk_check import ChunkCheck
from surreal_redis.learner.loop import Learner
from surreal_redis.learner.parts import FeedSettings, LearnerParts, make_feed
from surreal_redis.runtime import StopFlag

from .conftest import add_steps

pytestmark = [pytest.mark.faults, pytest.mark.integration]

FAST = {"retry_base_s": 0.01, "retry_cap_s": 0.05}
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


def cartpole_learner(tmp_path, client: redis.Redis, overrides: list[str]) -> Learner:
    """The smoke config's CartPole PPO learner, in process, without stop conditions but ``overrides``."""
    config = load_config("smoke", [f"experiment.root={tmp_path}", "experiment.name=full_redis",
                                   "tracking.enabled=false", "ppo.device=cpu", "ppo.hidden_sizes=[16, 16]",
                                   "stop.max_env_steps=null", "stop.max_seconds=null", *overrides])
    env = make_env(config.env, seed=0)
    section = config.algo_config
    parts = LearnerParts(make_trainer(section, env.observation_space, env.action_space, seed=0),
                         make_feed(section, FeedSettings.of(config), seed=0),
                         ChunkCheck.for_experiment(config, env.observation_space, env.action_space))
    env.close()
    return Learner(config, client, StopFlag(install_handlers=False), parts)


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)


def fill(client: redis.Redis, sender: ExperienceSender, rng: np.random.Generator, start: int) -> int:
    """Flush batches until the full Redis refuses them for the sender's max_wait_s; returns the
    next step index."""
    with pytest.raises(HubUnavailableError):
        for flush in range(2000):
            add_steps(sender, start + 2 * flush, 2, rng)
    return start + 4000


def writes_refused(client: redis.Redis) -> bool:
    try:
        client.set("probe", b"x" * (128 << 10))  # about an agent's batch
    except redis.exceptions.OutOfMemoryError:
        return True
    client.delete("probe")
    return False


@pytest.mark.parametrize("high_water", [0.9, 0.5])
def test_the_janitor_frees_a_redis_filled_below_the_caps_acked_entries_first(real_redis, high_water):
    """0.9: freeing acked entries is enough, no unread one goes; 0.5: they all go, then the oldest
    unread ones, counted."""
    run = "below-caps"
    keys = RunKeys(run).shard(0)
    real_redis.config_set("stream-node-max-entries", 4)
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] + (4 << 20))
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, max_wait_s=0.2, **FAST), run, 0, 1)
    rng = np.random.default_rng(0)
    # Half the memory in entries the learner acked, the other half unread: far below the cap.
    for flush in range(70):
        add_steps(sender, 2 * flush, 2, rng)
    reader = ExperienceReceiver(real_redis, ReceiverConfig(), run, 1)
    acked = []
    while batch := reader.receive(64, block_ms=0):
        reader.ack(batch)
        acked += batch
    fill(real_redis, sender, rng, 1000)
    sent = sender.stats().chunks
    assert writes_refused(real_redis) and len(acked) >= 100 and sent < 5000

    janitor = HubJanitor(real_redis, RetentionConfig(max_entries=5000, memory_high_water=high_water,
                                                         pressure_step=10), run, 1)
    stats = janitor.run_once()
    memory = real_redis.info("memory")
    assert memory["used_memory"] <= high_water * memory["maxmemory"] and not writes_refused(real_redis)
    assert stats.pressure_trimmed == stats.trimmed > 0
    # acked entries went first, and only once all of them had gone as few unread ones as needed
    if high_water == 0.9:
        assert stats.unread_dropped == 0 and stats.trimmed <= len(acked)
    else:
        assert stats.trimmed - stats.unread_dropped == len(acked) and stats.unread_dropped > 0
    assert janitor.unread_dropped_total == stats.unread_dropped < sent - len(acked)
    left = ExperienceReceiver(real_redis, ReceiverConfig(), run, 1)
    late = []
    while batch := left.receive(64, block_ms=0):
        left.ack(batch)
        late += batch
    kept_acked = len(acked) - (stats.trimmed - stats.unread_dropped)  # retained, not delivered again
    assert len(acked) + stats.unread_dropped + len(late) == sent  # every chunk accounted for
    assert real_redis.xlen(keys.exp) == kept_acked + len(late)
    oldest_left = min(float(item.chunk.rewards[0]) for item in late)
    assert oldest_left > max(float(item.chunk.rewards[0]) for item in acked)  # the newest unread ones stay
    assert real_redis.zcard(keys.obsref) <= 3 * len(late)  # the blobs of the trimmed entries were collected


def test_the_janitor_relieves_no_pressure_below_the_high_water_mark(real_redis):
    run = "no-pressure"
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, **FAST), run, 0, 1)
    add_steps(sender, 0, 8, np.random.default_rng(1))
    reader = ExperienceReceiver(real_redis, ReceiverConfig(), run, 1)
    got = reader.receive(64, block_ms=0)
    reader.ack(got)
    stats = HubJanitor(real_redis, RetentionConfig(max_entries=5000), run, 1).run_once()
    assert stats.trimmed == stats.pressure_trimmed == 0 and real_redis.xlen(RunKeys(run).shard(0).exp) == len(got) > 0


def test_a_learner_started_into_a_redis_filled_below_the_caps_publishes(real_redis, tmp_path):
    learner = cartpole_learner(tmp_path, real_redis, ["hub.retention.max_entries=5000"])
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] + (3 << 20))
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, max_wait_s=0.2, **FAST), learner.config.run, 0, 1)
    fill(real_redis, sender, np.random.default_rng(0), 0)
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(learner.start()), daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        learner.stop.set("test")
        thread.join(timeout=10)
    assert outcome == [True], "start() did not publish within 60 s"
    assert learner.param_version == 1 and learner.janitor.unread_dropped_total > 0
    assert sender.stats().chunks == real_redis.xlen(RunKeys(learner.config.run).shard(0).exp) + \
        learner.janitor.unread_dropped_total


def test_a_learner_that_cannot_write_still_stops_at_max_seconds(real_redis, tmp_path):
    """Memory the janitor cannot free (another run's keys): the learner retries its start and
    still stops when stop.max_seconds has passed."""
    learner = cartpole_learner(tmp_path, real_redis, ["stop.max_seconds=2"])
    real_redis.set("someone-else", b"x" * (1 << 20))
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] - (1 << 19))
    assert writes_refused(real_redis)
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(learner.run()), daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        learner.stop.set("test")
        thread.join(timeout=10)
    assert done == [0] and "stop.max_seconds=2" in learner.stop.reason
    assert learner.algo.iteration == 0


def test_the_evaluator_backs_off_on_a_full_redis_and_records_its_eval_later(real_redis, tmp_path):
    config = load_config("smoke", [f"experiment.root={tmp_path}", "tracking.enabled=false", "eval.episodes=2",
                                   "eval.every_s=0.1", "ppo.hidden_sizes=[16, 16]"])
    env = make_env(config.env, seed=0)
    algo = make_trainer(config.with_overrides(["ppo.device=cpu"]).algo_config, env.observation_space,
                          env.action_space)
    env.close()
    ParameterPublisher(real_redis, config.run, config.hub.publisher).publish(algo.actor_params(), 0, force=True)
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] - (1 << 19))
    stop = StopFlag(install_handlers=False)
    evaluator = Evaluator(config, real_redis, stop)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            evaluator.run()
        except BaseException as exc:  # the assertions below report it
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: errors or evaluator.records_refused >= 2, 60, "an eval refused for lack of memory")
        assert errors == [] and thread.is_alive()
        real_redis.config_set("maxmemory", "128mb")  # the learner's janitor freed memory
        evals = RunKeys(config.run).evals
        wait_until(lambda: real_redis.xlen(evals) >= 2 or errors, 60, "the eval recorded")
    finally:
        stop.set("test")
        thread.join(timeout=30)
    assert errors == [] and not thread.is_alive()
    records = real_redis.xrange(evals)
    assert len({fields[b"version"] for _, fields in records}) == 1 and len(records) % 2 == 0  # whole evals only


@pytest.mark.slow
def test_a_lockstep_launch_finishes_while_an_agent_keeps_redis_full_below_the_caps(tmp_path):
    """A launch of the smoke config (lockstep) on a 24 MB Redis that a foreign agent (84x84 frames
    the CartPole learner sets aside as unusable) fills before the learner starts and keeps
    refilling during the run, never near hub.retention.max_entries: the run reaches its step
    limit, and the learner trimmed by memory to get there."""
    from surreal_redis.connection import connect
    from surreal_redis.embedded import EmbeddedRedis

    server = EmbeddedRedis(maxmemory="24mb").start()
    client = connect(server.url)
    done = threading.Event()
    sender = ExperienceSender(client, SenderConfig(flush_steps=2, max_wait_s=1, **FAST), "smoke", 99, 1)

    def filler() -> None:
        rng = np.random.default_rng(0)
        wait_until(lambda: done.is_set() or client.exists(RunKeys("smoke").control), 60, "the launcher's run state")
        step = 0
        while not done.is_set():
            with contextlib.suppress(HubUnavailableError):  # full for a second: the janitor frees it later
                add_steps(sender, step, 2, rng)
            step += 2
            if sender.stats().oom_retries:  # full once: from now on about 0.8 MB/s
                done.wait(0.05)

    thread = threading.Thread(target=filler, daemon=True)
    thread.start()
    try:
        launched = subprocess.run([sys.executable, "-m", "surreal_redis.cli", "launch", SMOKE, "-o",
                                   f"experiment.root={tmp_path}", "-o", f"redis.url={server.url}", "-o",
                                   "eval.enabled=false", "-o", "stop.max_seconds=80"],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        done.set()
        thread.join(timeout=30)
        client.close()
        server.stop()
    logs = "\n".join(path.read_text() for path in (tmp_path / "smoke" / "logs").glob("*.log"))
    assert launched.returncode == 0, launched.stderr[-4000:]
    assert "run 'smoke' finished (reached" in launched.stderr, launched.stderr[-4000:]
    # full before the learner's first publish and again during the run
    assert sender.stats().oom_retries > 0 and logs.count("memory pressure: trimmed") >= 2


def test_memory_pressure_takes_every_shards_acked_entries_before_any_unread_one(real_redis):
    """Shard 1 holds what the learner acked, shard 0 (filled later) only unread entries: trimming
    by memory empties shard 1's acked entries before it drops anything of shard 0."""
    run = "two-shards"
    real_redis.config_set("stream-node-max-entries", 4)
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] + (4 << 20))
    rng = np.random.default_rng(2)
    acked_sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, max_wait_s=0.2, **FAST), run, 1, 2)
    for flush in range(40):
        add_steps(acked_sender, 2 * flush, 2, rng)
    reader = ExperienceReceiver(real_redis, ReceiverConfig(), run, 2)
    acked = []
    while batch := reader.receive(64, block_ms=0):
        reader.ack(batch)
        acked += batch
    unread_sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, max_wait_s=0.2, **FAST), run, 0, 2)
    fill(real_redis, unread_sender, rng, 1000)
    assert writes_refused(real_redis) and len(acked) >= 60
    stats = HubJanitor(real_redis, RetentionConfig(max_entries=5000, memory_high_water=0.5, pressure_step=10),
                       run, 2).run_once()
    assert not writes_refused(real_redis) and stats.unread_dropped > 0
    assert stats.trimmed - stats.unread_dropped == len(acked) and real_redis.xlen(RunKeys(run).shard(1).exp) == 0


@pytest.mark.parametrize(("field", "value"), [("memory_high_water", 0.0), ("memory_high_water", 1.5),
                                              ("pressure_step", 0), ("pressure_step", 1001)])
def test_bad_memory_pressure_settings_are_refused_naming_the_value(field, value):
    with pytest.raises(ValueError, match=f"retention.{field} must be .*, got {value}"):
        RetentionConfig(**{field: value})
