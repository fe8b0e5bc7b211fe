"""Lua scripts: run by SHA1 (EVALSHA), loaded on NOSCRIPT (a new server, ``SCRIPT FLUSH``, a
restart) on the server that owns the call's keys, and their error replies mapped to exceptions."""

from __future__ import annotations

from functools import cache

import redis
from redis.commands.core import Script

from surreal_redis.connection import CONNECTION_ERRORS, RedisClient
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.redis_cluster import node_client, refresh_topology
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

    def load(self, name: str, key: str | bytes | None = None) -> None:
        """SCRIPT LOAD ``name`` on the server owning ``key``, or with no key where the client sends
        keyless commands (a cluster client: every primary, which fails while one is down). One
        round trip. A connection error propagates after a cluster's slot map is refreshed."""
        source = self.get(name).script
        try:
            (self.client if key is None else node_client(self.client, key)).script_load(source)
        except CONNECTION_ERRORS as exc:
            refresh_topology(self.client, exc)
            raise

    def sha(self, name: str) -> str:
        """The SHA1 that runs ``name`` (EVALSHA), as in a pipeline."""
        return self.get(name).sha

    def checked(self, name: str, reply):
        """A reply of ``name`` that a pipeline handed back unraised: an error reply raised as
        :meth:`call` raises it (NOSCRIPT, OOM and outage errors unchanged, others as
        ScriptError), any other reply returned."""
        if isinstance(reply, (redis.exceptions.OutOfMemoryError, redis.exceptions.NoScriptError, *OUTAGE_ERRORS)):
            raise reply
        if isinstance(reply, redis.ResponseError):
            raise ScriptError(f"{name}.lua: {reply}") from reply
        return reply

    def call(self, name: str, keys: list, args: list):
        """Run script ``name``; a Redis error reply that the script raised becomes ScriptError,
        while OOM and outage errors (CLUSTERDOWN, TRYAGAIN too) propagate unchanged.

        On NOSCRIPT the script is loaded on the node of ``keys[0]`` only and run again: redis-py's
        ``Script`` loads it on every primary, so one dead primary would fail every shard's calls."""
        sha = self.get(name).sha
        try:
            try:
                return self.client.evalsha(sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                self.load(name, keys[0] if keys else None)
                return self.client.evalsha(sha, len(keys), *keys, *args)
        except (redis.exceptions.OutOfMemoryError, redis.exceptions.NoScriptError, *OUTAGE_ERRORS):
            raise  # the caller backs off (OOM, outage); NOSCRIPT right after a load: flushed again
        except redis.ResponseError as exc:
            raise ScriptError(f"{name}.lua: {exc}") from exc
