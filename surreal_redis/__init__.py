"""surreal-redis: a Redis-backed experience and parameter hub for distributed RL."""

__version__ = "0.1.0"
