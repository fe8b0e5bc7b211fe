"""A byte of the live parameter blob changed in Redis (SETRANGE, as a bad write or a bit flip
would): agents keep the parameters they hold and count the rejection, and the learner's fix,
republishing above the damaged version, gets them the parameters again."""

import numpy as np
import pytest

from surreal_redis.connection import connect
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)
from surreal_redis.keys import RunKeys

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "tampered"
PARAMS = RunKeys(RUN).params


def params_of(version: int) -> dict[str, np.ndarray]:
    return {"w": np.full((64, 32), float(version), np.float32), "b": np.arange(32, dtype=np.float32) + version}


def test_a_tampered_live_blob_is_rejected_until_the_learner_republishes_above_it(redis_server, real_redis):
    publisher = ParameterPublisher(real_redis, RUN, PublisherConfig())
    agent = connect(redis_server.url)
    client = ParameterClient(agent, RUN, ParameterClientConfig(reject_backoff_s=30.0, reject_backoff_cap_s=60.0))
    assert publisher.publish(params_of(1), iteration=10) == 1
    params, info = client.fetch()
    assert info.version == 1 and params["w"][0, 0] == 1.0

    assert publisher.publish(params_of(2), iteration=20) == 2
    blob = PARAMS.blob(2)
    size = real_redis.strlen(blob)
    offset = size - 5  # inside the last array's values, past every header
    byte = real_redis.getrange(blob, offset, offset)[0]
    real_redis.setrange(blob, offset, bytes([byte ^ 0x40]))
    assert real_redis.strlen(blob) == size

    params, info = client.fetch()
    assert params is None and info.version == 1 and client.rejections == 1  # keeps v1
    params, info = client.fetch()  # within the rejection's backoff: not downloaded again
    assert params is None and client.rejections == 1
    params, info = client.fetch(force=True)  # downloaded again: still damaged
    assert params is None and info.version == 1 and client.rejections == 2
    assert client.fetch_info().version == 2  # the damaged version stays live until replaced

    version = publisher.republish(params_of(2), iteration=20, above=2)
    assert version == 3 and real_redis.get(PARAMS.blob(3)) != real_redis.get(blob)
    params, info = client.fetch()  # a newer version is fetched at once, whatever the backoff
    assert info.version == 3 and info.iteration == 20 and client.rejections == 2
    np.testing.assert_array_equal(params["w"], params_of(2)["w"])
    np.testing.assert_array_equal(params["b"], params_of(2)["b"])
    assert publisher.publish(params_of(4), iteration=30) == 4  # and the sequence goes on above it
    assert client.fetch()[1].version == 4
    agent.close()
