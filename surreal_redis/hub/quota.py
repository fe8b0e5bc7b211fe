"""Lockstep production for on-policy learning: the learner grants the env steps its next update
needs, per parameter version; agents claim them before producing, and wait once they are used up.

The protocol (grants, claims of one flush, OK / STALE / WAIT) is told in docs/concepts.md
(On-policy production). Claims are whole flushes, so a version's production overshoots its grant
by less than one claim per agent; the overshoot is used by the next update, one version old.
The quota hash sits beside ``meta`` in the parameter slot, so check and decrement are one script.

Waiting agents listen on the ``notify`` channel: ``publish.lua`` announces each version there
(payload: the version), :meth:`ProductionQuota.grant` each grant (``grant:<version>:<steps>``,
maybe after its publish). Either means "claim again"; agents also claim again every couple of
seconds in case a message was lost (a reconnect)."""

from __future__ import annotations

import logging
import time
from typing import Literal, NamedTuple

import redis

from surreal_redis.connection import RedisClient
from surreal_redis.hub.channel import Subscription
from surreal_redis.keys import ParamKeys
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)


ClaimStatus = Literal["OK", "STALE", "WAIT"]
_CLAIM_STATUSES: dict[str, ClaimStatus] = {"OK": "OK", "STALE": "STALE", "WAIT": "WAIT"}


class Claim(NamedTuple):
    """The answer to a claim: ``status`` OK / STALE / WAIT (see ``lua/claim.lua``), the env
    steps granted (0 unless OK) and the live parameter version."""

    status: ClaimStatus
    granted: int
    live_version: int


class ClaimScriptMissing(RuntimeError):
    """``claim.lua`` is not on the server (a restart or SCRIPT FLUSH) and the caller's ACL user may
    not load it: wait for the learner to load it again (it does every ``learner.gc_every_s``)."""


class ProductionQuota:
    """The quota of one run. Learner: :meth:`grant`; agents: :meth:`claim`. Each call is one
    round trip and does not block otherwise."""

    def __init__(self, client: RedisClient, run: str) -> None:
        self.client = client
        self.keys = ParamKeys(run)
        self._scripts = Scripts(client)

    def grant(self, version: int, steps: int) -> None:
        """Let agents acting with ``version`` produce ``steps`` env steps (replacing any earlier
        grant), and tell waiting agents on the notify channel. One round trip (HSET, PUBLISH)."""
        if version < 0 or steps < 0:
            raise ValueError(f"grant needs version >= 0 and steps >= 0, got version={version} steps={steps}")
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.quota, mapping={"version": version, "left": steps})
        pipe.execute_command("PUBLISH", self.keys.notify, f"grant:{version}:{steps}")  # cluster pipelines refuse .publish
        pipe.execute()

    def left(self) -> tuple[int, int] | None:
        """(version, steps left) of the current grant (left < 0: overshoot), or None."""
        version, left = self.client.hmget(self.keys.quota, ["version", "left"])
        return None if version is None else (int(version), int(left or 0))

    def live_version(self) -> int:
        """The live parameter version (``meta``'s; 0 when none is published). One HGET."""
        return int(self.client.hget(self.keys.meta, "version") or 0)

    def claim(self, version: int, steps: int) -> Claim:
        """Claim ``steps`` env steps for parameter ``version`` (see :class:`Claim`). One round
        trip. Not idempotent: when a reply is lost, claiming again claims twice (the next update
        uses the overshoot). Raises :class:`ClaimScriptMissing` when the server lacks ``claim.lua``
        and this client may not load it, OOM and connection errors unchanged."""
        try:
            status, granted, live = self._scripts.call("claim", [self.keys.meta, self.keys.quota], [version, steps])
        except ScriptError as exc:
            if isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
                raise ClaimScriptMissing(f"claim.lua is not loaded and this user may not load it ({exc})") from exc
            raise
        text = status.decode() if isinstance(status, bytes) else str(status)
        if text not in _CLAIM_STATUSES:
            raise ScriptError(f"claim.lua replied status {text!r}, not one of {', '.join(_CLAIM_STATUSES)}")
        return Claim(_CLAIM_STATUSES[text], int(granted), int(live))

    def load_script(self) -> None:
        """Load ``claim.lua`` for agents, whose ACL user may not, on the server owning the quota
        only (on every primary, one down would fail it)."""
        self._scripts.load("claim", self.keys.quota)


def _granted_version(data: bytes | str) -> int:
    """The version of a notify message that grants steps (``grant:<version>:<steps>``, steps > 0);
    0 for any other message (a publish, a grant of nothing)."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    kind, version, steps = text.split(":") if text.count(":") == 2 else ("", "", "")
    if kind != "grant" or not (version.isdigit() and steps.isdigit()) or int(steps) == 0:
        return 0
    return int(version)


class QuotaNews:
    """An agent's ear on the notify channel while it waits for a claim: :meth:`drain` forgets the
    messages so far, :meth:`wait` blocks until a new one (a publish or a grant) or the timeout.
    Subscribes on first use, on its own connection; a connection error propagates and the next
    call subscribes again (:class:`~surreal_redis.hub.channel.Subscription`). Not thread-safe."""

    def __init__(self, client: RedisClient, run: str) -> None:
        self._subscription = Subscription(client, ParamKeys(run).notify)
        self.granted_version = 0
        """The highest version a grant of steps was heard for (drained messages included; 0: none):
        a stale agent may claim it at once instead of learning the live version from a claim."""

    def _heard(self, data: bytes) -> int:
        """Note a message's grant; the version it grants steps for (0: not a grant)."""
        version = _granted_version(data)
        self.granted_version = max(self.granted_version, version)
        return version

    def drain(self) -> int:
        """Drop the messages received so far (without blocking); returns how many."""
        received = self._subscription.drain()
        for data in received:
            self._heard(data)
        return len(received)

    def wait(self, timeout: float, grants_only: bool = False) -> bool:
        """Block until a message arrives (True) or ``timeout`` seconds pass (False). With
        ``grants_only``, only a grant of steps counts: the learner grants after each publish, so
        waking on the publish too costs a claim that can only answer WAIT, and a grant of 0 steps
        lets nobody produce."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            data = self._subscription.next(left)
            if data is not None and (self._heard(data) or not grants_only):
                return True
        return False

    def close(self) -> None:
        self._subscription.close()
