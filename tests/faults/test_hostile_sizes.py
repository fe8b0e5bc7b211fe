"""One agent's sizes must not end the run: a payload over ``receiver.max_payload_bytes`` is refused
before its bytes are fetched or moved, set aside by reference (key and size, not a copy), and the
honest chunks of the same read arrive; the dead-letter stream stays bounded in bytes and is the
first thing memory pressure trims. Every test plays a hostile agent, within its ACL user's rights,
against a real redis-server, with sizes of a few MiB and a small configured limit."""

import os

import numpy as np
import pytest

from surreal_redis.hub.experience import decoding
from surreal_redis.hub.experience import payload as pl
from surreal_redis.hub.experience.dead_letters import RECORD_BYTES
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import DEAD_KEEP, HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.experience.wire import payload_id
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import ScriptError, Scripts

from .conftest import add_steps, assert_exactly_once, drain
from .test_hostile_agents import netstrings
from .test_hostile_entries import referencing_payload

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "sizes"
KEYS = RunKeys(RUN).shard(0)
LIMIT = 256 << 10  # receiver.max_payload_bytes of these tests
BIG = 4 << 20  # a hostile payload: well over it


def honest(client, agent: int, seed: int) -> set:
    """One honest agent's two chunks (2 envs x 2 steps, frames by digest) queued; their identities."""
    sender = ExperienceSender(client, SenderConfig(flush_steps=2), RUN, agent, 1)
    add_steps(sender, 0, 3, np.random.default_rng(seed))
    return {(agent, env, float(env)) for env in (0, 1)}


def sent_bytes(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def insert_naming_blob(client, seq: int, blob_id: str, size: int) -> None:
    """What a hostile agent may do: SETNX a blob of ``size`` bytes under an id of its choice, pin
    it, and insert (its own insert.lua call) a chunk whose payload is that id."""
    assert client.setnx(KEYS.obs(blob_id), os.urandom(size))
    client.sadd(KEYS.pinned, blob_id)
    reply = Scripts(client).call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(blob_id)],
                                 ["e71", seq, seq, 1, 0, b"7", b"0", b"", blob_id.encode()])
    assert reply == [b"OK"]


def test_insert_refuses_an_inline_payload_over_its_bound_and_writes_nothing(real_redis):
    payload = referencing_payload() + b"\0" * (2 << 20)
    with pytest.raises(ScriptError, match="chunk 1 holds .* bytes, over 1048576"):
        Scripts(real_redis).call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen], ["e71", 1, 1, 1, 0, b"7", b"0", b"", payload])
    assert not real_redis.exists(KEYS.inbox, KEYS.pinned)


def test_an_honest_sender_stores_a_payload_over_the_inline_bound_apart_even_when_told_inline(real_redis):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, payload_ref_min_bytes=None,
                                                       dedup_min_bytes=1 << 30), RUN, 0, 1)
    rng = np.random.default_rng(0)
    add_steps(sender, 0, 3, rng, n=1, frames=lambda k: rng.integers(0, 256, (1, 512, 1024), np.uint8))
    assert sender.stats().payloads_stored == 1  # 3 frames of 512 KiB inline: a 1.5 MiB payload
    got = drain(ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1))
    assert len(got) == 1 and got[0].chunk.obs["f"].shape == (3, 512, 1024)


def test_an_inline_payload_pushed_around_insert_is_set_aside_by_move_unread(real_redis):
    """An agent may RPUSH any item to the inbox: move.lua, run by the learner with its limit,
    sets a batch with a chunk over the limit aside (a preview of it, not a copy) and no stream
    entry ever holds it."""
    expected = honest(real_redis, 0, 1)
    hostile = netstrings(b"e71", b"1", b"1", b"1", b"7", b"0", b"", referencing_payload() + b"\0" * (LIMIT + 1))
    real_redis.rpush(KEYS.inbox, hostile)
    huge = netstrings(b"e72", b"1", b"1", b"1", b"7", b"0", b"", b"\0" * (64 * LIMIT + (1 << 20)))  # never split
    real_redis.rpush(KEYS.inbox, huge)
    expected |= honest(real_redis, 1, 2)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(max_payload_bytes=LIMIT), RUN, 1)
    before = sent_bytes(real_redis)
    got = drain(receiver)
    assert assert_exactly_once(got) == expected
    assert sent_bytes(real_redis) - before < 1 << 20  # the learner read neither hostile payload
    records = [f for _, f in real_redis.xrange(KEYS.dead)]
    assert [f[b"reason"] for f in records] == [b"malformed_batch"] * 2
    assert b"over the limit of 262144" in records[0][b"detail"] and b"exceeds 64 chunks" in records[1][b"detail"]
    assert all(sum(len(k) + len(v) for k, v in f.items()) < RECORD_BYTES for f in records)


def test_a_huge_payload_blob_is_set_aside_by_reference_without_being_fetched(real_redis):
    """The learner used to MGET every payload blob a read named before checking anything: one
    agent's blobs raised its memory by hundreds of MiB, and a learner without that memory died on
    the read, at every restart. Now the blob's size is checked in the same round trip as the read,
    and the honest chunks of the same read arrive."""
    expected = honest(real_redis, 0, 3)
    blob_id = payload_id("e71", 1, 1)  # the id move.lua accepts for chunk 1 of batch 1
    insert_naming_blob(real_redis, 1, blob_id, BIG)
    expected |= honest(real_redis, 1, 4)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(max_payload_bytes=LIMIT), RUN, 1)
    before = sent_bytes(real_redis)
    got = drain(receiver)
    assert assert_exactly_once(got) == expected
    assert sent_bytes(real_redis) - before < 1 << 20
    assert receiver.dead_by_reason == {"too_large": 1}
    (_, record), = real_redis.xrange(KEYS.dead)
    assert record[b"reason"] == b"too_large" and record[b"f.p"] == blob_id.encode()
    assert f"blob {KEYS.obs(blob_id)} holds {BIG} bytes".encode() in record[b"detail"]
    assert sum(len(k) + len(v) for k, v in record.items()) < RECORD_BYTES
    assert not real_redis.xpending(KEYS.exp, "learner")["pending"]  # acked: a restart never reads it again


def inflating_payload(side: int) -> bytes:
    """A well-formed one-step payload whose inline observation (zeros, side x side bytes a row)
    lz4 shrinks about 250 times: small on the wire, big once decoded."""
    shape = (side, side)
    layout = pl.Layout.create(np.zeros(1), [pl.Leaf(np.dtype(np.uint8), shape, False)], (np.dtype("<f8"), ()), [],
                              None)
    arrays = {pl.OBS: np.zeros((2, *shape), np.uint8), pl.FINAL: np.zeros((0, *shape), np.uint8),
              pl.ACTIONS: np.zeros(1), pl.REWARDS: np.zeros(1, "<f4"), pl.TERMINATED: np.zeros(1, bool),
              pl.TRUNCATED: np.zeros(1, bool), pl.VERSION: np.zeros(1, "<i8")}
    return pl.encode(layout, 1, 0, lambda slot: arrays[slot.group], True, 1)


def test_a_payload_that_inflates_past_the_limit_is_set_aside_before_it_is_decoded(real_redis, monkeypatch):
    """A few KiB of lz4 may declare 255 times as much: the decoded size, read from the payload's
    header, is bounded by the same limit, so the learner never allocates it."""
    expected = honest(real_redis, 0, 10)
    bomb = inflating_payload(1024)  # 2 MiB decoded
    assert len(bomb) < 16 << 10
    reply = Scripts(real_redis).call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen], ["e71", 1, 1, 1, 0, b"7", b"0", b"", bomb])
    assert reply == [b"OK"]
    expected |= honest(real_redis, 1, 11)
    decoded = []
    real = pl.decode
    monkeypatch.setattr(pl, "decode", lambda data, *args: decoded.append(len(data)) or real(data, *args))
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(max_payload_bytes=LIMIT), RUN, 1)
    got = drain(receiver)
    assert assert_exactly_once(got) == expected
    assert receiver.dead_by_reason == {"too_large": 1} and len(bomb) not in decoded
    (_, record), = real_redis.xrange(KEYS.dead)
    assert b"declares 2097174 decoded bytes" in record[b"detail"]


def test_a_read_stays_within_its_byte_budget_and_defers_the_rest(real_redis):
    """Payload blobs within the limit but more than ``max_read_bytes`` together are fetched over
    several reads, each under the budget plus one blob; none is lost or set aside."""
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, payload_ref_min_bytes=1), RUN, 0, 1)
    add_steps(sender, 0, 7, np.random.default_rng(5), n=4)  # 12 chunks, each payload stored apart
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(max_read_bytes=1), RUN, 1)
    sizes = []
    while batch := receiver.receive(64, block_ms=0):
        sizes.append(len(batch))
        receiver.ack(batch)
    assert sum(sizes) == 12 and max(sizes) == 1 and receiver.stats().dead == 0


def test_the_dead_letter_stream_stays_bounded_in_bytes_after_many_big_hostile_entries(real_redis):
    """It used to copy every entry whole (and stay under a count only): 128 KiB entries filled
    88% of maxmemory. Records now hold previews and references, at most RECORD_BYTES each."""
    scripts = Scripts(real_redis)
    junk = b"SRC1" + os.urandom(200 << 10)  # under the limit, moved, and then unusable
    for seq in range(1, 121):
        reply = scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen], ["e71", seq, seq, 1, 0, b"7", b"0", b"", junk])
        assert reply == [b"OK"]
    maxlen = 20
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(max_payload_bytes=LIMIT, dead_maxlen=maxlen), RUN, 1)
    assert drain(receiver) == [] and receiver.stats().dead == 120
    records = real_redis.xlen(KEYS.dead)
    assert maxlen <= records <= maxlen + 100  # approximate MAXLEN: whole stream nodes of 100
    usage = real_redis.memory_usage(KEYS.dead, samples=0)
    assert usage < (maxlen + 100) * RECORD_BYTES, usage


def test_memory_pressure_trims_the_dead_letters_first(real_redis):
    for i in range(DEAD_KEEP + 400):
        real_redis.xadd(KEYS.dead, {"id": str(i), "reason": "format", "detail": "x" * 1000})
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 0, 3, np.random.default_rng(6))
    janitor = HubJanitor(real_redis, RetentionConfig(), RUN, 1)
    janitor.note_oom()  # a write was refused for OOM
    stats = janitor.run_once()
    assert stats.dead_trimmed == 400 and real_redis.xlen(KEYS.dead) == DEAD_KEEP
    newest = real_redis.xrevrange(KEYS.dead, count=1)[0][1][b"id"]
    assert newest == str(DEAD_KEEP + 399).encode()


def test_an_entry_that_fails_the_whole_read_is_set_aside_alone_and_a_restart_never_meets_it(real_redis, monkeypatch):
    """A MemoryError (or anything no Redis error) one entry provokes while the read's blobs are
    resolved used to fail the read as a whole: the learner exited, and the restarted one died
    on the same pending entries. Now each entry is decoded alone and only that one is set aside."""
    expected = honest(real_redis, 0, 7)
    honest(real_redis, 7, 8)  # agent 7's two chunks provoke it
    expected |= honest(real_redis, 1, 9)
    move_inbox(Scripts(real_redis), KEYS)
    provoking = {d for _, f in real_redis.xrange(KEYS.exp) if f[b"a"] == b"7" for d in f[b"o"].decode().split(",")}
    real = decoding.EntryDecoder._resolve

    def resolve(self, d, *args):
        if d in provoking:
            raise MemoryError(f"no memory left for observation {d}")
        return real(self, d, *args)

    monkeypatch.setattr(decoding.EntryDecoder, "_resolve", resolve)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = drain(receiver)
    assert assert_exactly_once(got) == expected
    assert receiver.dead_by_reason == {"error": 2}
    assert all(b"MemoryError" in f[b"detail"] for _, f in real_redis.xrange(KEYS.dead))
    restarted = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    assert restarted.start() == 0 and drain(restarted) == []
