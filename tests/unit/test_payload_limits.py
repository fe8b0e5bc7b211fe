"""Byte bounds of the experience path on fakeredis: fetch.lua returns only blobs within their
limit and the call's budget, a dead-letter record is bounded whatever the entry holds, and the
receiver's byte settings are validated."""

import pytest

from surreal_redis.hub.experience.dead_letters import RECORD_BYTES, dead_record
from surreal_redis.hub.experience.receiver import ReceiverConfig
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import ScriptError, Scripts

KEYS = RunKeys("limits").shard(0)


def test_fetch_returns_blobs_within_their_limit_and_the_budget_only(fake_redis):
    ids = [f"{i:032x}" for i in range(5)]
    fake_redis.set(KEYS.obs(ids[0]), b"a" * 100)
    fake_redis.set(KEYS.obs(ids[1]), b"b" * 5000)  # over its limit: only its size comes back
    fake_redis.rpush(KEYS.obs(ids[2]), b"x")  # not a string
    fake_redis.set(KEYS.obs(ids[4]), b"c" * 100)  # ids[3] does not exist
    keys = KEYS.obs_keys(ids)
    reply = Scripts(fake_redis).call("fetch", keys, [10_000, 1000, 1000, 1000, 1000, 1000])
    assert reply == [b"a" * 100, 5000, -1, None, b"c" * 100]
    first, second = Scripts(fake_redis).call("fetch", [keys[0], keys[4]], [150, 1000, 1000])
    assert (first, second) == (b"a" * 100, -2)  # past the budget: ask again
    assert Scripts(fake_redis).call("fetch", [keys[4]], [1, 1000]) == [b"c" * 100]  # the first always fits
    with pytest.raises(ScriptError, match="bad budget"):
        Scripts(fake_redis).call("fetch", keys[:2], [10, 1000])


def test_a_dead_letter_record_names_the_entry_and_never_copies_it():
    fields = {b"a": b"7" * (1 << 20), b"e": b"0", b"o": b"f" * 8000, b"d": b"SRC1" + b"\0" * (4 << 20), b"s": b"x"}
    record = dead_record("codec", "detail " * 1000, b"1-0", fields)
    stored = {k: v if isinstance(v, bytes) else str(v).encode() for k, v in record.items()}  # as XADD sends it
    assert sum(len(k) + len(v) for k, v in stored.items()) <= RECORD_BYTES
    assert record[b"size"] == sum(len(k) + len(v) for k, v in fields.items())
    assert record[b"f.d"] == fields[b"d"][:256] and record[b"id"] == b"1-0"


@pytest.mark.parametrize("field", ["max_payload_bytes", "max_read_bytes"])
def test_byte_limits_must_be_positive(field):
    with pytest.raises(ValueError, match=f"receiver.{field} must be >= 1, got 0"):
        ReceiverConfig(**{field: 0})
