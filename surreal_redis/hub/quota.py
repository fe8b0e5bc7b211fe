"""Lockstep production for on-policy learning: the learner grants the env steps its next update
needs, per parameter version; agents claim them before producing, and wait once they are used up.

Synchronous PPO wastes nothing because every step it collects is used by the next update. Across
processes the same holds if agents produce only what the learner will use: after publishing
version v the learner grants ``steps_per_update`` (less what it already holds) for v; an agent
claims one flush (``flush_steps`` x its envs) at a time with ``lua/claim.lua``, which checks the
claim against the live version atomically. An agent acting with an old version is told to load
the new one first (STALE); when v's quota is spent it waits (WAIT) and leaves the CPU to the
learner. Claims are whole flushes, so a version's production overshoots its grant by less than
one claim per agent; the overshoot is used by the next update, one version old.

The quota hash sits in the parameter slot (``{run.p}``) beside ``meta``, so the check and the
decrement are one script on one slot (Redis Cluster too)."""

from __future__ import annotations

from typing import Literal, NamedTuple

import redis

from surreal_redis.keys import ParamKeys
from surreal_redis.scripts import Scripts


class Claim(NamedTuple):
    """The answer to a claim: ``status`` OK / STALE / WAIT (see ``lua/claim.lua``), the env
    steps granted (0 unless OK) and the live parameter version."""

    status: Literal["OK", "STALE", "WAIT"]
    granted: int
    live_version: int


class ProductionQuota:
    """The quota of one run. Learner: :meth:`grant`; agents: :meth:`claim`. Each call is one
    round trip and does not block otherwise."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.keys = ParamKeys(run)
        self._scripts = Scripts(client)

    def grant(self, version: int, steps: int) -> None:
        """Let agents acting with ``version`` produce ``steps`` env steps (replaces any earlier
        grant: call it after publishing ``version``, or again to top up a stalled one)."""
        if version < 0 or steps < 0:
            raise ValueError(f"grant needs version >= 0 and steps >= 0, got version={version} steps={steps}")
        self.client.hset(self.keys.quota, mapping={"version": version, "left": steps})

    def left(self) -> tuple[int, int] | None:
        """(version, steps left) of the current grant (left < 0: overshoot), or None."""
        version, left = self.client.hmget(self.keys.quota, ["version", "left"])
        return None if version is None else (int(version), int(left or 0))

    def claim(self, version: int, steps: int) -> Claim:
        """Claim ``steps`` env steps for parameter ``version`` (see :class:`Claim`)."""
        status, granted, live = self._scripts.call("claim", [self.keys.meta, self.keys.quota], [version, steps])
        return Claim(status.decode() if isinstance(status, bytes) else status, int(granted), int(live))

    def load_script(self) -> None:
        """Load ``claim.lua`` for agents whose ACL user may run scripts but not load them."""
        self.client.script_load(self._scripts.get("claim").script)
