"""Property test on a real redis-server: random inserts, reads (which move the queued batches),
trims and gc passes keep every retained or queued entry resolvable, and leave no observation (nor
payload stored apart) behind its last reference after a gc pass."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys, is_digest
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
    """Digests the retained entries reference: observations, and payloads stored apart (field p)."""
    digests = set()
    for _, fields in client.xrange(KEYS.exp):
        digests |= {d for d in fields[b"o"].decode().split(",") if d}
        if b"p" in fields:
            digests.add(fields[b"p"].decode())
    return digests


def netstrings(item: bytes) -> list[bytes]:
    fields = []
    while item:
        size, _, rest = item.partition(b":")
        fields.append(rest[:int(size)])
        item = rest[int(size):]
    return fields


def queued(client) -> set[str]:
    """Digests the batches still in the inbox reference (uuid, seq, floor, m, then a, e, o, d per chunk;
    a d that is a digest names a payload stored apart)."""
    digests = set()
    for item in client.lrange(KEYS.inbox, 0, -1):
        fields = netstrings(item)
        for o in fields[6::4]:
            digests |= {d for d in o.decode().split(",") if d}
        digests |= {d.decode() for d in fields[7::4] if is_digest(d.decode("latin-1"))}
    return digests


def stored(client) -> set[str]:
    return {KEYS.digest_of(k.decode()) for k in client.keys(KEYS.obs_prefix + "*")}


@pytest.mark.parametrize("apart", [None, 1], ids=["payloads-inline", "payloads-apart"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=ops)
def test_no_dangling_reference_and_no_leftover_after_gc(real_redis, apart, program):
    real_redis.flushall()
    real_redis.config_set("stream-node-max-entries", 2)  # so approximate trims remove something
    config = SenderConfig(flush_steps=2, dedup_min_bytes=512, payload_ref_min_bytes=apart)
    sender = ExperienceSender(real_redis, config, RUN, 0, 1)
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
            # no obs key outlives its last reference, retained or queued, beyond one gc pass
            assert stored(real_redis) == referenced(real_redis) | queued(real_redis)
        # no retained or queued entry references a missing observation; each stored one is in
        # obsref or pinned by a queued batch, and obsref holds stored ones only
        assert referenced(real_redis) | queued(real_redis) <= stored(real_redis)
        pinned = {m.decode() for m in real_redis.smembers(KEYS.pinned)}
        obsref = {m.decode() for m in real_redis.zrange(KEYS.obsref, 0, -1)}
        assert obsref <= stored(real_redis) <= obsref | pinned and queued(real_redis) <= pinned
    receiver.receive(1000, block_ms=0)
    assert receiver.stats().dead == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12)), min_size=1, max_size=40))
def test_insert_dedup_window_matches_its_model(real_redis, program):
    """insert.lua queues and move.lua stores, against a model of the window: a seq is stored
    once, whatever order the sender's (re)sends come in, unless it is below a floor a stored
    batch has raised; insert.lua answers DUP for the others (the door) and queues nothing."""
    real_redis.flushall()
    scripts = Scripts(real_redis)
    floor, known_floor, stored, oks = 1, 0, set(), 0
    for raise_floor, offset in program:
        floor += raise_floor  # the sender's floor never goes down
        seq = floor + offset
        reply = scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen], ["ab", seq, floor, 1, 0, b"0", b"0", b"", b"p"])
        dup = seq < known_floor or seq in stored
        assert reply == ([b"DUP"] if dup else [b"OK"])
        moved = move_inbox(scripts, KEYS)
        if dup:
            assert (moved.taken, moved.added, moved.duplicates) == (0, 0, 0)
            continue
        assert (moved.taken, moved.added, moved.duplicates) == (1, 1, 0)
        oks += 1
        known_floor = max(known_floor, floor)
        stored = {s for s in stored if s >= known_floor} | {seq}
        state = real_redis.hget(KEYS.seen, "ab").decode().split(":")[1].split(",")
        assert int(state[0]) == known_floor and {int(s) for s in state[1:-1]} == stored
    assert real_redis.xlen(KEYS.exp) == oks
