import logging
import time

import numpy as np
import pytest

from surreal_redis.connection import RedisSettings, connect
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
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


def test_chunked_fetch_of_multi_megabyte_blob(real_redis):
    # 6 MB written as 1 MiB APPEND pieces, read as 512 KiB GETRANGEs, 3 per round trip
    pub = ParameterPublisher(real_redis, RUN, PublisherConfig(write_piece_bytes=1 << 20, chunk_bytes=1 << 19))
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
