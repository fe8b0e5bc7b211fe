"""Redis ACL users of one run (``surreal-redis acl``): an agent user and a learner user.

Agent user (Redis 7 ACL selectors, so each command is allowed on its own keys only):

- EVALSHA of a loaded script whose KEYS are the run's shard keys (the insert script). Agents
  never get EVAL, SCRIPT LOAD or FUNCTION: the learner loads ``insert.lua`` (the receiver does
  at start), and until it has, a sender answered NOSCRIPT backs off and retries.
- What ``insert.lua`` runs under the caller's permissions: XADD on ``exp``, ZADD on ``obsref``,
  GET/SET on ``seen:*``, SET/EXISTS on ``obs:*``; XINFO GROUPS, XLEN, XRANGE on ``exp``
  (backpressure).
- Parameters read-only: HGET/HGETALL/HMGET on ``meta``, GETRANGE on ``blob:*``, SUBSCRIBE to the
  notify channel; HGET/HGETALL/HMGET on ``control`` and ``config``.
- HSET/HDEL on ``agents`` (heartbeats), XADD on ``episodes``; PING.

Redis cannot tell a command sent by ``insert.lua`` from the same command sent directly, so an
agent user can also XADD/ZADD/SET those shard keys itself (a malformed entry is dead-lettered by
the learner, a blob under the wrong digest fails verification); it cannot delete or overwrite a
stream with another type, read or write other runs' keys, write parameters, config or control,
or run administrative commands.

Learner user: every key and the notify channel of the run, every command except the
``@dangerous`` ones (FLUSHALL, CONFIG, KEYS, INFO, ...) and those that drop scripts or functions
of other runs (SCRIPT FLUSH, FUNCTION FLUSH/DELETE/RESTORE/LOAD).
"""

from __future__ import annotations

import logging
from typing import Literal

import redis

from surreal_redis.keys import PREFIX, RunKeys

log = logging.getLogger(__name__)

Role = Literal["agent", "learner"]
ROLES: tuple[Role, ...] = ("agent", "learner")

# command groups of the agent user, each allowed on the key kinds next to it (one selector each)
_AGENT_SELECTORS: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = (
    (("exp",), "~", ("xadd", "xinfo|groups", "xlen", "xrange")),
    (("obsref",), "~", ("zadd",)),
    (("seen",), "~", ("get", "set")),
    (("obs",), "~", ("set", "exists")),
    (("agents",), "~", ("hset", "hdel")),
    (("episodes",), "~", ("xadd",)),
    (("meta", "control", "config"), "%R~", ("hget", "hgetall", "hmget")),
    (("blob",), "%R~", ("getrange",)),
)
_LEARNER_DENIED = ("@dangerous", "script|flush", "function|flush", "function|delete", "function|restore",
                   "function|load")


def username(run: str, role: Role) -> str:
    """The ACL user name of ``role`` in ``run``: ``sr-<run>-<role>``."""
    if role not in ROLES:
        raise ValueError(f"unknown ACL role {role!r} (use 'agent' or 'learner')")
    RunKeys(run)  # validates the run name
    return f"{PREFIX}-{run}-{role}"


def acl_rules(run: str, role: Role, num_shards: int | None = None) -> list[str]:
    """The ACL SETUSER rules granting ``role`` its permissions in ``run`` (no password, not
    enabled: see :func:`create_users`). ``num_shards`` names each shard's keys exactly; without
    it the rules match any shard number. Raises ValueError for an unknown role or bad run name.
    """
    if role not in ROLES:
        raise ValueError(f"unknown ACL role {role!r} (use 'agent' or 'learner')")
    if num_shards is not None and num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    patterns = RunKeys(run).acl_patterns(num_shards)
    rules = ["resetkeys", "resetchannels", "-@all"] + [f"&{p}" for p in patterns["notify"]]
    if role == "learner":
        rules += [f"~{p}" for kind in ("run", "shards", "params") for p in patterns[kind]]
        return rules + ["+@all"] + [f"-{command}" for command in _LEARNER_DENIED]
    # Root permissions: the scripts (their KEYS must be the shard keys insert.lua declares), pings
    # and parameter notifications; every other command goes through one selector below.
    rules += [f"~{p}" for kind in ("exp", "obsref", "seen", "obs") for p in patterns[kind]]
    rules += ["+evalsha", "+ping", "+subscribe", "+unsubscribe"]
    for kinds, access, commands in _AGENT_SELECTORS:
        keys = " ".join(f"{access}{p}" for kind in kinds for p in patterns[kind])
        rules.append(f"({keys} {' '.join('+' + c for c in commands)})")
    return rules


def create_users(client: redis.Redis, run: str, agent_password: str, learner_password: str,
                 num_shards: int | None = None) -> dict[str, str]:
    """Create (or reset) the agent and learner users of ``run``, enabled, with these passwords.

    ``client`` must be allowed ACL SETUSER (an administrator). Returns ``{role: user name}``.
    Blocks for one round trip per user; Redis errors propagate (ACL needs Redis >= 7 for the
    agent's selectors).
    """
    passwords = {"agent": agent_password, "learner": learner_password}
    created = {}
    for role in ROLES:
        if not passwords[role]:
            raise ValueError(f"the {role} password must not be empty")
        name = username(run, role)
        client.execute_command("ACL", "SETUSER", name, "reset", "on", f">{passwords[role]}",
                               *acl_rules(run, role, num_shards))
        created[role] = name
    log.info("ACL users %s created for run %r", ", ".join(created.values()), run)
    return created
