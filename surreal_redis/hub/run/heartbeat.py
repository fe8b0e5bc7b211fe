"""Agent liveness: one JSON entry per agent in the run's ``agents`` hash. Hash fields cannot expire
on Redis 7.0 (HEXPIRE is 7.4+), so an entry whose ``ts`` (the writing host's unix seconds: clocks
must agree to well within ``ttl_s``) is older than ``ttl_s`` is stale: :func:`read_agents` marks
it, the learner deletes it (:func:`prune_stale`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass

from surreal_redis.connection import RedisClient, as_bytes, as_text
from surreal_redis.keys import RunKeys

log = logging.getLogger(__name__)

_FIELDS = ("pid", "host", "steps", "episodes", "param_version", "ts")


@dataclass(frozen=True)
class AgentStatus:
    """One agent's last heartbeat. ``ts`` is its unix time in seconds, ``age_s`` the seconds since
    then when it was read, ``stale`` whether that age exceeded the TTL. ``idle_s`` of ``running_s``
    seconds of its env loop were spent waiting (on claims, on backpressure). ``param_rejections``
    and ``chunks_dropped`` count per process; ``claimed``: env steps claimed and not sent yet. The
    fields with defaults are 0 in heartbeats that do not report them."""

    agent_id: str
    pid: int
    host: str
    steps: int
    episodes: int
    param_version: int
    ts: float
    age_s: float
    stale: bool
    idle_s: float = 0.0
    running_s: float = 0.0
    param_rejections: int = 0
    chunks_dropped: int = 0
    claimed: int = 0

    @property
    def idle_fraction(self) -> float | None:
        """``idle_s / running_s`` (None before the loop ran)."""
        return self.idle_s / self.running_s if self.running_s > 0 else None


def _agent_field(agent_id: int | str) -> str:
    ok = isinstance(agent_id, str) or (isinstance(agent_id, int) and not isinstance(agent_id, bool) and agent_id >= 0)
    if not ok or not 1 <= len(str(agent_id)) <= 100:
        raise ValueError(f"agent_id must be an integer >= 0 or a 1-100 character string, got {agent_id!r}")
    return str(agent_id)


def _check_ttl(ttl_s: float) -> float:
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s!r}")
    return float(ttl_s)


class Heartbeat:
    """Writes one agent's entry in ``sr:{run}:agents``.

    ``beat()`` is cheap to call every env step: it writes (one HSET round trip) only when a third
    of ``ttl_s`` has passed since the last write, so a live agent is never seen as stale.
    """

    def __init__(self, client: RedisClient, run: str, agent_id: int | str, ttl_s: float) -> None:
        self._client = client
        self._key = RunKeys(run).agents
        self._field = _agent_field(agent_id)
        self._interval = _check_ttl(ttl_s) / 3
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._last_write: float | None = None

    def beat(self, steps: int, episodes: int, param_version: int, force: bool = False, idle_s: float = 0.0,
             running_s: float = 0.0, param_rejections: int = 0, chunks_dropped: int = 0, claimed: int = 0) -> bool:
        """Record the agent's counters (see :class:`AgentStatus`; ``steps``: total env steps).
        Returns whether it wrote; blocks for one HSET when it does; Redis errors propagate."""
        if not (idle_s >= 0 and running_s >= 0):
            raise ValueError(f"idle_s and running_s must be >= 0 seconds, got {idle_s!r} and {running_s!r}")
        if claimed < 0:
            raise ValueError(f"claimed must be >= 0 env steps, got {claimed!r}")
        now = time.monotonic()
        if not force and self._last_write is not None and now - self._last_write < self._interval:
            return False
        entry = {"pid": self._pid, "host": self._host, "steps": int(steps), "episodes": int(episodes),
                 "param_version": int(param_version), "ts": time.time(), "idle_s": round(float(idle_s), 3),
                 "running_s": round(float(running_s), 3), "param_rejections": int(param_rejections),
                 "chunks_dropped": int(chunks_dropped), "claimed": int(claimed)}
        self._client.hset(self._key, self._field, json.dumps(entry, separators=(",", ":")))
        self._last_write = now
        return True

    def remove(self) -> None:
        """Delete this agent's entry (clean shutdown). One HDEL."""
        self._client.hdel(self._key, self._field)
        self._last_write = None


def _parse(agent_id: str, raw: bytes | str, now: float, ttl_s: float) -> AgentStatus:
    entry = json.loads(raw)
    if not isinstance(entry, dict) or any(name not in entry for name in _FIELDS):
        raise ValueError(f"missing fields (need {', '.join(_FIELDS)})")
    ts = float(entry["ts"])
    return AgentStatus(agent_id=agent_id, pid=int(entry["pid"]), host=str(entry["host"]),
                       steps=int(entry["steps"]), episodes=int(entry["episodes"]),
                       param_version=int(entry["param_version"]), ts=ts, age_s=now - ts, stale=now - ts > ttl_s,
                       idle_s=float(entry.get("idle_s", 0.0)), running_s=float(entry.get("running_s", 0.0)),
                       param_rejections=int(entry.get("param_rejections", 0)),
                       chunks_dropped=int(entry.get("chunks_dropped", 0)), claimed=int(entry.get("claimed", 0)))


def read_agents(client: RedisClient, run: str, ttl_s: float, include_stale: bool = True) -> list[AgentStatus]:
    """All agents' heartbeats, sorted by agent id, stale ones marked (or left out when
    ``include_stale`` is false). One HGETALL. An unreadable entry is logged and left out."""
    ttl_s = _check_ttl(ttl_s)
    now = time.time()
    agents = []
    for field, raw in client.hgetall(RunKeys(run).agents).items():
        agent_id = as_text(field, errors="replace")
        try:
            status = _parse(agent_id, raw, now, ttl_s)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring malformed heartbeat of agent %r: %s", agent_id, exc)
            continue
        if include_stale or not status.stale:
            agents.append(status)
    return sorted(agents, key=lambda s: (len(s.agent_id), s.agent_id))


def prune_stale(client: RedisClient, run: str, ttl_s: float) -> list[str]:
    """Delete the entries of agents silent for more than ``ttl_s`` seconds (and unreadable ones)
    and return their ids. One HGETALL plus one HDEL, no transaction: an agent that beats in
    between loses its entry until its next beat, harmlessly."""
    ttl_s = _check_ttl(ttl_s)
    key = RunKeys(run).agents
    now = time.time()
    doomed: list[bytes] = []
    for field, raw in client.hgetall(key).items():
        try:
            stale = _parse(as_text(field, errors="replace"), raw, now, ttl_s).stale
        except (ValueError, TypeError) as exc:
            log.warning("pruning malformed heartbeat of agent %r: %s", field, exc)
            stale = True
        if stale:
            doomed.append(as_bytes(field))
    if doomed:
        client.hdel(key, *doomed)
        log.info("pruned %d stale agent heartbeat(s): %s", len(doomed), b", ".join(doomed).decode(errors="replace"))
    return [field.decode(errors="replace") for field in doomed]
