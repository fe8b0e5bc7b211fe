import pytest
import redis

import surreal_redis.scripts as scripts_module
from surreal_redis.resources import resource_dir
from surreal_redis.scripts import ScriptError, Scripts, script_source

pytestmark = pytest.mark.integration


def test_every_script_declares_its_contract():
    paths = sorted(resource_dir("lua").glob("*.lua"))
    assert {p.stem for p in paths} >= {"insert", "gc", "trim", "publish"}
    for path in paths:
        head = script_source(path.stem).splitlines()[:12]
        for tag in ("-- KEYS[", "-- ARGV", "-- returns"):
            assert any(line.startswith(tag) for line in head), f"{path.name} lacks a {tag!r} header line"
        assert not head[0].startswith("#!"), f"{path.name} must not use a shebang (fakeredis, Redis 6.2)"


def test_oom_propagates_unwrapped_and_other_errors_name_the_script(real_redis, monkeypatch):
    bodies = {"writer": "return redis.call('SET', KEYS[1], ARGV[1])",
              "failer": "return redis.error_reply('bad input ' .. ARGV[1])"}
    monkeypatch.setattr(scripts_module, "script_source", bodies.__getitem__)
    scripts = Scripts(real_redis)
    real_redis.set("filler", b"x" * 2_000_000)
    real_redis.config_set("maxmemory", "1mb")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        scripts.call("writer", keys=["k"], args=["v"])
    real_redis.config_set("maxmemory", "0")
    assert scripts.call("writer", keys=["k"], args=["v"]) == b"OK"
    with pytest.raises(ScriptError, match="failer.lua: bad input 7"):
        scripts.call("failer", keys=["k"], args=[7])


def test_outages_propagate_unwrapped_for_the_callers_backoff(real_redis, monkeypatch):
    """A cluster slot with no primary during a failover answers CLUSTERDOWN or TRYAGAIN to any
    script (the janitor's trim.lua included): an outage the learner's guard rides out, never the
    ScriptError that stops it."""
    scripts = Scripts(real_redis)
    for error in (redis.exceptions.ClusterDownError("The cluster is down"),
                  redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
                  redis.ConnectionError("Connection reset by peer")):
        def failing(*_, error=error, **__):
            raise error

        monkeypatch.setattr(real_redis, "evalsha", failing)
        with pytest.raises(type(error)) as raised:
            scripts.call("trim", keys=["exp"], args=[1])
        assert raised.type is type(error)


def test_a_flushed_script_is_loaded_and_run_again_and_a_failed_load_propagates(real_redis, monkeypatch):
    monkeypatch.setattr(scripts_module, "script_source", {"writer": "return redis.call('SET', KEYS[1], ARGV[1])"}.__getitem__)
    scripts = Scripts(real_redis)
    real_redis.script_flush()
    assert scripts.call("writer", keys=["k"], args=["v"]) == b"OK" and real_redis.get("k") == b"v"
    real_redis.script_flush()

    def refused(*_):
        raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(real_redis, "script_load", refused)
    with pytest.raises(redis.ConnectionError):
        scripts.call("writer", keys=["k"], args=["w"])
    assert real_redis.get("k") == b"v"


def test_trim_under_memory_pressure_takes_acked_entries_then_the_oldest_counting_unread(real_redis):
    real_redis.config_set("stream-node-max-entries", 2)
    ids = [real_redis.xadd("exp", {"n": str(i)}) for i in range(10)]
    real_redis.xgroup_create("exp", "learner", id="0")
    real_redis.xreadgroup("learner", "c", {"exp": ">"}, count=6)  # entries 0..5 delivered
    real_redis.xack("exp", "learner", *ids[:4])  # 4 and 5 still pending
    scripts = Scripts(real_redis)
    # acked entries only (whole nodes), never a pending or unread one
    assert scripts.call("trim", ["exp"], ["learner", "ACKED", "", 1000]) == [4, 0, ids[4]]
    assert scripts.call("trim", ["exp"], ["learner", "ACKED", "", 1000]) == [0, 0, ids[4]]
    # then the oldest, exactly limit of them: 4 and 5 were delivered, 6 was not
    assert scripts.call("trim", ["exp"], ["learner", "OLDEST", "", 3]) == [3, 1, ids[7]]
    assert scripts.call("trim", ["exp"], ["learner", "OLDEST", "", 1000]) == [3, 3, b""]
    assert scripts.call("trim", ["exp"], ["learner", "OLDEST", "", 1000]) == [0, 0, b""]
    with pytest.raises(ScriptError, match="bad mode/limit OLDEST/0"):
        scripts.call("trim", ["exp"], ["learner", "OLDEST", "", 0])


def test_trim_of_the_oldest_counts_every_entry_unread_when_nothing_was_delivered(real_redis):
    ids = [real_redis.xadd("exp", {"n": str(i)}) for i in range(5)]
    scripts = Scripts(real_redis)
    assert scripts.call("trim", ["exp"], ["learner", "OLDEST", "", 2]) == [2, 2, ids[2]]
    assert scripts.call("trim", ["exp"], ["learner", "ACKED", "", 1000]) == [0, 0, ids[2]]


def test_trim_of_acked_entries_takes_the_last_delivered_one_once_acked(real_redis):
    real_redis.config_set("stream-node-max-entries", 2)
    ids = [real_redis.xadd("exp", {"n": str(i)}) for i in range(6)]
    real_redis.xgroup_create("exp", "learner", id="0")
    real_redis.xreadgroup("learner", "c", {"exp": ">"}, count=4)
    real_redis.xack("exp", "learner", *ids[:4])
    assert Scripts(real_redis).call("trim", ["exp"], ["learner", "ACKED", "", 1000]) == [4, 0, ids[4]]
