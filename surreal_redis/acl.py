"""Redis ACL users of one run (``surreal-redis acl``): agent, eval and learner.

What Redis 7.0 enforces, and what it cannot (measured on 7.0.15; tests/integration/test_acl.py):

- Commands run by a script are checked against the caller's own permissions. A script therefore
  never grants an agent anything: whatever ``insert.lua`` does as the agent, the agent can do by
  hand, with any arguments. ACLs restrict commands and key names, never arguments.
- ``+evalsha|<sha>`` (a first-argument rule) limits a user to the scripts with those SHA1s: the
  agent may run ``insert.lua`` and ``claim.lua`` and nothing else, whoever loaded what. It may not
  load scripts (no EVAL, SCRIPT LOAD, FUNCTION): the learner loads them for it.

Agent user: its two scripts, and each command they and the agent run allowed on its own keys
only (Redis 7 ACL selectors: ``_AGENT_SELECTORS``), SUBSCRIBE to the notify and ``reads``
channels, PING, WAIT, TIME and :data:`CLUSTER_CLIENT_COMMANDS`. Nothing else: no eval results, no key
listing, no other run. Eval user: XADD on ``evals`` (the only writer of eval results), the
agent's reads of parameters, control and config, PING, the cluster commands and the notify channel.
Learner user: every key and channel of the run; every command except the ``@dangerous`` ones (but
INFO, which its ``hub/*`` metrics read) and those that list or watch other runs' keys or
channels or drop or stop their scripts and functions (``_LEARNER_DENIED``).

On a Redis Cluster every node keeps its own users (ACLs are not replicated):
:func:`create_users` sets them on every node of the slot map; a node added later needs
``surreal-redis acl`` again. docs/trust-boundary.md lists what an agent can and cannot do.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Literal

import redis

from surreal_redis.connection import CONNECTION_ERRORS, RedisClient
from surreal_redis.embedded import require_redis_version
from surreal_redis.keys import PREFIX, RunKeys
from surreal_redis.redis_cluster import all_node_clients, is_cluster
from surreal_redis.scripts import script_source

log = logging.getLogger(__name__)

Role = Literal["agent", "eval", "learner"]
ROLES: tuple[Role, ...] = ("agent", "eval", "learner")

ACL_MIN_VERSION = (7, 0)  # ACL selectors, "(...)" in the rules below

# The scripts an agent may run (by SHA1 of their text).
AGENT_SCRIPTS = ("insert", "claim")

# Read-only access of agents and eval to parameters and run state (one selector each).
_READER_SELECTORS: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = (
    (("meta", "control", "config"), "%R~", ("hget", "hgetall", "hmget")),
    (("blob",), "%R~", ("getrange",)),
)
# Command groups of the agent user, each allowed on the key kinds next to it.
_AGENT_SELECTORS = (
    (("exp",), "%R~", ("xinfo|groups", "xlen", "xrange")),
    (("inbox",), "~", ("rpush", "llen")),
    (("pinned",), "~", ("sadd", "sismember")),
    (("seen",), "%R~", ("hget",)),  # insert.lua's door: a sender reads its own window (by its secret uuid)
    (("obs",), "~", ("setnx", "exists")),
    (("agents",), "~", ("hset", "hdel")),
    (("episodes_inbox",), "~", ("rpush",)),
    (("quota",), "~", ("hmget", "hincrby")),
) + _READER_SELECTORS
_EVAL_SELECTORS = ((("evals",), "~", ("xadd",)),) + _READER_SELECTORS
# What a RedisCluster client sends besides the commands it is asked to, none touching a key:
# redis-py reads CLUSTER SLOTS (the slot map) and COMMAND (key positions) when it connects;
# CLUSTER SHARDS is the newer slot map other clients read; ASKING precedes a command redirected
# during slot migration.
CLUSTER_CLIENT_COMMANDS = ("cluster|slots", "cluster|shards", "command", "asking")
_LEARNER_DENIED = ("@dangerous", "scan", "randomkey", "pubsub", "client|tracking", "cluster|getkeysinslot",
                   "cluster|countkeysinslot", "script|flush", "script|kill", "script|debug", "function", "fcall",
                   "fcall_ro")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown ACL role {role!r} (use one of {', '.join(ROLES)})")


def username(run: str, role: Role) -> str:
    """The ACL user name of ``role`` in ``run``: ``sr-<run>-<role>``."""
    _check_role(role)
    RunKeys(run)  # validates the run name
    return f"{PREFIX}-{run}-{role}"


def script_sha(name: str) -> str:
    """SHA1 of ``lua/<name>.lua`` as EVALSHA names it (what the learner's SCRIPT LOAD returns)."""
    return hashlib.sha1(script_source(name).encode()).hexdigest()


def acl_rules(run: str, role: Role, num_shards: int | None = None) -> list[str]:
    """The ACL SETUSER rules granting ``role`` its permissions in ``run`` (no password, not
    enabled: see :func:`create_users`). ``num_shards`` names each shard's keys exactly; without
    it the rules match any shard number. The agent's rules name its scripts by their SHA1, so
    they must be made again when a script changes. Raises ValueError for an unknown role or a
    bad run name.
    """
    _check_role(role)
    if num_shards is not None and num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    patterns = RunKeys(run).acl_patterns(num_shards)
    rules = ["resetkeys", "resetchannels", "-@all"] + [f"&{p}" for p in patterns["notify"]]
    if role != "eval":
        rules += [f"&{p}" for p in patterns["reads"]]
    if role == "learner":
        rules += [f"~{p}" for kind in ("run", "shards", "params") for p in patterns[kind]]
        return rules + ["+@all"] + [f"-{command}" for command in _LEARNER_DENIED] + ["+info"]
    rules += ["+ping", "+subscribe", "+unsubscribe"] + [f"+{c}" for c in CLUSTER_CLIENT_COMMANDS]
    if role == "eval":
        selectors = _EVAL_SELECTORS
    else:
        # Root permissions: the agent's scripts, whose KEYS are these keys; every other command
        # goes through one selector below.
        rules += [f"~{p}" for kind in ("inbox", "pinned", "seen", "obs", "meta", "quota") for p in patterns[kind]]
        rules += [f"+evalsha|{script_sha(name)}" for name in AGENT_SCRIPTS]
        rules.append("+wait")  # hub.sender.wait_replica_ms: keyless, it only blocks the caller
        rules.append("+time")  # insert.lua's DUP names its one pin by the time: keyless, read-only
        selectors = _AGENT_SELECTORS
    for kinds, access, commands in selectors:
        keys = " ".join(f"{access}{p}" for kind in kinds for p in patterns[kind])
        rules.append(f"({keys} {' '.join('+' + c for c in commands)})")
    return rules


def _set_users(node: RedisClient, run: str, names: Mapping[Role, str], passwords: Mapping[Role, str],
               num_shards: int | None, where: str) -> None:
    require_redis_version(node, ACL_MIN_VERSION, "surreal-redis acl", "ACL selectors", where)
    for role, name in names.items():
        node.execute_command("ACL", "SETUSER", name, "reset", "on", f">{passwords[role]}",
                             *acl_rules(run, role, num_shards))


def create_users(client: RedisClient, run: str, passwords: Mapping[Role, str],
                 num_shards: int | None = None, where: str = "the server") -> dict[Role, str]:
    """Create (or reset) the users of ``run``, enabled, with ``passwords`` (role -> password, one
    for each of :data:`ROLES`); returns ``{role: user name}``. ``client`` must be allowed ACL
    SETUSER (an administrator); a cluster client sets the users on every node of its slot map.
    Blocks for one round trip per user and node; Redis errors propagate. A server older than
    Redis 7.0 (no ACL selectors) raises :class:`~surreal_redis.embedded.RedisVersionError`
    naming its version (``where``: how the message names a standalone server), before any user
    is set. On a cluster, a node that cannot be reached or refuses is skipped and, once the
    others have their users, a RedisError names every such node.
    Raises ValueError naming a role whose password is missing or empty, or an unknown role.
    """
    unknown = sorted(set(passwords) - set(ROLES))
    if unknown:
        raise ValueError(f"passwords for unknown ACL roles {unknown} (roles: {', '.join(ROLES)})")
    for role in ROLES:
        if not passwords.get(role):
            raise ValueError(f"the {role} password must not be empty")
    created = {role: username(run, role) for role in ROLES}
    if not is_cluster(client):
        _set_users(client, run, created, passwords, num_shards, where)
        log.info("ACL users %s created for run %r", ", ".join(created.values()), run)
        return created
    nodes, failed = all_node_clients(client), []
    for node in nodes:
        address = "{host}:{port}".format(**node.get_connection_kwargs())
        try:
            _set_users(node, run, created, passwords, num_shards, address)
        except (*CONNECTION_ERRORS, redis.ResponseError) as exc:
            failed.append(f"{address} ({exc})")
    if failed:  # after setting the others: a node that is down gets them when it is back
        raise redis.RedisError(f"ACL users of run {run!r} not set on {len(failed)} of {len(nodes)} cluster nodes: "
                               f"{'; '.join(failed)}; run `surreal-redis acl` again once they are up")
    log.info("ACL users %s created for run %r on all %d cluster nodes", ", ".join(created.values()), run, len(nodes))
    return created
