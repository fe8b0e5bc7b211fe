import json
import logging

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.lossy import lossy_pipelines

from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    ParamInfo,
    PublishBackpressure,
    PublisherConfig,
    blob_digest,
)
from surreal_redis.hub.run.heartbeat import Heartbeat, prune_stale, read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import ScriptError, Scripts

RUN = "unit"
KEYS = RunKeys(RUN).params


def make_params(seed=0, n=1000):
    rng = np.random.default_rng(seed)
    return {"pi/w": rng.standard_normal((n, 4)).astype(np.float32), "pi/b": np.zeros(4, np.float32),
            "norm/count": np.array(7, np.int64)}


def assert_params_equal(got, want):
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name])


class CountingClient:
    """Wraps a client; counts the commands that reach it and the round trips (a direct command or
    one pipeline execute each)."""

    def __init__(self, inner):
        self.inner = inner
        self.commands = []
        self.round_trips = 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name == "pipeline":
            return self._pipeline
        if callable(attr):
            def counted(*args, **kwargs):
                self.commands.append(name)
                self.round_trips += 1
                return attr(*args, **kwargs)
            return counted
        return attr

    def _pipeline(self, *args, **kwargs):
        pipe = self.inner.pipeline(*args, **kwargs)
        outer = self
        original = pipe.execute

        def execute(*a, **kw):
            outer.commands.extend(cmd[0][0].lower() for cmd in pipe.command_stack)
            outer.round_trips += 1
            return original(*a, **kw)
        pipe.execute = execute
        return pipe


def test_publish_fetch_round_trip(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    params = make_params()
    assert client.fetch() == (None, ParamInfo.nothing())
    assert pub.publish(params, iteration=3, message="hello") == 1
    got, info = client.fetch()
    assert_params_equal(got, params)
    assert (info.version, info.iteration, info.nbytes) == (1, 3, fake_redis.strlen(KEYS.blob(1)))
    assert info.digest == blob_digest(fake_redis.get(KEYS.blob(1))) and info.time > 0
    assert client.fetch_info() == info == client.info
    meta = fake_redis.hgetall(KEYS.meta)
    assert meta[b"message"] == b"hello"
    assert json.loads(meta[b"spec"]) == {"pi/w": ["float32", [1000, 4]], "pi/b": ["float32", [4]],
                                         "norm/count": ["int64", []]}
    assert fake_redis.ttl(KEYS.blob(1)) == -1  # the publish script made the blob permanent


def test_lz4_and_small_pieces_round_trip(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(compress_min_bytes=64, write_piece_bytes=1024))
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(piece_bytes=1024, max_in_flight=3))
    params = {"w": np.zeros((3000,), np.float32), "v": np.arange(5000, dtype=np.int32)}
    pub.publish(params, 0)
    assert fake_redis.hget(KEYS.meta, "codec") == b"srt1+lz4"
    got, _ = client.fetch()
    assert_params_equal(got, params)


def test_fetch_downloads_only_when_version_changed(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    counting = CountingClient(fake_redis)
    client = ParameterClient(counting, RUN, ParameterClientConfig(max_in_flight=2, piece_bytes=4096))
    pub.publish(make_params(n=4000), 1)  # ~64 KB: 16 pieces of 4 KiB
    got, _ = client.fetch()
    assert got is not None
    assert counting.commands.count("getrange") == 1 + 14
    # poll, meta + the first 2 pieces (one range), then 14 pieces 2 per round trip
    assert counting.round_trips == 1 + 1 + 7
    counting.commands.clear()
    for _ in range(5):
        assert client.fetch()[0] is None
    assert counting.commands == ["hget"] * 5  # a no-op poll is one tiny HGET
    counting.commands.clear()
    assert client.fetch(force=True)[0] is not None
    assert "getrange" in counting.commands


def test_a_version_known_to_be_live_is_downloaded_without_a_poll(fake_redis):
    """A claim told the agent which version is live: no HGET before the download; a known
    version that is not above the one held polls as usual."""
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    counting = CountingClient(fake_redis)
    client = ParameterClient(counting, RUN, ParameterClientConfig())
    pub.publish(make_params(1), 1)
    pub.publish(make_params(2), 2)
    got, info = client.fetch(at_least=2)
    assert info.version == 2 and counting.commands == ["hgetall", "getrange"] and counting.round_trips == 1
    assert_params_equal(got, make_params(2))
    counting.commands.clear()
    assert client.fetch(at_least=2)[0] is None and counting.commands == ["hget"]
    pub.publish(make_params(3), 3)
    counting.commands.clear()
    got, info = client.fetch(at_least=2)  # stale knowledge: the poll finds v3
    assert info.version == 3 and counting.commands == ["hget", "hgetall", "getrange"]
    pub.publish(make_params(4), 4)
    assert client.fetch(at_least=4)[1].version == 4


def test_a_known_version_whose_meta_went_back_is_rejected(fake_redis, caplog):
    """Meta below the version held (a Redis that lost it) after a claim named a newer one:
    refused and counted, as a polled lower version is."""
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    for i in range(3):
        pub.publish(make_params(i), i)
    assert client.fetch()[1].version == 3
    fake_redis.hset(KEYS.meta, "version", 2)  # as if v2 were live again
    fake_redis.rename(KEYS.blob(3), KEYS.blob(2))
    params, info = client.fetch(at_least=5)
    assert params is None and info.version == 3 and client.rejections == 1


def test_reads_follow_the_published_piece_size(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(read_piece_bytes=256 << 10))
    counting = CountingClient(fake_redis)
    client = ParameterClient(counting, RUN, ParameterClientConfig(max_in_flight=2))
    params = {"w": np.ones(3 << 18, np.float32)}  # 3 MiB and a small header
    pub.publish(params, 1)
    got, info = client.fetch()
    assert_params_equal(got, params)
    # 2 MiB (one range) with the meta, then 4 x 256 KiB and the header's bytes past 3 MiB, 2 at a time
    assert counting.commands.count("getrange") == 1 + 5
    assert counting.round_trips == 1 + 1 + 3


def test_version_published_between_poll_and_read(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    pub.publish(make_params(1), 1)
    original = fake_redis.hget

    def hget_then_publish(*args):
        reply = original(*args)
        pub.publish(make_params(2), 2)  # lands after the poll saw version 1
        return reply
    fake_redis.hget = hget_then_publish
    got, info = client.fetch()
    assert info.version == 2
    assert_params_equal(got, make_params(2))


def test_min_publish_interval_and_force(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(min_publish_interval=3600))
    assert pub.publish(make_params(), 1) == 1
    assert pub.publish(make_params(1), 2) is None
    assert pub.publish(make_params(1), 2, force=True) == 2
    assert fake_redis.hget(KEYS.meta, "version") == b"2"


def test_version_must_grow(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    pub.publish(make_params(), 1)
    other = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    other.publish(make_params(2), 2)  # a second learner moves the version behind pub's back
    with pytest.raises(ScriptError, match="version 2 is not greater than the published version 2"):
        pub.publish(make_params(3), 3)
    # the refused upload never touched the published blob, and its staging key expires
    got, info = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert info.version == 2 and info.iteration == 2
    assert_params_equal(got, make_params(2))
    staged = fake_redis.keys(f"{KEYS.tag}:staging:*")
    assert len(staged) == 1 and 0 < fake_redis.ttl(staged[0]) <= 600
    assert pub.publish(make_params(3), 4) == 3  # re-reads meta after the refusal


def test_publish_script_checks_staged_blob(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    pub.publish(make_params(), 1)
    scripts, staging = Scripts(fake_redis), KEYS.staging("ab" * 8)
    fake_redis.set(staging, b"short", px=60_000)

    def call(new, prev, nbytes):
        return scripts.call("publish", [KEYS.meta, staging, KEYS.blob(new), KEYS.blob(prev)],
                            [new, prev, nbytes, 1024, "xxh3_128:x", "srt1", "{}", 0, "0", "", 1000, KEYS.notify])
    with pytest.raises(ScriptError, match="STAGING staged blob for version 2 has 5 bytes, declared 99"):
        call(2, 1, 99)
    with pytest.raises(ScriptError, match="VERSION publisher out of sync: declared previous version 0"):
        call(2, 0, 5)
    with pytest.raises(ScriptError, match="VERSION version 1 is not greater"):
        call(1, 1, 5)
    fake_redis.persist(staging)  # as if a SETRANGE recreated it after a restart lost the SET's key
    with pytest.raises(ScriptError, match="STAGING .* has no TTL"):
        call(2, 1, 5)
    fake_redis.delete(staging)
    with pytest.raises(ScriptError, match="STAGING .* does not exist"):
        call(2, 1, 5)
    assert fake_redis.hget(KEYS.meta, "version") == b"1" and not fake_redis.exists(KEYS.blob(2))


def test_publish_script_takes_a_resent_call_as_success(fake_redis):
    scripts, staging = Scripts(fake_redis), KEYS.staging("cd" * 8)
    fake_redis.set(staging, b"x" * 2000, px=60_000)

    def call(digest):
        return scripts.call("publish", [KEYS.meta, staging, KEYS.blob(1), KEYS.blob(0)],
                            [1, 0, 2000, 1024, digest, "srt1", "{}", 0, "0", "", 1000, KEYS.notify])
    assert call("xxh3_128:aa") == 1
    assert call("xxh3_128:aa") == 1  # the first reply was lost: the same call again is success
    with pytest.raises(ScriptError, match="VERSION version 1 is not greater"):
        call("xxh3_128:bb")  # same version, other contents: a second publisher
    assert fake_redis.hget(KEYS.meta, "digest") == b"xxh3_128:aa" and fake_redis.strlen(KEYS.blob(1)) == 2000


def test_publisher_resumes_from_meta(fake_redis):
    ParameterPublisher(fake_redis, RUN, PublisherConfig()).publish(make_params(), 1)
    ParameterPublisher(fake_redis, RUN, PublisherConfig()).publish(make_params(), 2)
    resumed = ParameterPublisher(fake_redis, RUN, PublisherConfig(grace_s=5))
    assert resumed.version == 2
    assert resumed.publish(make_params(), 3) == 3
    assert 0 < fake_redis.pttl(KEYS.blob(2)) <= 5000  # the superseded blob expires after the grace


def test_bad_params_are_rejected_by_name(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    with pytest.raises(TypeError, match="'w' is a list"):
        pub.publish({"w": [1.0, 2.0]}, 1)
    with pytest.raises(TypeError, match="dict of name"):
        pub.publish([np.zeros(2)], 1)
    with pytest.raises(ValueError, match="iteration must be"):
        pub.publish(make_params(), -1)
    with pytest.raises(ValueError, match="message must be a string, got 3"):
        pub.publish(make_params(), 1, message=3)
    with pytest.raises(ValueError, match="read_piece_bytes must be >= 1024, got 10"):
        PublisherConfig(read_piece_bytes=10)
    with pytest.raises(ValueError, match="piece_bytes must be >= 1024 or None, got 10"):
        ParameterClientConfig(piece_bytes=10)
    with pytest.raises(ValueError, match="retries must be >= 0, got -1"):
        PublisherConfig(retries=-1)
    with pytest.raises(ValueError, match="reject_backoff_s <= reject_backoff_cap_s, got 5, 1"):
        ParameterClientConfig(reject_backoff_s=5, reject_backoff_cap_s=1)
    with pytest.raises(ValueError, match="above must be an integer >= 0, got -1"):
        pub.republish(make_params(), 1, above=-1)
    with pytest.raises(ValueError, match="invalid publisher id '../x'"):
        KEYS.staging("../x")
    assert not fake_redis.exists(KEYS.meta)


def test_rejected_blob_keeps_params_backs_off_and_is_counted(fake_redis, caplog, monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr("surreal_redis.hub.params.client.time.monotonic", lambda: clock["now"])
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    counting = CountingClient(fake_redis)
    client = ParameterClient(counting, RUN, ParameterClientConfig(reject_backoff_s=2, reject_backoff_cap_s=8))
    pub.publish(make_params(), 1)
    first, info = client.fetch()
    pub.publish(make_params(1), 2)
    last = fake_redis.strlen(KEYS.blob(2)) - 1
    fake_redis.setrange(KEYS.blob(2), last, bytes([fake_redis.getrange(KEYS.blob(2), last, last)[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="surreal_redis.hub.params"):
        assert client.fetch() == (None, info)
    assert "digest mismatch" in caplog.text and client.info.version == 1 and client.rejections == 1

    def downloads_after(seconds):
        clock["now"] += seconds
        counting.commands.clear()
        assert client.fetch() == (None, info)
        return counting.commands.count("getrange")
    # jittered backoff: the k-th wait is within [2 * 2^(k-1), 2 * 2^k] s, capped at [4, 8] s
    assert downloads_after(1.9) == 0 and client.rejections == 1  # polls, but no download yet
    assert downloads_after(2.2) == 1 and client.rejections == 2
    assert downloads_after(3.9) == 0
    assert downloads_after(4.2) == 1
    assert [downloads_after(8.1), downloads_after(8.1), downloads_after(3.9)] == [1, 1, 0]
    assert client.rejections == 5 and client.info.version == 1
    assert client.fetch(force=True) == (None, info) and client.rejections == 6  # force skips the wait
    pub.republish(make_params(2), 3, above=2)  # a new version is fetched at once
    got, new_info = client.fetch()
    assert new_info.version == 3 and client.rejections == 6
    assert_params_equal(got, make_params(2))


def test_republish_goes_above_every_version_seen(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(min_publish_interval=3600))
    assert pub.publish(make_params(), 1) == 1
    ParameterPublisher(fake_redis, RUN, PublisherConfig()).publish(make_params(1), 2)  # meta moves to 2
    assert pub.republish(make_params(2), 3) == 3  # no refusal, no interval
    assert pub.republish(make_params(2), 4, above=9) == 10  # agents reported v9 (a Redis that lost it)
    assert pub.publish(make_params(3), 5, force=True) == 11
    got, info = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert (info.version, info.iteration) == (11, 5)


def test_a_lower_version_is_rejected_until_a_publisher_goes_above(fake_redis):
    """Redis emptied and a learner started over from v1: agents keep what they hold and count a
    rejection (which makes the learner republish above every version agents report)."""
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    for version in (1, 2, 3):
        assert pub.publish(make_params(version), version, force=True) == version
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    assert client.fetch()[1].version == 3
    fake_redis.flushall()
    fresh = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    assert fresh.publish(make_params(9), 1) == 1
    got, info = client.fetch()
    assert got is None and info.version == 3 and client.rejections == 1
    assert fresh.republish(make_params(9), 1, above=3) == 4
    got, info = client.fetch()
    assert info.version == 4
    assert_params_equal(got, make_params(9))


def lose_replies(monkeypatch, client, command, losses=1):
    """The first ``losses`` calls of ``command`` run on the server, then raise as if the reply
    were lost on the way back; returns the list of calls."""
    original = getattr(client, command)
    calls = []

    def lossy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(args)
        if len(calls) <= losses:
            raise redis.ConnectionError(f"{command} reply lost (simulated)")
        return result
    monkeypatch.setattr(client, command, lossy)
    return calls


def test_lost_replies_are_resent_without_harm(fake_redis, monkeypatch):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(write_piece_bytes=1024, retry_base_s=0.001))
    evals = lose_replies(monkeypatch, fake_redis, "evalsha")
    pieces = lose_replies(monkeypatch, fake_redis, "setrange", losses=2)
    params = make_params(n=2000)  # ~32 KB: a SET and 31 SETRANGEs
    assert pub.publish(params, 1) == 1
    assert len(evals) == 2 and len(pieces) > 30  # the script and two pieces ran twice
    got, info = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert info.version == 1 and info.nbytes == fake_redis.strlen(KEYS.blob(1))
    assert_params_equal(got, params)
    assert fake_redis.keys(f"{KEYS.tag}:staging:*") == []


@pytest.mark.parametrize("pieces", ["one", "several"])
def test_retries_are_bounded(fake_redis, monkeypatch, pieces):
    """A server that never answers: the first round trip is tried 1 + ``retries`` times, then the
    error propagates with nothing published (a one-piece blob goes up with the script)."""
    config = PublisherConfig(retries=2, retry_base_s=0.001, write_piece_bytes=1024 if pieces == "several" else 1 << 20)
    pub = ParameterPublisher(fake_redis, RUN, config)
    if pieces == "several":
        calls = lose_replies(monkeypatch, fake_redis, "set", losses=10)
    else:
        calls = lossy_pipelines(monkeypatch, fake_redis, losses=10, reached=False)
    with pytest.raises(redis.ConnectionError, match="reply lost"):
        pub.publish(make_params(n=2000), 1)
    assert len(calls) == 3 and not fake_redis.exists(KEYS.meta)


def test_a_one_piece_publish_is_one_round_trip(fake_redis, monkeypatch):
    """The upload and the script go in one MULTI/EXEC; a reply lost after it ran is re-sent
    without harm (the script answers with the live version and drops the blob staged again)."""
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(retry_base_s=0.001))
    pub.publish(make_params(), 1)  # loads the script (NOSCRIPT on a new server: the script alone)
    for command in ("set", "setrange", "evalsha", "execute_command"):
        monkeypatch.setattr(fake_redis, command, lambda *a, **k: pytest.fail("a round trip of its own"))
    executes = lossy_pipelines(monkeypatch, fake_redis, losses=1)
    params = make_params(1)
    assert pub.publish(params, 2) == 2
    assert len(executes) == 2  # the lost one and its re-send
    monkeypatch.undo()
    got, info = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert info.version == 2
    assert_params_equal(got, params)
    assert fake_redis.keys(f"{KEYS.tag}:staging:*") == []


def test_staging_lost_before_the_script_is_uploaded_again(fake_redis, monkeypatch):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(write_piece_bytes=1024))
    pub.publish(make_params(), 1)  # loads the script
    original = fake_redis.evalsha
    calls = []

    def restart_first(*args):
        calls.append(args)
        if len(calls) == 1:  # as if Redis restarted between the upload and the script
            fake_redis.delete(*fake_redis.keys(f"{KEYS.tag}:staging:*"))
        return original(*args)
    monkeypatch.setattr(fake_redis, "evalsha", restart_first)
    assert pub.publish(make_params(1), 2) == 2
    assert len(calls) == 2
    got, _ = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert_params_equal(got, make_params(1))


def test_out_of_memory_is_backpressure(fake_redis, monkeypatch):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(write_piece_bytes=1024))
    pub.publish(make_params(), 1)
    original = fake_redis.setrange

    def full(*args):
        original(*args)  # the first piece landed, then memory ran out
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
    monkeypatch.setattr(fake_redis, "setrange", full)
    with pytest.raises(PublishBackpressure, match="out of memory"):
        pub.publish(make_params(1), 2)
    assert fake_redis.keys(f"{KEYS.tag}:staging:*") == []  # the partial upload is freed at once
    monkeypatch.setattr(fake_redis, "setrange", original)
    assert pub.publish(make_params(1), 2) == 2


def test_expired_blob_gives_none_and_one_warning(fake_redis, caplog):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    pub.publish(make_params(), 1)
    fake_redis.delete(KEYS.blob(1))
    with caplog.at_level(logging.WARNING, logger="surreal_redis.hub.params"):
        assert client.fetch() == (None, ParamInfo.nothing())
        assert client.fetch() == (None, ParamInfo.nothing())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "missing, expired" in warnings[0].getMessage()
    pub.publish(make_params(2), 2)  # a new version arrives: the client recovers
    got, info = client.fetch()
    assert info.version == 2
    assert_params_equal(got, make_params(2))


def test_malformed_meta_gives_none(fake_redis, caplog):
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    fake_redis.hset(KEYS.meta, mapping={"version": "4", "nbytes": "lots"})
    assert client.fetch() == (None, ParamInfo.nothing())
    assert "malformed parameter metadata" in caplog.text


def test_outage_gives_none_not_exception(caplog):
    dead = redis.Redis(unix_socket_path="/nonexistent/redis.sock", retry=Retry(NoBackoff(), 0))
    client = ParameterClient(dead, RUN, ParameterClientConfig())
    assert client.fetch() == (None, ParamInfo.nothing())
    assert "parameter fetch failed" in caplog.text


def test_heartbeat_rate_limit_and_staleness(fake_redis, monkeypatch):
    clock = {"wall": 1000.0, "mono": 50.0}
    monkeypatch.setattr("surreal_redis.hub.run.heartbeat.time.time", lambda: clock["wall"])
    monkeypatch.setattr("surreal_redis.hub.run.heartbeat.time.monotonic", lambda: clock["mono"])
    a3, a10 = Heartbeat(fake_redis, RUN, 3, ttl_s=30), Heartbeat(fake_redis, RUN, 10, ttl_s=30)
    assert a3.beat(steps=100, episodes=2, param_version=5)
    assert a10.beat(steps=1, episodes=0, param_version=0)
    clock["mono"] += 5
    assert not a3.beat(steps=200, episodes=3, param_version=5)  # within ttl/3: no write
    clock["wall"] += 20
    clock["mono"] += 20
    assert a3.beat(steps=300, episodes=4, param_version=6)
    clock["wall"] += 15  # agent 10 is now 35 s silent, agent 3 only 15 s
    agents = read_agents(fake_redis, RUN, ttl_s=30)
    assert [(a.agent_id, a.stale, a.steps) for a in agents] == [("3", False, 300), ("10", True, 1)]
    assert agents[0].param_version == 6 and agents[0].age_s == pytest.approx(15)
    assert [a.agent_id for a in read_agents(fake_redis, RUN, ttl_s=30, include_stale=False)] == ["3"]
    assert prune_stale(fake_redis, RUN, ttl_s=30) == ["10"]
    assert fake_redis.hkeys(RunKeys(RUN).agents) == [b"3"]
    a3.remove()
    assert read_agents(fake_redis, RUN, ttl_s=30) == []


def test_malformed_heartbeat_is_skipped_and_pruned(fake_redis, caplog):
    Heartbeat(fake_redis, RUN, "eval-0", ttl_s=10).beat(1, 1, 1)
    fake_redis.hset(RunKeys(RUN).agents, "7", b"{not json")
    assert [a.agent_id for a in read_agents(fake_redis, RUN, ttl_s=10)] == ["eval-0"]
    assert "malformed heartbeat of agent '7'" in caplog.text
    assert prune_stale(fake_redis, RUN, ttl_s=10) == ["7"]


@pytest.mark.parametrize("bad", [-1, "", True, 2.5, "x" * 101])
def test_bad_agent_id_and_ttl_rejected(fake_redis, bad):
    with pytest.raises(ValueError, match="agent_id"):
        Heartbeat(fake_redis, RUN, bad, ttl_s=10)


def test_bad_ttl_rejected(fake_redis):
    with pytest.raises(ValueError, match="ttl_s must be > 0 seconds, got 0"):
        Heartbeat(fake_redis, RUN, 1, ttl_s=0)
    with pytest.raises(ValueError, match="ttl_s"):
        read_agents(fake_redis, RUN, ttl_s=-1)


def test_continue_after_jumps_the_version_sequence(fake_redis):
    from surreal_redis.hub.params import (
        ParameterClient,
        ParameterClientConfig,
        ParameterPublisher,
        PublisherConfig,
    )

    publisher = ParameterPublisher(fake_redis, "resume", PublisherConfig())
    publisher.continue_after(41)
    assert publisher.publish({"w": np.zeros(3, np.float32)}, 7, force=True) == 42
    assert publisher.publish({"w": np.ones(3, np.float32)}, 8, force=True) == 43
    params, info = ParameterClient(fake_redis, "resume", ParameterClientConfig()).fetch()
    assert info.version == 43 and params["w"][0] == 1
    with pytest.raises(ValueError, match="version"):
        publisher.continue_after(-1)


def test_versions_never_go_back_when_redis_loses_the_meta(fake_redis):
    from surreal_redis.hub.params import ParameterPublisher, PublisherConfig

    publisher = ParameterPublisher(fake_redis, "lost", PublisherConfig())
    for _ in range(3):
        publisher.publish({"w": np.zeros(2, np.float32)}, 0, force=True)
    fake_redis.flushall()  # a Redis restarted without persistence: the cached prev is gone
    assert publisher.publish({"w": np.zeros(2, np.float32)}, 1, force=True) == 4
    assert publisher.publish({"w": np.zeros(2, np.float32)}, 2, force=True) == 5


# ---------------------------------------------------------------- read replicas

class FakeClock:
    """Stands in for the ``time`` module in hub/params/: ``monotonic`` moves only when told."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    time = staticmethod(__import__("time").time)
    sleep = staticmethod(__import__("time").sleep)


@pytest.fixture
def clock(monkeypatch):
    from surreal_redis.hub.params import client as client_module
    from surreal_redis.hub.params import publisher as publisher_module

    fake = FakeClock()
    monkeypatch.setattr(client_module, "time", fake)
    monkeypatch.setattr(publisher_module, "time", fake)
    return fake


@pytest.fixture
def replica():
    fakeredis = pytest.importorskip("fakeredis")
    client = fakeredis.FakeRedis(decode_responses=False)  # its own server, unlike fake_redis
    yield client
    client.close()


def replicate(primary, replica, *, skip=()):
    """Copy the primary's keys (but those in ``skip``) to the replica, as replication would."""
    for key in primary.keys("*"):
        if key.decode() in skip:
            continue
        if primary.type(key) == b"hash":
            replica.delete(key)
            replica.hset(key, mapping=primary.hgetall(key))
        else:
            replica.set(key, primary.get(key))


def test_replica_serves_polls_and_downloads(fake_redis, replica, clock):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig(read_piece_bytes=1024))
    primary = CountingClient(fake_redis)
    client = ParameterClient(primary, RUN, ParameterClientConfig(), replicas=[replica])
    pub.publish(make_params(1), 1)
    replicate(fake_redis, replica)
    got, info = client.fetch()
    assert info.version == 1
    assert_params_equal(got, make_params(1))
    assert client.fetch() == (None, info)  # nothing new on the replica
    assert primary.commands == []  # the primary served nothing
    assert (client.replica_downloads, client.primary_downloads, client.replica_fallbacks) == (1, 0, 0)


def test_lagging_replica_never_takes_the_agent_back(fake_redis, replica, clock):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(primary_poll_every_s=5), replicas=[replica])
    pub.publish(make_params(1), 1)
    replicate(fake_redis, replica)
    assert client.fetch()[1].version == 1
    pub.publish(make_params(2), 2)  # the replica lags at v1
    assert client.fetch() == (None, client.info)  # the replica shows nothing new yet
    clock.now += 5  # ... but the primary is asked every primary_poll_every_s
    got, info = client.fetch()
    assert info.version == 2 and client.primary_downloads == 1
    assert_params_equal(got, make_params(2))
    # The replica still shows v1, below what the agent holds: polls go to the primary, which has
    # nothing new, and the agent keeps v2.
    for _ in range(3):
        assert client.fetch() == (None, info)
    assert client.info.version == 2 and client.rejections == 0


def test_a_version_known_to_be_live_skips_the_lagging_replica(fake_redis, replica, clock):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(), replicas=[replica])
    pub.publish(make_params(1), 1)
    replicate(fake_redis, replica)
    client.fetch()
    pub.publish(make_params(2), 2)
    assert client.fetch(at_least=2)[1].version == 2  # a claim said v2 is live
    assert (client.replica_downloads, client.primary_downloads) == (1, 1)


@pytest.mark.parametrize("damage", ["blob missing", "blob corrupt", "meta went back"])
def test_replica_that_cannot_serve_a_version_falls_back_to_the_primary(fake_redis, replica, clock, damage):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(), replicas=[replica])
    pub.publish(make_params(1), 1)
    replicate(fake_redis, replica)
    client.fetch()
    pub.publish(make_params(2), 2)
    replicate(fake_redis, replica, skip={KEYS.blob(2)})  # meta v2 arrived, its blob did not
    if damage == "blob corrupt":
        blob = bytearray(fake_redis.get(KEYS.blob(2)))
        blob[len(blob) // 2] ^= 0xFF
        replica.set(KEYS.blob(2), bytes(blob))
    if damage == "meta went back":
        # The replica re-synced to an older state between the poll and the meta read.
        original = replica.pipeline

        def stale_pipeline(*args, **kwargs):
            replica.hset(KEYS.meta, "version", 1)
            return original(*args, **kwargs)
        replica.pipeline = stale_pipeline
    got, info = client.fetch()
    assert info.version == 2
    assert_params_equal(got, make_params(2))
    assert (client.replica_fallbacks, client.primary_downloads, client.rejections) == (1, 1, 0)


def test_unreachable_replica_rests_and_the_next_one_is_tried(fake_redis, replica, clock, caplog):
    dead = redis.Redis(unix_socket_path="/nonexistent/redis.sock", retry=Retry(NoBackoff(), 0))
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(replica_backoff_s=2, replica_backoff_cap_s=2),
                             replicas=[dead, replica])
    client._replica = 0  # start with the dead one
    pub.publish(make_params(1), 1)
    replicate(fake_redis, replica)
    assert client.fetch()[1].version == 1  # the dead replica failed: read from the primary
    assert client.primary_downloads == 1 and "parameter replica 0 failed" in caplog.text
    pub.publish(make_params(2), 2)
    replicate(fake_redis, replica)
    clock.now += 0.5  # replicas rest at least 1 s (half the 2 s backoff)
    assert client.fetch()[1].version == 2 and client.primary_downloads == 2
    clock.now += 2
    pub.publish(make_params(3), 3)
    replicate(fake_redis, replica)
    assert client.fetch()[1].version == 3 and client.replica_downloads == 1  # the live replica


def test_force_reads_the_primary(fake_redis, replica, clock):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(), replicas=[replica])
    pub.publish(make_params(1), 1)
    replicate(fake_redis, replica)
    replica.set(KEYS.blob(1), b"junk")
    assert client.fetch(force=True)[1].version == 1
    assert (client.primary_downloads, client.replica_downloads) == (1, 0)


def test_nothing_on_the_replica_asks_the_primary(fake_redis, replica, clock):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(), replicas=[replica])
    assert client.fetch() == (None, ParamInfo.nothing())
    pub.publish(make_params(1), 1)  # not replicated yet (a replica that just started syncing)
    assert client.fetch()[1].version == 1 and client.primary_downloads == 1


@pytest.mark.parametrize("bad", [{"primary_poll_every_s": 0}, {"replica_backoff_s": 0},
                                 {"replica_backoff_s": 5, "replica_backoff_cap_s": 1}])
def test_bad_replica_settings_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ParameterClientConfig(**bad)


def test_param_read_urls_config():
    from surreal_redis.config import RedisConfig
    from surreal_redis.configtools import ConfigError, from_dict
    from surreal_redis.hub.params import connect_replicas

    config = from_dict(RedisConfig, {"param_read_urls": ["redis://replica-1:6379/0", "unix:///tmp/r.sock"]})
    assert config.param_read_urls == ("redis://replica-1:6379/0", "unix:///tmp/r.sock")
    clients = connect_replicas(config.param_read_urls, config.settings())  # connects on first use
    assert [c.connection_pool.connection_kwargs.get("host") for c in clients] == ["replica-1", None]
    for client in clients:
        client.close()
    with pytest.raises((ValueError, ConfigError), match="'http://replica:6379'"):
        from_dict(RedisConfig, {"param_read_urls": ["http://replica:6379"]})
