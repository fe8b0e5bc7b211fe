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
