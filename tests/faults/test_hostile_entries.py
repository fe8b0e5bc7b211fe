"""Hostile stream entries and observation blobs, written the way an agent can write them (insert.lua
or XADD): none may stop the reader, grow its memory, or live forever in Redis."""

import struct

import numpy as np
import pytest

from surreal_redis.codec import digest, encode_array
from surreal_redis.hub.experience import payload as pl
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import ScriptError, Scripts

from .conftest import add_steps, assert_exactly_once, drain

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "hostile"
KEYS = RunKeys(RUN).shard(0)


def referencing_payload(shape: tuple[int, ...] = (84, 84)) -> bytes:
    """A well-formed one-step payload whose only observation leaf is referenced by digest."""
    layout = pl.Layout.create(np.zeros(1), [pl.Leaf(np.dtype(np.uint8), shape, True)], (np.dtype("<f8"), ()), [], None)
    arrays = {pl.OBS: np.zeros(2, np.uint8), pl.FINAL: np.zeros(0, np.uint8), pl.ACTIONS: np.zeros(1),
              pl.REWARDS: np.zeros(1, "<f4"), pl.TERMINATED: np.zeros(1, bool),
              pl.TRUNCATED: np.zeros(1, bool), pl.VERSION: np.zeros(1, "<i8")}
    return pl.encode(layout, 1, 0, lambda slot: arrays[slot.group], True, None)


def insert_with_blob(scripts: Scripts, seq: int, blob: bytes, payload: bytes, agent: bytes = b"7") -> None:
    """What an agent may do with its own EVALSHA: one chunk referencing one uploaded blob."""
    d = digest(blob)
    reply = scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(d)],
                         ["e71", seq, seq, 1, 1, blob, agent, b"0", d.encode(), payload])
    assert reply[0] == b"OK"


def test_no_entry_stops_the_reader_and_each_is_set_aside_with_its_reason(real_redis):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    rng = np.random.default_rng(0)
    add_steps(sender, 0, 3, rng)
    good = referencing_payload()
    nested = b"[" * 60_000  # json.loads recursed until RecursionError, on every restart
    hostile = [
        {"a": "0", "e": "0", "o": "", "d": struct.pack("<4sHIIB", b"SRC1", len(nested), 1, 0, 0) + nested},
        {"a": "-1", "e": "0", "o": "", "d": good},
        {"a": "1_000", "e": "0", "o": "", "d": good},
        {"a": "0", "e": " 1", "o": "", "d": good},
        {"a": "0", "e": "0", "o": "", "d": good[:40]},
        {"a": "0", "e": "0", "o": "x" * 32, "d": good},
        {"a": "0"},
    ]
    for fields in hostile:
        real_redis.xadd(KEYS.exp, fields)
    add_steps(sender, 3, 2, rng)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = drain(receiver)
    assert assert_exactly_once(got) == {(0, e, 1000.0 * k + e) for e in (0, 1) for k in (0, 2)}
    assert receiver.stats().dead == len(hostile)
    assert receiver.dead_by_reason == {"codec": 2, "format": 5}
    dead = real_redis.xrange(KEYS.dead)
    assert [f[b"f.a"] for _, f in dead if b"f.a" in f][1:3] == [b"-1", b"1_000"]
    assert all(f[b"detail"] for _, f in dead) and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0


def test_mutated_payloads_never_stop_the_reader(real_redis):
    rng = np.random.default_rng(1)
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 0, 3, rng, n=1)
    move_inbox(Scripts(real_redis), KEYS)
    (_, fields), = real_redis.xrange(KEYS.exp)
    body = bytearray(fields[b"d"])
    for _ in range(300):
        mutated = bytearray(body)
        for position in rng.integers(0, len(body), rng.integers(1, 4)):
            mutated[position] = rng.integers(0, 256)
        real_redis.xadd(KEYS.exp, {**fields, b"d": bytes(mutated)})
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = drain(receiver)  # never raises
    stats = receiver.stats()  # copies that still decode name the original's origin: dropped as consumed
    assert len(got) + stats.dead + stats.duplicates_consumed == 301 and stats.dead > 0 and len(got) == 1
    assert set(receiver.dead_by_reason) <= {"format", "codec", "error", "too_large"}  # a size byte hit: declares more
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 0


def test_hostile_blobs_are_refused_before_they_are_decompressed_and_never_cached(real_redis):
    """Blobs a few hundred bytes long that declare arrays of 32 KiB: the template says 84x84, so
    they are refused unread; nothing of them reaches the cache (there used to be 256 MiB of
    them after 1.1 MB of uploads)."""
    scripts = Scripts(real_redis)
    payload = referencing_payload()
    for seq in range(1, 201):
        blob = encode_array(np.full((256, 128), seq % 256, np.uint8), compress_min_bytes=1)
        assert len(blob) < 300
        insert_with_blob(scripts, seq, blob, payload)
    # an honest 84x84 frame, and a blob that declares 84x84 but cannot inflate to it
    insert_with_blob(scripts, 201, encode_array(np.ones((84, 84), np.uint8), compress_min_bytes=1), payload)
    bomb = encode_array(np.zeros((84, 84), np.uint8), compress_min_bytes=1)
    insert_with_blob(scripts, 202, bomb[:20] + bomb[-4:], payload)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = drain(receiver)
    assert len(got) == 1 and got[0].chunk.obs.shape == (2, 84, 84)
    assert receiver.dead_by_reason == {"format": 200, "codec": 1}
    assert receiver.stats().cached_bytes == 84 * 84  # the honest frame only
    too_large = ExperienceReceiver(real_redis, ReceiverConfig(consumer="small", max_obs_bytes=1000), RUN, 1)
    fetched = too_large.stats().cache_misses
    # the template's 84x84 is over the limit: every entry refused before its blob is fetched
    assert list(too_large.read_retained()) == [] and too_large.skipped_by_reason == {"too_large": 202}
    assert too_large.stats().cache_misses == fetched


def test_observations_no_entry_references_do_not_live_forever(real_redis):
    scripts = Scripts(real_redis)
    unreferenced = encode_array(np.ones((84, 84), np.uint8))
    d = digest(unreferenced)
    with pytest.raises(ScriptError, match="referenced by no chunk"):  # an upload riding along
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(d)],
                     ["e71", 1, 1, 1, 1, unreferenced, b"7", b"0", b"", referencing_payload()])
    assert not real_redis.exists(KEYS.obs(d))
    real_redis.set(KEYS.obs(d), unreferenced)  # written around insert.lua, as an agent's ACL allows
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 0, 3, np.random.default_rng(2))
    stats = HubJanitor(real_redis, RetentionConfig(), RUN, 1).run_once()
    assert stats.orphans_deleted == 1 and not real_redis.exists(KEYS.obs(d))
    move_inbox(scripts, KEYS)  # the honest batches were queued: pinned, spared by the sweep
    referenced = {x for _, f in real_redis.xrange(KEYS.exp) for x in f[b"o"].decode().split(",")}
    assert all(real_redis.exists(KEYS.obs(x)) for x in referenced)  # what entries use stays
