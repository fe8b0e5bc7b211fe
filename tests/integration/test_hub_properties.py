"""Property test on a real redis-server: random inserts, reads, trims and gc passes keep every
retained entry resolvable, and leave no observation behind its last reference after a gc pass."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

pytestmark = pytest.mark.integration

RUN = "prop"
KEYS = RunKeys(RUN).shard(0)
FRAMES = [np.full((32, 32), i, np.uint8) for i in range(6)]  # 1 KiB each: referenced by digest
N = 2  # two envs: each insert writes two entries, usually in the same millisecond
frame = st.integers(0, 5)

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.tuples(frame, frame, frame, frame), min_size=1, max_size=6)),
    st.tuples(st.just("read"), st.integers(1, 4)),
    st.tuples(st.just("trim"), st.integers(0, 6)),
    st.tuples(st.just("gc"), st.none()),
), min_size=1, max_size=12)


def referenced(client) -> set[str]:
    return {d for _, fields in client.xrange(KEYS.exp) for d in fields[b"o"].decode().split(",") if d}


def stored(client) -> set[str]:
    return {KEYS.digest_of(k.decode()) for k in client.keys(KEYS.obs_prefix + "*")}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_no_dangling_reference_and_no_leftover_after_gc(real_redis, program):
    real_redis.flushall()
    real_redis.config_set("stream-node-max-entries", 2)  # so approximate trims remove something
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, dedup_min_bytes=512), RUN, 0, 1)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    zeros = np.zeros(N, bool)
    for op, arg in program:
        if op == "add":
            for a, b, c, d in arg:  # a 2-frame stack per env
                stack = (np.stack([FRAMES[a], FRAMES[c]]), np.stack([FRAMES[b], FRAMES[d]]))
                sender.add({"stack": stack}, np.zeros(N), np.ones(N), zeros, zeros)
        elif op == "read":
            got = receiver.receive(arg, block_ms=0)
            assert receiver.stats().dead == 0
            receiver.ack(got)
        else:
            retention = RetentionConfig(max_entries=arg if op == "trim" else None, trim_limit=2, gc_batch=2)
            HubJanitor(real_redis, retention, RUN, 1).run_once()
            # no obs key outlives its last reference beyond one gc pass
            assert stored(real_redis) == referenced(real_redis)
        # no retained entry references a missing observation; obsref tracks exactly the stored ones
        assert referenced(real_redis) <= stored(real_redis)
        assert {m.decode() for m in real_redis.zrange(KEYS.obsref, 0, -1)} == stored(real_redis)
    receiver.receive(1000, block_ms=0)
    assert receiver.stats().dead == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12)), min_size=1, max_size=40))
def test_insert_dedup_window_matches_its_model(real_redis, program):
    """insert.lua against a model of the window: a seq is stored once, whatever order the sender's
    (re)sends come in, unless it is below a floor a stored insert has raised."""
    real_redis.flushall()
    scripts = Scripts(real_redis)
    head = [KEYS.exp, KEYS.obsref, KEYS.seen("prop")]
    floor, known_floor, stored, oks = 1, 0, set(), 0
    for raise_floor, offset in program:
        floor += raise_floor  # the sender's floor never goes down
        seq = floor + offset
        reply = scripts.call("insert", head, [seq, floor, 60, 1, 0, b"0", b"0", b"", b"payload"])
        if seq < known_floor or seq in stored:
            assert reply == [b"DUP", str(seq).encode()]
            continue
        assert reply[0] == b"OK"
        oks += 1
        known_floor = max(known_floor, floor)
        stored = {s for s in stored if s >= known_floor} | {seq}
        state = real_redis.get(KEYS.seen("prop")).decode().split(",")
        assert int(state[0]) == known_floor and {int(s) for s in state[1:-1]} == stored
    assert real_redis.xlen(KEYS.exp) == oks
