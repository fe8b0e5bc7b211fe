import pytest

from surreal_redis.keys import RunKeys, validate_run_name


def test_shard_keys_share_one_hash_tag():
    shard = RunKeys("exp1").shard(3)
    names = [shard.exp, shard.obsref, shard.dead, shard.obs("ab" * 16), shard.seen("uuid-1")]
    assert all(name.startswith("sr:{exp1.s3}:") for name in names)
    assert shard.digest_of(shard.obs("ab" * 16)) == "ab" * 16


def test_param_and_run_keys():
    keys = RunKeys("exp1")
    assert keys.params.meta == "sr:{exp1.p}:meta"
    assert keys.params.blob(7) == "sr:{exp1.p}:blob:7"
    assert keys.agents == "sr:{exp1}:agents"
    assert [s.shard for s in keys.shards(3)] == [0, 1, 2]


@pytest.mark.parametrize("bad", ["", "a b", "x{y}", "a:b", "x" * 101])
def test_bad_run_names_are_rejected_by_name(bad):
    with pytest.raises(ValueError, match="invalid run name"):
        validate_run_name(bad)


def test_bad_digest_and_foreign_key_rejected():
    shard = RunKeys("r").shard(0)
    with pytest.raises(ValueError, match="digest"):
        shard.obs("../../etc")
    with pytest.raises(ValueError, match="not an observation key"):
        shard.digest_of("sr:{r.s1}:obs:abcdabcd")
