"""The learner's after-update publishes on a thread of their own, so an update never waits for
one (issue: "publishing and metrics never blocking an update").

The main thread encodes the parameters (a copy: the next update changes them in place) and hands
the bytes to :class:`PublishThread`; the publish script's round trip then runs beside the next
update. One publish is in flight at most: the next one, and every main-thread step that needs the
live version in Redis (a grant, the housekeeping, a checkpoint, the stop), settles it first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from surreal_redis.codec import ParamDict
from surreal_redis.hub.params.publisher import EncodedParams, ParameterPublisher, PublishBackpressure
from surreal_redis.learner.grants import GrantKeeper

log = logging.getLogger(__name__)


class Flight(NamedTuple):
    """A publish handed to the thread: ``version_before`` is the learner's version when it was
    handed over, ``expected`` the one it should make (:meth:`ParameterPublisher.next_version`),
    ``grant`` the steps it grants the new version (None: it carries the rest over, or no quota),
    ``started`` when it was handed over (``time.monotonic()``)."""

    version_before: int
    expected: int
    grant: int | None
    started: float


class Landed(NamedTuple):
    """How a publish ended: ``version`` made (None when it failed with ``error``), after
    ``seconds`` from hand-over to the script's reply."""

    flight: Flight
    version: int | None
    error: BaseException | None
    seconds: float


class PublishThread:
    """Runs :meth:`ParameterPublisher.publish_encoded` on one worker thread, one publish at a
    time. :meth:`send` never blocks; :meth:`settle` returns a finished publish's outcome once
    (waiting for it with ``wait``). Used from one thread (the learner's main thread)."""

    def __init__(self, publisher: ParameterPublisher) -> None:
        self._publisher = publisher
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self._flight: Flight | None = None
        self._future: Future[int] | None = None
        self._ended = 0.0  # when the last publish's script replied (written by the worker)

    @property
    def in_flight(self) -> bool:
        return self._flight is not None

    def send(self, encoded: EncodedParams, flight: Flight, carry_grant: bool) -> None:
        """Start publishing ``encoded`` (``ValueError`` while another publish is unsettled)."""
        if self._flight is not None:
            raise ValueError("a publish is still in flight: settle it first")
        self._flight = flight
        self._future = self._pool.submit(self._publish, encoded, carry_grant, flight.grant)

    def _publish(self, encoded: EncodedParams, carry_grant: bool, grant: int | None) -> int:
        try:
            return self._publisher.publish_encoded(encoded, carry_grant, grant)
        finally:
            self._ended = time.monotonic()

    def settle(self, wait: bool) -> Landed | None:
        """The publish in flight once it has ended (its error kept, not raised), waiting for it
        with ``wait``; None when none is in flight, or without ``wait`` while it still runs."""
        if self._flight is None or self._future is None or (not wait and not self._future.done()):
            return None
        flight, future = self._flight, self._future
        self._flight = self._future = None
        error = future.exception()  # waits for the end
        seconds = self._ended - flight.started
        return Landed(flight, None if error is not None else future.result(), error, seconds)

    def close(self) -> None:
        """Wait for a publish in flight (its outcome is dropped: settle it first) and end the thread."""
        self._pool.shutdown(wait=True)


class Publishing:
    """The learner's publishes and its parameter ``version`` (the one a publish in flight is
    making included: policy lag is measured against the parameters being trained, as when the
    publish ran at once). With ``behind``, :meth:`after_update` hands the publish to a
    :class:`PublishThread`; every other publish runs at once, after settling the one in flight.

    ``params()``: the actor's parameters and the iteration; ``on_published(version, seconds)``:
    a publish landed. ``failed``: the last publish did not go through (Redis full or away): the
    next update, or the housekeeping, tries again."""

    def __init__(self, publisher: ParameterPublisher, grants: GrantKeeper,
                 params: Callable[[], tuple[ParamDict, int]], on_published: Callable[[int, float], None],
                 behind: bool) -> None:
        self.publisher, self.grants = publisher, grants
        self._params, self._on_published = params, on_published
        self._thread = PublishThread(publisher) if behind else None
        self.version = 0
        self.failed = False

    def publish(self, force: bool = False, queued: int | None = None) -> bool:
        """Publish now unless too soon after the last (``force``: anyway), after the publish in
        flight; with ``queued`` (the env steps the prefetch thread read ahead), the next update's
        grant when it is due (``GrantKeeper.grant_on_publish``). False when Redis refused it for
        lack of memory (logged); connection errors propagate."""
        self.settle(wait=True)
        start = time.monotonic()
        self.failed = True  # until it went through
        grant = self.grants.grant_on_publish(queued) if queued is not None else None
        params, iteration = self._params()
        try:
            version = self.publisher.publish(params, iteration, force=force,
                                             carry_grant=self.grants.carry_on_publish, grant=grant)
        except PublishBackpressure as exc:
            log.warning("publish refused, Redis is full (%s); training goes on, retrying after housekeeping", exc)
            return False
        self.failed = False
        if version is not None:
            self._landed(version, time.monotonic() - start)
            if grant is not None:
                self.grants.published_grant()
        return True

    def after_update(self, queued: int | None) -> None:
        """The publish after an update (``queued`` as in :meth:`publish`): on the publish thread
        with ``behind`` (the parameters encoded here first), else at once. Raises the error of
        the previous publish in flight, if it failed for other than lack of memory."""
        if self._thread is None:
            self.publish(queued=queued)
            return
        self.settle(wait=True)  # one in flight at most; the last one has long landed, as a rule
        if not self.publisher.due():
            return
        params, iteration = self._params()
        encoded = self.publisher.encode(params, iteration)
        grant = self.grants.grant_on_publish(queued) if queued is not None else None
        flight = Flight(self.version, self.publisher.next_version(), grant, time.monotonic())
        self.failed = True  # until it lands
        self._thread.send(encoded, flight, self.grants.carry_on_publish)
        self.version = flight.expected
        if grant is not None:
            self.grants.published_grant()

    def settle(self, wait: bool) -> None:
        """Take in the publish in flight once it has landed (``wait``: waiting for it). A failed
        one takes the version back and leaves its grant to the next update; lack of memory is
        logged, other errors are raised here."""
        landed = self._thread.settle(wait) if self._thread is not None else None
        if landed is None:
            return
        if landed.version is not None:
            self.failed = False
            self._landed(landed.version, landed.seconds)
            return
        self.version = landed.flight.version_before
        if landed.flight.grant is not None:
            self.grants.publish_failed()
        if isinstance(landed.error, PublishBackpressure):
            log.warning("publish refused, Redis is full (%s); training goes on, retrying after housekeeping",
                        landed.error)
            return
        raise landed.error  # type: ignore[misc]  # not None: it did not land

    def republish(self, above: int) -> int:
        """Publish the parameters again as a version above ``above`` (after the one in flight);
        returns that version."""
        self.settle(wait=True)
        start = time.monotonic()
        params, iteration = self._params()
        version = self.publisher.republish(params, iteration, above=above)
        self._landed(version, time.monotonic() - start)
        return version

    def close(self) -> None:
        """End the publish thread (settle first: what lands after is not taken in)."""
        if self._thread is not None:
            self._thread.close()

    def _landed(self, version: int, seconds: float) -> None:
        self.version = version
        self._on_published(version, seconds)
