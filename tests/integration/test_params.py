import logging
import time

import numpy as np
import pytest
import redis
from support.lossy import lossy_pipelines

from surreal_redis.connection import RedisSettings, connect
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublishBackpressure,
    PublisherConfig,
)
from surreal_redis.hub.run.heartbeat import Heartbeat, prune_stale, read_agents
from surreal_redis.keys import RunKeys

pytestmark = pytest.mark.integration

RUN = "integ"
KEYS = RunKeys(RUN).params


def big_params(megabytes, seed=0):
    rng = np.random.default_rng(seed)
    n = megabytes * (1 << 20) // 4
    return {"actor/w": rng.standard_normal(n, dtype=np.float32).reshape(-1, 256),
            "actor/b": rng.standard_normal(256, dtype=np.float32)}


def test_publish_on_real_server_survives_script_flush(real_redis):
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig(grace_s=30))
    client = ParameterClient(real_redis, RUN, ParameterClientConfig())
    pubsub = real_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(KEYS.notify)
    assert pub.publish(big_params(1), 10) == 1
    real_redis.script_flush()  # as after a restart or failover: EVALSHA must reload the script
    assert pub.publish(big_params(1, seed=1), 20) == 2
    got, info = client.fetch()
    assert info.version == 2 and info.iteration == 20
    np.testing.assert_array_equal(got["actor/w"], big_params(1, seed=1)["actor/w"])
    assert 0 < real_redis.pttl(KEYS.blob(1)) <= 30_000  # superseded blob expires after the grace
    assert real_redis.ttl(KEYS.blob(2)) == -1
    assert real_redis.keys(f"{KEYS.tag}:staging:*") == []  # renamed away by the script
    notices = []
    deadline = time.monotonic() + 2
    while len(notices) < 2 and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message:
            notices.append(message["data"])
    assert notices == [b"1", b"2"]
    pubsub.close()


def test_piecewise_fetch_of_multi_megabyte_blob(real_redis):
    # 6 MB written as 1 MiB SETRANGE pieces, read as 512 KiB GETRANGEs, 3 per round trip
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig(write_piece_bytes=1 << 20, read_piece_bytes=1 << 19))
    client = ParameterClient(real_redis, RUN, ParameterClientConfig(max_in_flight=3))
    params = big_params(6)
    pub.publish(params, 1)
    got, info = client.fetch()
    assert info.nbytes > 6 << 20 and info.nbytes == real_redis.strlen(KEYS.blob(1))
    assert got.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(got[name], params[name])


def test_outage_gives_none_not_an_exception(redis_server, caplog):
    settings = RedisSettings(retries=0, socket_timeout=1, connect_timeout=1)
    client_conn = connect(redis_server.url, settings)
    pub = ParameterPublisher(client_conn, RUN, PublisherConfig())
    client = ParameterClient(client_conn, RUN, ParameterClientConfig())
    pub.publish(big_params(1), 5)
    params, info = client.fetch()
    assert params is not None
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="surreal_redis.hub.params"):
        assert client.fetch() == (None, info)
        assert client.fetch(force=True) == (None, info)
    assert "parameter fetch failed, keeping v1" in caplog.text
    client_conn.close()


def test_heartbeats_on_real_server(real_redis):
    Heartbeat(real_redis, RUN, 0, ttl_s=0.2).beat(10, 1, 3)
    Heartbeat(real_redis, RUN, 1, ttl_s=5).beat(20, 2, 3)
    time.sleep(0.3)
    assert [(a.agent_id, a.stale) for a in read_agents(real_redis, RUN, ttl_s=0.2)] == [("0", True), ("1", True)]
    Heartbeat(real_redis, RUN, 1, ttl_s=5).beat(30, 2, 3)
    assert prune_stale(real_redis, RUN, ttl_s=0.2) == ["0"]
    assert [a.steps for a in read_agents(real_redis, RUN, ttl_s=0.2)] == [30]


def lose_first_reply(monkeypatch, client, command):
    """The first ``command`` runs on the server, then raises as if its reply were lost."""
    original = getattr(client, command)
    calls = []

    def lossy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(args)
        if len(calls) == 1:
            raise redis.ConnectionError(f"{command} reply lost (simulated)")
        return result
    monkeypatch.setattr(client, command, lossy)
    return calls


def test_publish_whose_reply_was_lost_is_not_refused(real_redis, monkeypatch):
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig(write_piece_bytes=1 << 18, retry_base_s=0.001))
    pub.publish(big_params(1), 1)
    evals = lose_first_reply(monkeypatch, real_redis, "evalsha")
    pieces = lose_first_reply(monkeypatch, real_redis, "setrange")
    assert pub.publish(big_params(1, seed=1), 2) == 2  # the re-sent script call finds v2 live: success
    assert len(evals) == 2 and len(pieces) == 4 + 1  # 1 MiB: a SET and 4 SETRANGEs, one re-sent
    got, info = ParameterClient(real_redis, RUN, ParameterClientConfig()).fetch()
    assert info.version == 2 and info.nbytes == real_redis.strlen(KEYS.blob(2))
    np.testing.assert_array_equal(got["actor/w"], big_params(1, seed=1)["actor/w"])
    assert real_redis.hget(KEYS.meta, "version") == b"2" and not real_redis.exists(KEYS.blob(3))


def test_tampered_blob_is_rejected_then_republished(real_redis, caplog):
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig())
    agents = [ParameterClient(real_redis, RUN, ParameterClientConfig(reject_backoff_s=30)) for _ in range(2)]
    pub.publish(big_params(1), 1)
    for agent in agents:
        assert agent.fetch()[0] is not None
    pub.publish(big_params(1, seed=1), 2)
    real_redis.setrange(KEYS.blob(2), 1 << 19, b"\xff\xfe")  # corrupted in place, same length
    with caplog.at_level(logging.WARNING, logger="surreal_redis.hub.params"):
        for _ in range(3):
            for agent in agents:
                assert agent.fetch() == (None, agent.info)
    assert [(a.info.version, a.rejections) for a in agents] == [(1, 1), (1, 1)]  # no re-download yet
    assert caplog.text.count("digest mismatch") == 2
    # the learner hears of the rejections (say, through heartbeats) and republishes above them
    assert pub.republish(big_params(1, seed=2), 3, above=2) == 3
    for agent in agents:
        got, info = agent.fetch()
        assert info.version == 3
        np.testing.assert_array_equal(got["actor/w"], big_params(1, seed=2)["actor/w"])


def test_out_of_memory_at_staging_is_backpressure(real_redis):
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig())
    pub.publish(big_params(1), 1)
    used = int(real_redis.info("memory")["used_memory"])
    real_redis.config_set("maxmemory", used - (256 << 10))  # already full: the staging SET is refused
    with pytest.raises(PublishBackpressure, match="out of memory"):
        pub.publish(big_params(1, seed=1), 2)
    assert real_redis.keys(f"{KEYS.tag}:staging:*") == []
    assert real_redis.hget(KEYS.meta, "version") == b"1" and not real_redis.exists(KEYS.blob(2))
    real_redis.config_set("maxmemory", 128 << 20)  # memory freed (the learner trimmed experience)
    assert pub.publish(big_params(1, seed=1), 2) == 2
    assert ParameterClient(real_redis, RUN, ParameterClientConfig()).fetch()[1].version == 2


@pytest.mark.parametrize("pieces", ["one", "several"])
def test_out_of_memory_at_the_script_leaves_nothing_half_done(real_redis, monkeypatch, pieces):
    """Memory runs out between the upload and the script (several pieces: the upload landed) or
    as the one-piece upload and the script are sent together (MULTI/EXEC: neither runs)."""
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig(write_piece_bytes=(8 << 20) if pieces == "one" else 1 << 18))
    pub.publish(big_params(1), 1)

    def fill_memory():
        used = int(real_redis.info("memory")["used_memory"])
        real_redis.config_set("maxmemory", used - (256 << 10))
    if pieces == "several":
        original = real_redis.evalsha

        def fill_memory_first(*args):
            fill_memory()  # the upload landed, then memory ran out
            return original(*args)
        monkeypatch.setattr(real_redis, "evalsha", fill_memory_first)
    else:
        lossy_pipelines(monkeypatch, real_redis, losses=0, before=fill_memory)
    with pytest.raises(PublishBackpressure):
        pub.publish(big_params(1, seed=1), 2)
    monkeypatch.undo()
    real_redis.config_set("maxmemory", 128 << 20)
    assert real_redis.hget(KEYS.meta, "version") == b"1" and not real_redis.exists(KEYS.blob(2))
    assert real_redis.keys(f"{KEYS.tag}:staging:*") == []
    got, info = ParameterClient(real_redis, RUN, ParameterClientConfig()).fetch()
    assert info.version == 1
    np.testing.assert_array_equal(got["actor/w"], big_params(1)["actor/w"])


def test_restart_mid_upload_is_uploaded_again(redis_server):
    client = connect(redis_server.url)
    pub = ParameterPublisher(client, RUN, PublisherConfig(write_piece_bytes=1 << 18))
    original = client.setrange
    calls = []

    def restart_after_second_piece(*args):
        calls.append(args)
        if len(calls) == 2:  # the key the SET made is gone, as after a restart without persistence
            client.delete(*client.keys(f"{KEYS.tag}:staging:*"))
        return original(*args)  # ... and SETRANGE recreates it zero-filled, without the TTL
    client.setrange = restart_after_second_piece
    assert pub.publish(big_params(1), 1) == 1
    assert len(calls) == 2 * 4
    got, info = ParameterClient(client, RUN, ParameterClientConfig()).fetch()
    np.testing.assert_array_equal(got["actor/w"], big_params(1)["actor/w"])
    client.close()


def test_float16_blobs_in_pieces_and_a_version_lag_on_a_real_server(real_redis):
    """8 MB of float32 weights travel as 4 MB of float16 (in 1 MiB pieces) and load as float32;
    with min_version_lag 2 an agent skips one version, then downloads, and a claimed version
    (``at_least``) is downloaded at once."""
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig(dtype="float16"))
    client = ParameterClient(real_redis, RUN, ParameterClientConfig(min_version_lag=2))
    params = big_params(8)
    assert pub.publish(params, 1) == 1
    assert int(real_redis.hget(KEYS.meta, "nbytes")) < 4.01 * (1 << 20)
    got, info = client.fetch()
    assert info.version == 1 and got["actor/w"].dtype == np.float32
    np.testing.assert_array_equal(got["actor/w"], params["actor/w"].astype(np.float16).astype(np.float32))
    pub.publish(big_params(8, seed=1), 2)
    assert client.fetch()[0] is None and client.info.version == 1
    pub.publish(big_params(8, seed=2), 3)
    got, info = client.fetch()
    assert info.version == 3
    np.testing.assert_array_equal(got["actor/b"], big_params(8, seed=2)["actor/b"].astype(np.float16).astype(np.float32))
    pub.publish(big_params(8, seed=3), 4)
    assert client.fetch(at_least=4)[1].version == 4
