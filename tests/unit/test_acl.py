"""ACL rules of a run (the real-server tests are in tests/integration/test_acl.py)."""

import pytest

from surreal_redis.acl import ROLES, acl_rules, create_users, script_sha, username
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

RUN = "aclrun"


def test_rules_name_the_run_keys_only():
    agent = acl_rules(RUN, "agent", num_shards=2)
    assert f"+evalsha|{script_sha('insert')}" in agent
    assert not any(r in agent for r in ("+evalsha", "+eval", "+script|load", "+@all", "+set", "+xtrim", "+del"))
    s0, s1 = RunKeys(RUN).shard(0).tag, RunKeys(RUN).shard(1).tag
    assert f"~{s1}:obs:*" in agent and "&sr:{aclrun.p}:notify" in agent
    assert f"(~{s0}:obs:* ~{s1}:obs:* +setnx +exists)" in agent
    assert all("aclrun" in rule for rule in agent if "~" in rule)
    assert not any(":evals" in rule for rule in agent)
    evaluator = acl_rules(RUN, "eval")
    assert "(~sr:{aclrun}:evals +xadd)" in evaluator and not any("episodes" in r or "evalsha" in r for r in evaluator)
    learner = acl_rules(RUN, "learner")
    assert "~sr:{aclrun.s[0-9]*}:*" in learner and "-@dangerous" in learner
    assert learner[-1] == "+info" and {"-scan", "-randomkey", "-pubsub"} <= set(learner)
    with pytest.raises(ValueError, match="unknown ACL role"):
        acl_rules(RUN, "admin")
    with pytest.raises(ValueError, match="invalid run name"):
        acl_rules("bad name", "agent")
    with pytest.raises(ValueError, match="num_shards"):
        acl_rules(RUN, "agent", num_shards=0)
    assert [username(RUN, role) for role in ROLES] == ["sr-aclrun-agent", "sr-aclrun-eval", "sr-aclrun-learner"]


def test_agent_script_sha_is_what_redis_py_calls(fake_redis):
    assert script_sha("insert") == Scripts(fake_redis).get("insert").sha


def test_every_role_needs_its_own_password(fake_redis):
    with pytest.raises(ValueError, match="the eval password must not be empty"):
        create_users(fake_redis, RUN, {"agent": "a", "learner": "l"})
    with pytest.raises(ValueError, match="unknown ACL roles \\['admin'\\]"):
        create_users(fake_redis, RUN, {"agent": "a", "eval": "e", "learner": "l", "admin": "x"})


def test_acl_patterns_cover_every_key_of_the_run():
    keys = RunKeys(RUN)
    patterns = keys.acl_patterns(num_shards=2)
    assert patterns["obs"] == [keys.shard(0).obs_prefix + "*", keys.shard(1).obs_prefix + "*"]
    assert patterns["meta"] == [keys.params.meta] and patterns["notify"] == [keys.params.notify]
    assert patterns["evals"] == [keys.evals]
    assert keys.acl_patterns()["exp"] == ["sr:{aclrun.s[0-9]*}:exp"]
