"""The Redis data plane: experience sender/receiver, eviction, parameters, heartbeats."""
