"""fakeredis as the unit tests use it: the Lua scripts need ``redis.sha1hex``, which every real
Redis (2.6 and newer) gives scripts and fakeredis does not; :func:`fake_redis` adds it."""

from __future__ import annotations

import hashlib
from typing import Any


def fake_redis(decode_responses: bool = False) -> Any:
    """A ``fakeredis.FakeRedis`` on its own server, whose scripts have ``redis.sha1hex``."""
    import fakeredis

    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server, decode_responses=decode_responses)
    client.eval("return 1", 0)  # makes the server's Lua runtime and its redis table
    # a private attribute fakeredis sets on the first eval and does not declare in its types
    runtime = server._lua_runtime  # type: ignore[attr-defined]
    runtime.globals().redis.sha1hex = lambda value: hashlib.sha1(value).hexdigest().encode()
    return client
