"""Lockstep production quota (``lua/claim.lua``) on a real redis-server."""

import threading

import pytest

from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.keys import ParamKeys
from surreal_redis.scripts import ScriptError

pytestmark = pytest.mark.integration


def live(client, run: str, version: int) -> None:
    client.hset(ParamKeys(run).meta, "version", version)


def test_claims_follow_the_live_version_and_stop_at_the_grant(real_redis):
    quota = ProductionQuota(real_redis, "q")
    live(real_redis, "q", 3)
    assert quota.claim(3, 64).status == "WAIT"  # nothing granted for v3 yet
    quota.grant(3, 100)
    assert quota.claim(2, 64) == ("STALE", 0, 3)  # acting with an old version: load v3 first
    assert quota.claim(3, 64) == ("OK", 64, 3)
    assert quota.claim(3, 64) == ("OK", 64, 3)  # 36 were left: a whole claim, overshoot 28
    assert quota.claim(3, 64) == ("WAIT", 0, 3)
    assert quota.left() == (3, -28)
    live(real_redis, "q", 4)  # published v4, not granted yet: the old grant does not carry over
    assert quota.claim(4, 64).status == "WAIT"
    quota.grant(4, 10)
    assert quota.claim(4, 64) == ("OK", 64, 4)


def test_concurrent_claims_overshoot_the_grant_by_less_than_one_claim(redis_server):
    from surreal_redis.connection import connect

    run, claim_size, agents, grant = "qc", 48, 6, 1000
    setup = connect(redis_server.url)
    live(setup, run, 1)
    ProductionQuota(setup, run).grant(1, grant)
    granted = [0] * agents

    def agent(i: int) -> None:
        quota = ProductionQuota(connect(redis_server.url), run)
        while quota.claim(1, claim_size).status == "OK":
            granted[i] += claim_size

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert grant <= sum(granted) < grant + claim_size  # claims are serialized by the script


def test_bad_claims_are_refused(real_redis):
    quota = ProductionQuota(real_redis, "qb")
    with pytest.raises(ScriptError, match="ARGS"):
        quota.claim(1, 0)
    with pytest.raises(ValueError, match="steps=-1"):
        quota.grant(1, -1)


def test_load_script_restores_claim_lua_after_a_script_flush(redis_server, real_redis):
    """Agents may not SCRIPT LOAD under their ACL user: the learner loads claim.lua for them."""
    quota = ProductionQuota(real_redis, "ql")
    real_redis.script_flush()
    quota.load_script()
    live(real_redis, "ql", 1)
    quota.grant(1, 5)
    sha = quota._scripts.get("claim").sha
    assert real_redis.script_exists(sha) == [True]
