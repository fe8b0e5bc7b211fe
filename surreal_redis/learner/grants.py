"""Production on grants for the live parameter version (``learner.on_policy_sync`` ``lockstep``
or ``overlap``: docs/concepts.md, "On-policy production"; :mod:`surreal_redis.hub.quota`). With
``overlap``, what agents had not claimed of the grant carries over to the version a publish makes;
when the feed holds the next update's batch by then, the publish grants the batch after next
instead, in its own script: the next update starts without a grant's round trip.

Top-up rule (both): when the feed still needs steps for its next update and no chunk arrived for
``learner.lockstep_topup_s`` seconds, the learner publishes again if the live version is not its
own (Redis restarted empty or failed over to a replica that missed the publish: no claim can
match), then grants the missing steps again once the grant is used up (or gone) and no agent that
beat within three ``agent.heartbeat_every_s`` is still making a flush it claimed (so an agent
claimed and died, or the chunks were lost or dropped). A claim is trusted for
:data:`CLAIM_PATIENCE` top-up periods without a chunk, no longer: an agent that says it is
making a flush and never sends it (stuck, or hostile: agents write their own heartbeats) delays
an update by that much at most. While the learner waits longer than
:data:`STALL_WARNING_S`, it says why every :data:`STALL_WARNING_S`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from surreal_redis.connection import RedisClient
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.replay.feeds import Feed

if TYPE_CHECKING:
    from surreal_redis.config import ExperimentConfig

log = logging.getLogger(__name__)

CLAIM_PATIENCE = 6
"""Top-up periods (``learner.lockstep_topup_s``) without a chunk after which agents' claims no
longer hold a top-up back: a flush takes seconds (an Atari agent's first one included)."""
STALL_WARNING_S = 30.0
"""Seconds without a chunk, while the update needs steps, before the learner warns (and again
each time as long)."""


class GrantKeeper:
    """The learner's grants and top-ups, and their bookkeeping. Without grants (off-policy feeds,
    ``on_policy_sync: free``) ``quota`` is None and every method does nothing. ``version()``: the
    learner's last published parameter version; ``env_steps()``: env steps it took in so far;
    ``publish()``: publish the current parameters now, however soon after the last. Each method is
    at most a few Redis round trips."""

    def __init__(self, client: RedisClient, config: ExperimentConfig, feed: Feed, *, version: Callable[[], int],
                 env_steps: Callable[[], int], publish: Callable[[], object]) -> None:
        self._client, self._config, self._feed = client, config, feed
        self._version, self._env_steps, self._publish = version, env_steps, publish
        self.quota = ProductionQuota(client, config.run) if config.lockstep and feed.steps_needed() is not None else None
        self.overlap = config.learner.on_policy_sync == "overlap"
        self._last_chunk_at = self._granted_at = time.monotonic()
        self._next_stall_warning = 0.0
        self._ahead_published = False  # the last publish made the next update's grant (overlap)
        self.topups = 0  # grants topped up by the rule above

    def grant(self, ahead: int = 0) -> None:
        """Let agents acting with the live version produce what the next ``1 + ahead`` updates
        still need."""
        if self.quota is None:
            return
        self.quota.grant(self._version(), self._steps(ahead))
        self._granted_at = time.monotonic()
        self._ahead_published = False  # this grant replaced it

    def before_update(self) -> None:
        """Overlap: an update runs now, so agents may make the next batch meanwhile (granted
        already when the publish after the last update did it)."""
        if self.overlap and self.quota is not None and self._feed.steps_needed() == 0:
            if self._ahead_published:
                self._ahead_published = False
            else:
                self.grant(ahead=1)

    @property
    def carry_on_publish(self) -> bool:
        """Overlap: a publish moves the unclaimed rest of the grant to the version it publishes,
        in its own script (``ParameterPublisher.publish(carry_grant=True)``)."""
        return self.overlap and self.quota is not None

    def grant_on_publish(self, queued: int) -> int | None:
        """Overlap, once the feed and the ``queued`` env steps (read, not in the feed yet) hold the
        next update's batch: the grant :meth:`before_update` would make for that update (the
        steps of the batch after next), for the publish to make instead; None otherwise (the
        publish carries the rest over)."""
        if not self.carry_on_publish or (self._feed.steps_needed() or 0) > queued:
            return None
        return self._steps(ahead=1, queued=queued)

    def published_grant(self) -> None:
        """A publish made :meth:`grant_on_publish`'s grant: the next update needs none."""
        self._ahead_published = True
        self._granted_at = time.monotonic()

    def _steps(self, ahead: int, queued: int = 0) -> int:
        """What the next ``1 + ahead`` updates still need beyond the feed and ``queued`` env steps,
        no more than the run still needs."""
        steps = max(0, (self._feed.steps_needed(ahead) or 0) - queued)
        limit = self._config.stop.max_env_steps
        if limit is not None:  # the stop comes at the limit
            steps = min(steps, max(0, limit - self._env_steps() - queued))
        return steps

    def after_update(self, version_before: int) -> None:
        """After an update and its publish, if due (``version_before``: the live version before it)."""
        if not self.overlap:
            self.grant()  # for the new version, or again for the old one when no publish was due
        elif self.quota is not None and self._version() != version_before:
            self._granted_at = time.monotonic()  # the publish carried the grant over

    def chunk_arrived(self) -> None:
        """Experience came in: the top-up clock starts again."""
        self._last_chunk_at = time.monotonic()

    def load_script(self) -> None:
        """Load ``claim.lua`` for agents that may not load it themselves (ACL)."""
        if self.quota is not None:
            self.quota.load_script()

    def top_up(self) -> None:
        """The top-up rule of the module docstring. At most an HGET, an HMGET, an HGETALL and a
        publish when it looks, which is only after ``learner.lockstep_topup_s`` without a chunk."""
        needed = self._feed.steps_needed()
        if self.quota is None or not needed:
            return
        now = time.monotonic()
        if now - max(self._last_chunk_at, self._granted_at) < self._config.learner.lockstep_topup_s:
            return
        silent_s = now - self._last_chunk_at
        version = self._version()
        if self.quota.live_version() != version:
            log.warning("lockstep: the live parameter version is not v%d (Redis restarted or failed over?); "
                        "publishing again", version)
            self._publish()
        elif self._agents_may_bring(version, needed, silent_s):  # look again later
            self._granted_at = now
            return
        self.topups += 1
        log.info("lockstep: no experience for %.0fs while the update needs %d more steps; granting them again "
                 "for v%d (top-up %d)", silent_s, needed, self._version(), self.topups)
        self.grant()

    def _agents_may_bring(self, version: int, needed: int, silent_s: float) -> bool:
        """Whether agents may still bring the missing steps: steps of ``version`` are left to claim,
        or agents still make flushes they claimed (for :data:`CLAIM_PATIENCE` top-up periods of
        silence at most). Says why while the learner waits past :data:`STALL_WARNING_S`."""
        grant = self.quota.left() if self.quota is not None else None
        if grant is not None and grant[0] == version and grant[1] > 0:  # no agent is asking (none alive?)
            self._warn_if_stalled(silent_s, needed, f"{grant[1]} steps of v{version} are granted and no agent "
                                                    "claims them (are agents running?)")
            return True
        making = self._agents_making()
        if not making:
            return False
        if silent_s < CLAIM_PATIENCE * self._config.learner.lockstep_topup_s:  # slow, not lost
            self._warn_if_stalled(silent_s, needed, f"agents {', '.join(making)} are still making the flushes "
                                                    "they claimed")
            return True
        log.warning("lockstep: agents %s claimed flushes and sent nothing for %.0fs; granting again",
                    ", ".join(making), silent_s)
        return False

    def _warn_if_stalled(self, silent_s: float, needed: int, why: str) -> None:
        """Say why the update still waits, once per :data:`STALL_WARNING_S` of silence."""
        now = time.monotonic()
        if silent_s >= STALL_WARNING_S and now >= self._next_stall_warning:
            self._next_stall_warning = now + STALL_WARNING_S
            log.warning("lockstep: no experience for %.0fs while the update needs %d more steps: %s",
                        silent_s, needed, why)

    def _agents_making(self) -> list[str]:
        """Agents that beat within three heartbeat periods and still make a flush they claimed."""
        agent = self._config.agent
        recent = 3 * agent.heartbeat_every_s
        return [a.agent_id for a in read_agents(self._client, self._config.run, agent.heartbeat_ttl_s)
                if a.claimed and a.age_s < recent]
