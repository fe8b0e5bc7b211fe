"""ACL rules of a run (the real-server test is tests/integration/test_acl.py)."""

import pytest

from surreal_redis.acl import acl_rules, username
from surreal_redis.keys import RunKeys

RUN = "aclrun"


def test_rules_name_the_run_keys_only():
    agent = acl_rules(RUN, "agent", num_shards=2)
    assert "+evalsha" in agent and not any(r in agent for r in ("+eval", "+script|load", "+@all"))
    assert "~sr:{aclrun.s1}:obs:*" in agent and "&sr:{aclrun.p}:notify" in agent
    assert all("aclrun" in rule for rule in agent if "~" in rule)
    learner = acl_rules(RUN, "learner")
    assert "~sr:{aclrun.s[0-9]*}:*" in learner and "-@dangerous" in learner
    with pytest.raises(ValueError, match="unknown ACL role"):
        acl_rules(RUN, "admin")
    with pytest.raises(ValueError, match="invalid run name"):
        acl_rules("bad name", "agent")
    with pytest.raises(ValueError, match="num_shards"):
        acl_rules(RUN, "agent", num_shards=0)
    assert username(RUN, "agent") == "sr-aclrun-agent"


def test_acl_patterns_cover_every_key_of_the_run():
    keys = RunKeys(RUN)
    patterns = keys.acl_patterns(num_shards=2)
    assert patterns["obs"] == [keys.shard(0).obs_prefix + "*", keys.shard(1).obs_prefix + "*"]
    assert patterns["meta"] == [keys.params.meta] and patterns["notify"] == [keys.params.notify]
    assert keys.acl_patterns()["exp"] == ["sr:{aclrun.s[0-9]*}:exp"]
