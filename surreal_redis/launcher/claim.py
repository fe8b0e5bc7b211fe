"""What a launch holds while it lives, so that no second launch touches its run: the experiment
folder's lock (this host: :meth:`RunFolder.lock`) and the run's lease in Redis (any host sharing
the server: :mod:`surreal_redis.hub.run.lease`, renewed on a thread, released at the exit)."""

from __future__ import annotations

import redis

from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import RedisClient
from surreal_redis.hub.run.lease import LeaseHeld, LeaseKeeper, RunLease, describe
from surreal_redis.run_folder import FolderLive, FolderLock, RunFolder


class LaunchError(RuntimeError):
    """A launch refused before any process started; the message says what to do instead."""


def live_run(config: ExperimentConfig, who: str) -> LaunchError:
    """The refusal of a launch whose run is live (``who`` says what holds it)."""
    run = config.run
    return LaunchError(f"run {run!r} is live: {who}; nothing was moved or deleted. Stop it first "
                       f"(surreal-redis stop --run {run}, or Ctrl-C its launch), or choose another "
                       f"experiment.name (-o experiment.name=NEW)")


class RunClaim:
    """The folder's lock and the run's lease of one launcher; :meth:`release` gives up both."""

    def __init__(self, config: ExperimentConfig, folder: RunFolder) -> None:
        self.config, self.folder = config, folder
        self._lock: FolderLock | None = None  # held while this launcher lives
        self._lease: LeaseKeeper | None = None  # the run's lease in Redis, renewed while this launcher lives

    def lock_folder(self) -> None:
        """Hold the experiment folder's lock (creating both) for this launcher's life; LaunchError
        when a live launcher holds the folder. Again after ``--fresh`` moved the folder aside: the
        old lock went with it and is released."""
        try:
            lock = self.folder.lock()
        except FolderLive as live:
            raise live_run(self.config, live.who) from None
        self._unlock()
        self._lock = lock

    def take_lease(self, client: RedisClient, url: str) -> None:
        """Own the run in Redis at ``url`` for this launcher's life (renewed on a thread);
        LaunchError when another launch holds its lease, before anything is moved or deleted."""
        lease = RunLease(client, self.config.run, folder=str(self.folder.path))
        try:
            lease.acquire()
        except LeaseHeld as held:
            raise live_run(self.config, f"{describe(held.holder)} holds the run's lease on {url} (free "
                           f"{lease.ttl_s:.0f}s after that launcher dies; {held.ttl_s:.0f}s left now)") from None
        except redis.RedisError as exc:
            raise LaunchError(f"cannot take run {self.config.run!r}'s lease on {url}: {exc}") from exc
        self._lease = LeaseKeeper(lease).start()

    @property
    def lost(self) -> bool:
        """Another launch took the run over (this launcher's lease expired): touch none of its keys."""
        return self._lease is not None and self._lease.lost.is_set()

    def release_lease(self) -> None:
        if self._lease is not None:
            self._lease.stop()
            self._lease = None

    def release(self) -> None:
        """The lease, then the folder's lock."""
        self.release_lease()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
