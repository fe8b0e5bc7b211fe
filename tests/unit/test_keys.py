from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from surreal_redis.keys import SHARD_SLOT_WINDOWS, RunKeys, validate_run_name

CLUSTER_SLOTS = 16384


def test_shard_keys_share_one_hash_tag():
    shard = RunKeys("exp1").shard(3)
    names = [shard.exp, shard.obsref, shard.dead, shard.obs("ab" * 16), shard.seen, shard.inbox, shard.pinned]
    assert all(name.startswith(shard.tag + ":") for name in names)
    assert shard.tag.startswith("sr:{exp1.s3") and shard.tag.endswith("}")
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert shard.digest_of(shard.obs("ab" * 16)) == "ab" * 16


def test_shard_slot_windows_are_a_steinhaus_sequence():
    """For every n <= 17 the first n windows lie in n different n-ths of the slot space: n shards
    spread one per primary over n equal slot ranges, and k*P shards k per primary over P."""
    for n in range(1, len(SHARD_SLOT_WINDOWS) + 1):
        parts = [(first * n // CLUSTER_SLOTS, last * n // CLUSTER_SLOTS) for first, last in SHARD_SLOT_WINDOWS[:n]]
        assert all(a == b for a, b in parts), n
        assert len({a for a, _ in parts}) == n, n


@settings(max_examples=50, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9_\-]{1,30}", fullmatch=True), st.sampled_from([1, 2, 3, 4, 5, 6, 12]))
def test_shards_spread_evenly_over_equal_slot_ranges(run, primaries):
    """``redis-cli --cluster create`` with P primaries: P runs of ~16384/P slots. Any multiple of P
    shards (up to 12) spreads exactly evenly, whatever the run name."""
    bounds = [round(i * CLUSTER_SLOTS / primaries) for i in range(primaries + 1)]
    for num_shards in range(primaries, len(SHARD_SLOT_WINDOWS) + 1, primaries):
        owners = [next(i for i in range(primaries) if bounds[i] <= shard.slot < bounds[i + 1])
                  for shard in RunKeys(run).shards(num_shards)]
        assert sorted(owners.count(i) for i in range(primaries)) == [num_shards // primaries] * primaries


def test_shard_tags_beyond_the_table_are_plain():
    assert RunKeys("r").shard(len(SHARD_SLOT_WINDOWS)).tag == f"sr:{{r.s{len(SHARD_SLOT_WINDOWS)}}}"


def test_param_and_run_keys():
    keys = RunKeys("exp1")
    assert keys.params.meta == "sr:{exp1.p}:meta"
    assert keys.params.blob(7) == "sr:{exp1.p}:blob:7"
    assert keys.agents == "sr:{exp1}:agents"
    assert keys.evals == "sr:{exp1}:evals" and keys.episodes == "sr:{exp1}:episodes"
    assert [s.shard for s in keys.shards(3)] == [0, 1, 2]


# dotted names are the examples: their tags would read as another run's shard or parameter tag
@pytest.mark.parametrize("bad", ["", "a b", "x{y}", "a:b", "x" * 101, "ppo.seed1", "ppo.p", "run.s9x", "a*",
                                 "a?", "a[0]", "a\\b", "run\n", "..", "ü"])
def test_bad_run_names_are_rejected_by_name(bad):
    with pytest.raises(ValueError, match="invalid run name"):
        validate_run_name(bad)


def test_bad_digest_and_foreign_key_rejected():
    shard = RunKeys("r").shard(0)
    for bad in ("../../etc", "abcdabcd\n"):
        with pytest.raises(ValueError, match="digest"):
            shard.obs(bad)
    with pytest.raises(ValueError, match="not an observation key"):
        shard.digest_of("sr:{r.s1}:obs:abcdabcd")


def keys_of(run: str) -> list[str]:
    """Every kind of key (and the channel) of ``run``, on shards 0, 1, 10 and 11."""
    keys = RunKeys(run)
    names = [keys.config, keys.agents, keys.episodes, keys.evals, keys.control, keys.learner, keys.params.meta,
             keys.params.notify, keys.params.blob(0), keys.params.blob(123), keys.params.staging("ab" * 8)]
    for shard in (keys.shard(i) for i in (0, 1, 10, 11)):
        names += [shard.exp, shard.obsref, shard.dead, shard.obs("cd" * 16), shard.seen, shard.inbox, shard.pinned]
    names.append(keys.episodes_inbox)
    return names


def patterns_of(run: str) -> list[str]:
    keys = RunKeys(run)
    return [p for num_shards in (None, 1, 12) for ps in keys.acl_patterns(num_shards).values() for p in ps] + \
        keys.all_patterns()


def is_valid(name: str) -> bool:
    try:
        validate_run_name(name)
    except ValueError:
        return False
    return True


# '.' is drawn on purpose: a name with it must be refused, or it could reach another run's keys
raw_names = st.text(alphabet="ab0_-.", min_size=1, max_size=6)
run_names = raw_names.filter(is_valid)
run_pairs = st.one_of(st.tuples(run_names, run_names),
                      st.builds(lambda a, tail: (a, a + tail), run_names, raw_names),
                      st.builds(lambda a, tail: (a + tail, a), run_names, raw_names),
                      st.builds(lambda a, tail: (a, a + "." + tail), run_names, st.sampled_from(["p", "s1", "s9x", "seed1"])),
                      ).filter(lambda pair: pair[0] != pair[1] and is_valid(pair[0]) and is_valid(pair[1]))


@settings(max_examples=50)
@given(run_pairs)
def test_no_pattern_of_one_run_matches_a_key_of_another(pair):
    """Redis globs and fnmatch agree on these patterns (their only special characters are '*' and
    '[0-9]'); tests/integration/test_acl.py checks the same on a real server."""
    a, b = pair
    patterns = patterns_of(a)
    assert not [p for p in patterns if set(p.replace("[0-9]", "")) & set("?[]\\^")]
    for key in keys_of(b):
        assert not [p for p in patterns if fnmatchcase(key, p)], (a, key)
    own = set(keys_of(a))
    assert all(any(fnmatchcase(key, p) for p in RunKeys(a).all_patterns()) for key in own - {RunKeys(a).params.notify})
