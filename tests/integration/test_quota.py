"""Lockstep production quota (``lua/claim.lua``) and the notify channel waiting agents listen on,
on a real redis-server."""

import threading
import time

import pytest
from support.acl_users import acl_clients
from support.lossy import lossy_pipelines

from surreal_redis.hub.quota import ClaimScriptMissing, ProductionQuota, QuotaNews
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


def test_waiting_agents_hear_publishes_and_grants_on_the_notify_channel(real_redis):
    import numpy as np

    from surreal_redis.hub.params import ParameterPublisher, PublisherConfig

    news = QuotaNews(real_redis, "qn")
    assert news.drain() == 0 and news.wait(0.05) is False  # subscribed; nothing said yet
    version = ParameterPublisher(real_redis, "qn", PublisherConfig()).publish({"w": np.zeros(3, np.float32)}, 0)
    assert news.wait(5.0) is True  # publish.lua announces the version
    ProductionQuota(real_redis, "qn").grant(version, 64)
    ProductionQuota(real_redis, "qn").grant(version, 32)
    assert news.drain() == 2 and news.wait(0.05) is False  # drained: only later messages wake it
    news.close()
    news.close()  # twice is harmless


def test_a_wait_for_grants_sleeps_through_publishes_and_empty_grants(real_redis):
    import numpy as np

    from surreal_redis.hub.params import ParameterPublisher, PublisherConfig

    news, quota = QuotaNews(real_redis, "qg"), ProductionQuota(real_redis, "qg")
    news.drain()
    version = ParameterPublisher(real_redis, "qg", PublisherConfig()).publish({"w": np.zeros(3, np.float32)}, 0)
    quota.grant(version, 0)
    assert news.wait(0.3, grants_only=True) is False  # a publish and a grant of nothing
    assert news.granted_version == 0
    quota.grant(version, 64)
    assert news.wait(5.0, grants_only=True) is True
    assert news.granted_version == version
    quota.grant(version + 5, 8)
    quota.grant(version + 1, 8)
    time.sleep(0.2)
    assert news.drain() == 2 and news.granted_version == version + 5  # drained grants count too
    news.close()


def test_an_agent_user_waits_for_the_learner_to_load_claim_lua(redis_server, real_redis):
    """After a SCRIPT FLUSH (or a restart) an agent, which may not load scripts, gets a clear
    ClaimScriptMissing until the learner loads claim.lua again; it may listen on the channel."""
    clients = acl_clients(redis_server, real_redis, "qa")
    agent, learner = clients["agent"], clients["learner"]
    live(learner, "qa", 1)
    real_redis.script_flush()
    with pytest.raises(ClaimScriptMissing, match="may not load"):
        ProductionQuota(agent, "qa").claim(1, 8)
    news = QuotaNews(agent, "qa")
    news.drain()
    ProductionQuota(learner, "qa").load_script()
    ProductionQuota(learner, "qa").grant(1, 8)
    assert news.wait(5.0) is True
    assert ProductionQuota(agent, "qa").claim(1, 8) == ("OK", 8, 1)
    news.close()


def test_a_publish_carrying_the_grant_moves_its_unclaimed_rest_in_the_same_script(real_redis, monkeypatch):
    """``publish(carry_grant=True)`` (overlap production): what agents left unclaimed of the live
    version's grant moves to the new version with the version swap, announced after it; a grant
    of another version, or an overshoot, carries nothing. A publish whose reply was lost and is
    sent again leaves the quota as the first call and the claims since left it."""
    import numpy as np

    from surreal_redis.hub.params import ParameterPublisher, PublisherConfig

    run = "qcarry"
    publisher = ParameterPublisher(real_redis, run, PublisherConfig(retry_base_s=0.001))
    quota, news = ProductionQuota(real_redis, run), QuotaNews(real_redis, run)
    params = {"w": np.zeros(3, np.float32)}
    assert publisher.publish(params, 0, carry_grant=True) == 1
    assert quota.left() == (1, 0)  # no grant before: nothing to carry
    quota.grant(1, 100)
    assert quota.claim(1, 64) == ("OK", 64, 1)
    news.drain()
    assert publisher.publish(params, 1, carry_grant=True) == 2
    assert quota.left() == (2, 36)  # the unclaimed rest, now for v2
    assert quota.claim(1, 8).status == "STALE" and quota.claim(2, 8) == ("OK", 8, 2)
    assert news.wait(5.0, grants_only=True) and news.granted_version == 2
    assert quota.claim(2, 64) == ("OK", 64, 2)  # overshoot: -36 left
    assert publisher.publish(params, 2, carry_grant=True) == 3 and quota.left() == (3, 0)
    quota.grant(7, 50)  # a grant of another version (a learner restarted, say): not this one's
    assert publisher.publish(params, 3, carry_grant=True) == 4 and quota.left() == (4, 0)
    quota.grant(4, 30)
    assert publisher.publish(params, 4) == 5 and quota.left() == (4, 30)  # without carry_grant: untouched

    # The script ran and its reply was lost; an agent claims before the call is sent again.
    quota.grant(5, 40)
    claims: list = []
    executes = lossy_pipelines(monkeypatch, real_redis, after=lambda: claims.append(quota.claim(6, 16)))
    assert publisher.publish(params, 5, carry_grant=True) == 6
    assert claims == [("OK", 16, 6)]
    assert len(executes) == 2 and quota.left() == (6, 24)  # 40 carried, 16 claimed: not carried again
    news.close()


def test_a_publish_with_a_grant_replaces_the_carried_rest(real_redis):
    """``publish(carry_grant=True, grant=n)`` (the learner's publish after an overlap update,
    once the next batch is in): the new version gets ``n`` steps, whatever was left of the old
    grant, announced with the version; ``grant=0`` lets nobody produce. A bad ``n`` is refused in
    Python, and by the script before it writes."""
    import numpy as np

    from surreal_redis.hub.params import ParameterPublisher, PublisherConfig

    run = "qnext"
    publisher = ParameterPublisher(real_redis, run, PublisherConfig())
    quota, news = ProductionQuota(real_redis, run), QuotaNews(real_redis, run)
    params = {"w": np.zeros(3, np.float32)}
    assert publisher.publish(params, 0) == 1
    quota.grant(1, 100)
    assert quota.claim(1, 60) == ("OK", 60, 1)
    news.drain()
    assert publisher.publish(params, 1, carry_grant=True, grant=64) == 2 and quota.left() == (2, 64)
    assert news.wait(5.0, grants_only=True) and news.granted_version == 2
    assert quota.claim(1, 8).status == "STALE" and quota.claim(2, 100) == ("OK", 100, 2)  # -36 left
    assert publisher.publish(params, 2, carry_grant=True, grant=0) == 3 and quota.left() == (3, 0)
    assert quota.claim(3, 8) == ("WAIT", 0, 3)
    assert publisher.publish(params, 3, carry_grant=True) == 4 and quota.left() == (4, 0)  # the rest: none
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="grant must be"):
            publisher.publish(params, 4, carry_grant=True, grant=bad)
    with pytest.raises(ValueError, match="needs carry_grant"):
        publisher.publish(params, 4, grant=8)
    keys = ParamKeys(run)
    for bad in ("-3", "x", "1.5"):
        real_redis.set(keys.staging("ab12cd34"), b"abc", px=60_000)
        args = [5, 4, 3, 3, "xxh3_128:0", "c", "{}", 4, 0.0, "", 1000, keys.notify, bad]
        with pytest.raises(ScriptError, match="ARGS the grant"):
            publisher._scripts.call("publish", [keys.meta, keys.staging("ab12cd34"), keys.blob(5), keys.blob(4),
                                                keys.quota], args)
    assert quota.left() == (4, 0) and quota.live_version() == 4  # nothing written
    news.close()
