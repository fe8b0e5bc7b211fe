"""Parameter broadcast: the learner publishes versioned blobs, agents pull only what changed.

- :mod:`.wire`: the keys (``blob:<v>``, ``meta``), the codec, the digest, float16 on the wire.
- :mod:`.publisher`: :class:`ParameterPublisher`, the learner's side (staging key, the atomic
  ``lua/publish.lua`` swap, retries of each idempotent step, :meth:`~ParameterPublisher.republish`).
- :mod:`.client`: :class:`ParameterClient`, the agents' side (poll, piecewise download, verify,
  back off from rejected blobs, read replicas).
"""

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
