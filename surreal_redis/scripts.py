"""Lua scripts: loaded once per client (redis-py ``Script`` objects: EVALSHA, with a reload on
NOSCRIPT after ``SCRIPT FLUSH`` or a server restart), and their error replies mapped to
exceptions."""

from __future__ import annotations

from functools import cache

import redis
from redis.commands.core import Script

from surreal_redis.connection import OUTAGE_ERRORS, RedisClient
from surreal_redis.resources import resource_dir


class ScriptError(RuntimeError):
    """A script refused its input; the message is the script's own error reply."""


@cache
def script_source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    path = resource_dir("lua") / f"{name}.lua"
    if not path.exists():
        raise FileNotFoundError(f"Lua script {name!r} not found at {path}")
    return path.read_text(encoding="utf-8")


class Scripts:
    """The project's Lua scripts registered on one client: ``scripts.get("insert")(keys, args)``."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self._registered: dict[str, Script] = {}

    def get(self, name: str) -> Script:
        script = self._registered.get(name)
        if script is None:
            script = self._registered[name] = self.client.register_script(script_source(name))
        return script

    def call(self, name: str, keys: list, args: list, client: redis.Redis | None = None):
        """Run script ``name``; a Redis error reply that the script raised becomes ScriptError,
        while OOM, connection errors and outages (a cluster slot without a primary during a
        failover: CLUSTERDOWN, TRYAGAIN) propagate unchanged for the caller's backoff."""
        try:
            return self.get(name)(keys=keys, args=args, client=client or self.client)
        except (redis.exceptions.OutOfMemoryError, redis.exceptions.NoScriptError, *OUTAGE_ERRORS):
            raise  # the caller backs off (OOM, outage) or redis-py has already retried the load (NOSCRIPT)
        except redis.ResponseError as exc:
            raise ScriptError(f"{name}.lua: {exc}") from exc
