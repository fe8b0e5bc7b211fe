"""Parameter broadcast: the learner publishes versioned blobs (:mod:`.publisher`), agents pull
only what changed (:mod:`.client`); :mod:`.wire` is the format between them."""

from surreal_redis.hub.params.client import ParameterClient, ParameterClientConfig, connect_replicas
from surreal_redis.hub.params.publisher import ParameterPublisher, PublishBackpressure, PublisherConfig
from surreal_redis.hub.params.wire import (
    ParamFetchError,
    ParamInfo,
    blob_digest,
    from_wire,
    param_spec,
    to_wire,
)

__all__ = [
    "ParamFetchError",
    "ParamInfo",
    "ParameterClient",
    "ParameterClientConfig",
    "ParameterPublisher",
    "PublishBackpressure",
    "PublisherConfig",
    "blob_digest",
    "connect_replicas",
    "from_wire",
    "param_spec",
    "to_wire",
]
