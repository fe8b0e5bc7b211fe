"""fakeredis as the unit tests use it, with the ``redis.sha1hex`` the Lua scripts need (every real
Redis has it, fakeredis does not)."""

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
