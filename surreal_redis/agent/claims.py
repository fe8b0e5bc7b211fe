"""Claiming a flush from the learner's quota (lockstep and overlap): claim, wait for a grant,
load the claimed version. See :mod:`surreal_redis.hub.quota` for the grants themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from surreal_redis.connection import Backoff
from surreal_redis.hub.quota import Claim, ClaimScriptMissing, ProductionQuota, QuotaNews
from surreal_redis.hub.run.control import StopWatch
from surreal_redis.outage import OUTAGE_ERRORS, OutageGuard

# A claim is retried with backoff after these: Redis away or full, or claim.lua not loaded yet.
CLAIM_RETRY_ERRORS = (*OUTAGE_ERRORS, redis.exceptions.OutOfMemoryError, ClaimScriptMissing)
# A waiting agent claims again on every notify message and, as a safety net (a message lost to a
# reconnect), this often without one: each claim is a round trip, so a short period costs a
# waiting agent as much CPU as its sender. It looks for a stop every CLAIM_WAIT_SLICE_S.
CLAIM_RECHECK_S = 2.0
CLAIM_WAIT_SLICE_S = 0.5


class Claimer:
    """One agent's claims of ``steps`` env steps per flush (``flush_steps`` x its envs).

    ``held()``: the parameter version the agent acts with; ``load(at_least)``: load published
    parameters of at least that version (0: whatever changed), True when new ones were loaded,
    never raising for an outage; ``beat()``: the agent's heartbeat when due (called while
    waiting). ``stop_watch``: a run stop or a signal ends a wait within ``CLAIM_WAIT_SLICE_S``.
    """

    def __init__(self, name: str, quota: ProductionQuota, news: QuotaNews, stop_watch: StopWatch, steps: int,
                 held: Callable[[], int], load: Callable[[int], bool], beat: Callable[[], None]) -> None:
        self.quota, self.news, self.stop_watch, self.steps = quota, news, stop_watch, steps
        self.held, self.load, self.beat = held, load, beat
        self.guard = OutageGuard(f"{name} (claim)", stop_watch, errors=CLAIM_RETRY_ERRORS)
        self.claimed = 0  # env steps claimed and not sent yet (the learner waits for them)
        self.wait_s = 0.0  # seconds spent claiming, waits included (the claim under way excluded)
        self._since: float | None = None  # monotonic start of the claim under way

    def waited_s(self) -> float:
        """Seconds spent claiming so far, the claim under way included."""
        ongoing = 0.0 if self._since is None else time.monotonic() - self._since
        return self.wait_s + ongoing

    def sent(self) -> None:
        """The claimed flush went out: nothing claimed waits in the agent any more."""
        self.claimed = 0

    def claim_flush(self) -> bool:
        """Block until the learner's quota lets this agent produce its next flush with the
        parameters it holds (loading newer ones when told it is stale). Waits on the notify
        channel for a grant (re-claiming every ``CLAIM_RECHECK_S`` anyway), beats the heartbeat,
        rides out outages with backoff, and returns False once stopping (within
        ``CLAIM_WAIT_SLICE_S`` of a stop request).

        A stale agent claims the live version's steps before it downloads that version, so only
        agents that will produce with a version download it (with more agents than claims per
        update, the others would load every version only to be told WAIT). A live version below
        the one held (a learner that started over) is not claimed: its download is refused and
        counted."""
        started = self._since = time.monotonic()
        claim_at = started  # claim at once, then on a grant message or every CLAIM_RECHECK_S
        try:
            while not self.stop_watch.is_set():
                try:
                    now = time.monotonic()
                    if now >= claim_at:
                        held = self.held()
                        version, claim, again = self._claim(held)
                        claim_at = 0.0 if again else now + CLAIM_RECHECK_S
                        if claim.status == "OK":
                            self.claimed = claim.granted
                            if version > held and not self._load_claimed(version):
                                return False
                            self.guard.succeeded()
                            return True
                    if self.news.wait(min(CLAIM_WAIT_SLICE_S, max(0.0, claim_at - time.monotonic())),
                                      grants_only=True):
                        claim_at = 0.0
                    self.guard.succeeded()
                except CLAIM_RETRY_ERRORS as exc:
                    self.news.close()
                    self.guard.failed(exc)
                    claim_at = 0.0
                self.beat()
            return False
        finally:
            self.wait_s += time.monotonic() - started
            self._since = None

    def _claim(self, held: int) -> tuple[int, Claim, bool]:
        """One claim, two when told STALE while a newer version is live: (the version claimed,
        the reply, whether to claim again at once)."""
        self.news.drain()  # a message from now on means something changed since this claim
        version = max(held, self.news.granted_version)  # a grant heard for a newer version: claim that one
        claim = self.quota.claim(version, self.steps)
        if claim.status == "STALE" and claim.live_version > held:
            version = claim.live_version
            claim = self.quota.claim(version, self.steps)
            return version, claim, claim.status == "STALE"  # published between the two claims
        if claim.status == "STALE":
            self.load(0)  # refused and counted: the learner republishes above
        return version, claim, False

    def _load_claimed(self, version: int) -> bool:
        """Load ``version`` (or a newer one), whose steps this agent claimed; tries again with
        backoff while downloads fail (each rejection is counted; the learner republishes above
        a version agents keep rejecting). False when stopping first."""
        backoff = Backoff(0.05, 1.0)
        while not self.load(version):
            self.beat()
            if self.stop_watch.wait(backoff.next_delay()):
                return False
        return True

    def close(self) -> None:
        """Stop listening for grants (the agent is stopping)."""
        self.news.close()
