"""The run's ACL users on a test's redis-server, each logged in as its own client."""

from __future__ import annotations

import redis

from surreal_redis.acl import create_users, username

PASSWORDS = {"agent": "agent-pw", "eval": "eval-pw", "learner": "learner-pw"}


def acl_clients(server, admin: redis.Redis, run: str, num_shards: int = 1) -> dict[str, redis.Redis]:
    """Create ``run``'s users (:func:`surreal_redis.acl.create_users`) on ``server`` (a fixture's
    server listening on ``socket_path``) through ``admin``, and return a client logged in as each
    role: ``agent``, ``eval``, ``learner``."""
    create_users(admin, run, PASSWORDS, num_shards=num_shards)
    return {role: redis.Redis(unix_socket_path=str(server.socket_path), username=username(run, role),
                              password=password) for role, password in PASSWORDS.items()}
