"""The run's lease: which launch owns a run, held in Redis the way a lock service holds a lock.

A launch takes ``sr:{run}:lease`` with one ``SET NX PX`` (:meth:`RunLease.acquire`) before it moves
or deletes anything, renews it every third of its time to live from a thread of its own
(:class:`LeaseKeeper`) and deletes it at its exit. A second launch of the same run on the same
Redis finds it held and is refused (:class:`LeaseHeld`), whatever the learner is doing: starting,
being restarted after a crash, or reporting rarely. A launcher killed with SIGKILL leaves its
lease to expire: :data:`LEASE_TTL_S` later a new launch may take the run over.

The lease's value is the owner's random token and who it is (pid, host, experiment folder) as
JSON; renewing and releasing compare it first (``lua/lease.lua``, one key, so it works on a Redis
Cluster), so only the owner renews or releases its lease.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from typing import Any

import redis

from surreal_redis.connection import RedisClient, as_text
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

LEASE_TTL_S = 15.0  # a dead launcher's lease is free this long after its last renewal
RENEWED = 1
TAKEN_AGAIN = 2  # renewed after it had expired (Redis away or emptied) and nobody else took it
HELD_BY_ANOTHER = 0


class LeaseHeld(RuntimeError):
    """The run's lease is held by another launch; ``holder`` is its value (pid, host, folder) as a
    dict, ``ttl_s`` how long it still runs if nobody renews it."""

    def __init__(self, run: str, holder: dict[str, Any], ttl_s: float) -> None:
        self.run, self.holder, self.ttl_s = run, holder, ttl_s
        super().__init__(f"run {run!r} is held by {describe(holder)} (lease expires in {ttl_s:.0f}s unless renewed)")


def describe(holder: dict[str, Any]) -> str:
    """``its launch (pid P on host H, folder F)``, from a lease value (keys missing: left out)."""
    parts = [f"pid {holder['pid']}" if "pid" in holder else "",
             f"on host {holder['host']}" if "host" in holder else "",
             f"folder {holder['folder']}" if "folder" in holder else ""]
    said = " ".join(part for part in parts[:2] if part)
    said = ", ".join(part for part in (said, parts[2]) if part)
    return f"its launch ({said})" if said else "another launch"


class RunLease:
    """The lease of ``run`` for one owner: ``folder`` names the owner in the value a refused launch
    shows. ``ttl_s`` > 0 seconds (:data:`LEASE_TTL_S`). Each call is one round trip."""

    def __init__(self, client: RedisClient, run: str, folder: str = "", ttl_s: float = LEASE_TTL_S) -> None:
        if not 0.001 <= ttl_s <= 3600:
            raise ValueError(f"lease ttl_s must be in 0.001..3600 seconds, got {ttl_s!r}")
        self.client, self.run, self.ttl_s = client, run, ttl_s
        self.key = RunKeys(run).lease
        self.owner = {"token": secrets.token_hex(16), "pid": os.getpid(), "host": socket.gethostname(),
                      "folder": folder}
        self.value = json.dumps(self.owner, sort_keys=True)
        self.scripts = Scripts(client)

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))

    def acquire(self) -> None:
        """Take the lease if nobody holds it (SET NX PX); raises :class:`LeaseHeld` naming the
        holder when another owner does. Taking a lease this owner already holds renews it.
        Redis errors propagate."""
        for _ in range(3):  # the holder's lease may expire between the SET and the GET
            if self.client.set(self.key, self.value, nx=True, px=self.ttl_ms):
                return
            with self.client.pipeline(transaction=False) as pipe:
                pipe.get(self.key)
                pipe.pttl(self.key)
                raw, pttl = pipe.execute()
            if raw is None:
                continue
            if as_text(raw) == self.value:
                self.renew()
                return
            raise LeaseHeld(self.run, holder_of(raw), max(0, int(pttl)) / 1000)
        raise LeaseHeld(self.run, {}, self.ttl_s)  # taken and freed three times over: someone is racing us

    def renew(self) -> int:
        """Extend this owner's lease to ``ttl_s`` from now: :data:`RENEWED`, :data:`TAKEN_AGAIN`
        (it had expired and nobody took it), or :data:`HELD_BY_ANOTHER` (lost: nothing written).
        Outage and OOM errors propagate (a renewal under OOM still works: PEXPIRE needs no memory)."""
        return int(self.scripts.call("lease", [self.key], [self.value, "RENEW", self.ttl_ms]))

    def release(self) -> bool:
        """Delete the lease if this owner holds it; returns whether it did (never another's)."""
        return int(self.scripts.call("lease", [self.key], [self.value, "RELEASE", 0])) == RENEWED

    def holder(self) -> dict[str, Any]:
        """The current holder's value as a dict (empty when nobody holds the lease)."""
        raw = self.client.get(self.key)
        return holder_of(raw) if raw is not None else {}


def holder_of(raw: bytes | str) -> dict[str, Any]:
    """A lease value as a dict; a value that is not our JSON (written by hand) as ``{"value": ...}``."""
    try:
        holder = json.loads(raw)
    except ValueError:
        holder = None
    return holder if isinstance(holder, dict) else {"value": as_text(raw)[:100]}


class LeaseKeeper:
    """Renews ``lease`` every third of its time to live on a daemon thread until :meth:`stop`.
    A renewal that fails for an outage is retried at the next beat (logged once per outage); a
    lease found held by another owner sets :attr:`lost` (logged as an error) and ends the thread:
    the launcher then stops its run without writing to the run's keys."""

    def __init__(self, lease: RunLease) -> None:
        self.lease = lease
        self.every_s = lease.ttl_s / 3
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-lease", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        """End the renewals (waits for the thread, at most one round trip), then release the
        lease if ``release`` and it was not lost (best effort: an error is logged, and the lease
        expires after its TTL anyway)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if release and not self.lost.is_set():
            try:
                self.lease.release()
            except (redis.RedisError, OSError) as exc:
                log.warning("could not release the run's lease (%s); it expires in %.0fs", exc, self.lease.ttl_s)

    def _loop(self) -> None:
        failing = False
        while not self._stop.wait(self.every_s):
            try:
                answer = self.lease.renew()
            except (redis.RedisError, OSError, ScriptError) as exc:  # outages, OOM: the next beat retries
                if not failing:
                    log.warning("could not renew the run's lease (%s); retrying every %.1fs", exc, self.every_s)
                failing = True
                continue
            if failing:
                log.info("the run's lease is renewed again")
                failing = False
            if answer == TAKEN_AGAIN:
                log.warning("the run's lease had expired (Redis away or emptied for over %.0fs); taken again",
                            self.lease.ttl_s)
            elif answer == HELD_BY_ANOTHER:
                holder = self.lease.holder()
                log.error("the run's lease expired and %s took the run over; stopping this launch",
                          describe(holder))
                self.lost.set()
                return
