"""Names the network settings accept, without torch (configs are validated in processes that never
build a network); :data:`surreal_redis.algos.networks.ACTIVATIONS` maps each to its module."""

from __future__ import annotations

ACTIVATION_NAMES = ("elu", "relu", "tanh")  # each config's activation Literal names these (test_networks)

NATURE_MIN_SIZE = 36
"""Smallest height and width the Nature CNN's 8/4, 4/2, 3/1 convolutions accept (smaller images
get a small CNN of padded 3x3 convolutions)."""
