"""Names the network settings accept, without torch (configs are validated in processes that never
build a network); :data:`surreal_redis.algos.networks.ACTIVATIONS` maps each to its module."""

from __future__ import annotations

ACTIVATION_NAMES = ("elu", "relu", "tanh")
