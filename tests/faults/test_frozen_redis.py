"""redis-server frozen (SIGSTOP) for 15 s, longer than every socket timeout, while an agent sends
and a learner-side receiver reads and acks: nothing dies, and every chunk counted as sent arrives
exactly once."""

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from surreal_redis.connection import CONNECTION_ERRORS, RedisSettings, connect
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys

from .conftest import add_steps, assert_exactly_once, drain

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "frozen"
KEYS = RunKeys(RUN).shard(0)
FROZEN_S = 15.0
SHORT = RedisSettings(socket_timeout=1.0, connect_timeout=1.0)  # far below the freeze


def server_pid(watcher_pid: int) -> int:
    """The redis-server under EmbeddedRedis's watching sh."""
    children = Path(f"/proc/{watcher_pid}/task/{watcher_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_a_redis_frozen_for_15_s_loses_and_repeats_nothing(redis_server, real_redis):
    pid = server_pid(redis_server.process.pid)
    agent, learner = connect(redis_server.url, SHORT), connect(redis_server.url, SHORT)
    sender = ExperienceSender(agent, SenderConfig(flush_steps=2, retry_base_s=0.05, retry_cap_s=0.5), RUN, 0, 1)
    receiver = ExperienceReceiver(learner, ReceiverConfig(claim_every_s=0), RUN, 1)
    flushes, errors, got = 40, [], []
    reading = threading.Event()
    reading.set()

    def agent_loop():
        try:
            rng = np.random.default_rng(0)
            for flush in range(flushes):
                add_steps(sender, 2 * flush, 2, rng)
                time.sleep(0.1)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    def learner_loop():
        try:
            while reading.is_set():
                got.extend(drain(receiver, rounds=1, errors=CONNECTION_ERRORS))
                time.sleep(0.05)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=agent_loop, daemon=True), threading.Thread(target=learner_loop, daemon=True)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_S)
        sent_while_frozen = sender.stats().chunks
    finally:
        os.kill(pid, signal.SIGCONT)
    threads[0].join(timeout=60)
    reading.clear()
    threads[1].join(timeout=30)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    got += drain(receiver, errors=CONNECTION_ERRORS)
    stats = sender.stats()
    # the freeze was felt on both sides, and outlived it
    assert stats.error_retries > 0 and sent_while_frozen < stats.chunks
    assert stats.chunks_dropped == 0 and stats.chunks == 2 * (flushes - 1)  # the last steps complete no chunk
    expected = {(0, e, 1000.0 * k + e) for e in (0, 1) for k in range(0, 2 * (flushes - 1), 2)}
    assert assert_exactly_once(got) == expected
    assert real_redis.xlen(KEYS.exp) == len(expected) and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    agent.close()
    learner.close()
