"""Byte bounds of the experience path on fakeredis: the receiver reads blob sizes first and
fetches only blobs within their limit and its read's budget, a dead-letter record is bounded whatever the entry holds, and the
receiver's byte settings are validated."""

import pytest

from surreal_redis.hub.experience.dead_letters import RECORD_BYTES, dead_record
from surreal_redis.hub.experience.decoding import DEFERRED, EntryDecoder
from surreal_redis.hub.experience.receiver import ReceiverConfig
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

KEYS = RunKeys("limits").shard(0)


def test_sizes_come_before_bytes_and_a_read_takes_only_blobs_within_limit_and_budget(fake_redis):
    ids = [f"{i:032x}" for i in range(5)]
    fake_redis.set(KEYS.obs(ids[0]), b"a" * 100)
    fake_redis.set(KEYS.obs(ids[1]), b"b" * 5000)  # over its limit: only its size is read
    fake_redis.rpush(KEYS.obs(ids[2]), b"x")  # not a string
    fake_redis.set(KEYS.obs(ids[4]), b"c" * 100)  # ids[3] does not exist
    assert Scripts(fake_redis).call("sizes", KEYS.obs_keys(ids), []) == [100, 5000, -1, None, 100]
    decoder = EntryDecoder(fake_redis, {0: KEYS}, ReceiverConfig())
    got = decoder._fetch_blobs({0: dict.fromkeys(ids, 1000)}, budget=10_000)
    assert list(got[0].values()) == [b"a" * 100, 5000, -1, None, b"c" * 100]
    got = decoder._fetch_blobs({0: dict.fromkeys([ids[0], ids[4]], 1000)}, budget=150)
    assert got[0] == {ids[0]: b"a" * 100, ids[4]: DEFERRED}  # past the budget: the next read's
    assert decoder._fetch_blobs({0: {ids[4]: 1000}}, budget=1)[0] == {ids[4]: b"c" * 100}  # the first always goes


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
