"""A run's own state in Redis: the control hash (running / stopping and why), the learner's status
report (JSON with a TTL), the experiment config ``launch`` stores for ``--run``, and dropping a
run. Every call is one or a few round trips and blocks only for those."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from surreal_redis.connection import RedisClient, as_text
from surreal_redis.keys import RunKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.runtime import StopFlag

RUNNING = "running"
STOPPING = "stopping"
LEARNER_ALIVE_S = 30.0  # a learner reports every learner.metrics_every_s; older "running" reports are stale
EXITED_TTL_S = 3600


class RunControl:
    """The state of run ``run``: ``control`` hash, ``learner`` status string, ``config`` hash."""

    def __init__(self, client: RedisClient, run: str) -> None:
        self.client, self.run = client, run
        self.keys = RunKeys(run)

    def start(self, unless_stopped_since: float | None = None) -> bool:
        """Mark the run running; True when written. With ``unless_stopped_since`` (a wall-clock
        time, e.g. when this process started), a stop requested since then is kept and False
        returned: a learner restarted while its launcher stops the run must not undo the stop
        request it could not have read yet (an older one is from an earlier life of the run). The
        check and the write are two calls: a stop landing in the milliseconds between is lost."""
        if unless_stopped_since is not None:
            state, at = self.client.hmget(self.keys.control, ["state", "at"])
            if state == STOPPING.encode() and at is not None and float(at) >= unless_stopped_since:
                return False
        self.client.hset(self.keys.control, mapping={"state": RUNNING, "reason": ""})
        return True

    def request_stop(self, reason: str) -> None:
        """Ask every process of the run to stop, for ``reason``; ``at`` records when (wall clock)."""
        self.client.hset(self.keys.control, mapping={"state": STOPPING, "reason": reason, "at": repr(time.time())})

    def stopping(self) -> tuple[bool, str]:
        """(whether a stop was requested, its reason)."""
        state, reason = self.client.hmget(self.keys.control, ["state", "reason"])
        return state == STOPPING.encode(), as_text(reason or b"")

    def write_learner_status(self, status: dict[str, Any], ttl_s: int) -> None:
        """The learner's report (iteration, version, env steps, returns, state, time); it expires
        after ``ttl_s`` seconds, so a dead learner's last report does not look alive for long."""
        self.client.set(self.keys.learner, json.dumps(status), ex=max(1, int(ttl_s)))

    def learner_status(self) -> dict[str, Any]:
        """The learner's last report as a dict; empty when no learner has reported (or it expired)."""
        raw = self.client.get(self.keys.learner)
        return json.loads(raw) if raw else {}

    def learner_alive(self, max_age_s: float = LEARNER_ALIVE_S) -> dict[str, Any]:
        """The status of a learner that may still be running (it said ``running`` less than
        ``max_age_s`` seconds ago, or three of its report intervals, ``every_s``, if longer), else
        an empty dict."""
        status = self.learner_status()
        max_age_s = max(max_age_s, 3 * float(status.get("every_s") or 0))
        if status.get("state") == RUNNING and time.time() - float(status.get("time", 0)) < max_age_s:
            return status
        return {}

    def mark_learner_exited(self, pid: int, exit_code: int) -> bool:
        """Record that the learner process ``pid`` exited, so a ``--resume`` right after a crash is
        not refused as a second learner; a report of another pid is left alone. Returns whether
        it changed the report. One WATCH/GET/SET transaction."""

        def mark(pipe: redis.client.Pipeline) -> bool:
            raw = pipe.get(self.keys.learner)
            status = json.loads(raw) if raw else {}
            if status.get("pid") != pid or status.get("state") != RUNNING:
                return False
            status.update(state="exited", exit_code=int(exit_code), time=time.time())
            pipe.multi()
            pipe.set(self.keys.learner, json.dumps(status), ex=EXITED_TTL_S)
            return True

        # redis-py types the callable as returning None, but value_from_callable returns its value
        changed = self.client.transaction(mark, self.keys.learner,  # type: ignore[arg-type]
                                          value_from_callable=True)
        return bool(changed)

    def store_config(self, yaml_text: str) -> None:
        """The run's experiment config, for processes started with ``--run`` instead of ``--config``."""
        self.client.hset(self.keys.config, mapping={"yaml": yaml_text, "created": time.time()})

    def stored_config(self) -> str | None:
        """The YAML that :meth:`store_config` wrote, or None."""
        raw = self.client.hget(self.keys.config, "yaml")
        return None if raw is None else as_text(raw)

    def drop(self, keep_lease: bool = False) -> int:
        """Delete every key of the run (SCAN + UNLINK in batches of 500); returns how many. With
        ``keep_lease`` the run's lease stays: a launch drops an earlier run's keys under its own."""
        deleted = 0
        kept = {self.keys.lease.encode()} if keep_lease else set()
        for pattern in self.keys.all_patterns():
            batch = []
            for key in self.client.scan_iter(match=pattern, count=1000):
                if key in kept:
                    continue
                batch.append(key)
                if len(batch) >= 500:
                    deleted += self.client.unlink(*batch)
                    batch = []
            if batch:
                deleted += self.client.unlink(*batch)
        return deleted


class StopWatch:
    """A :class:`~surreal_redis.outage.Waiter` set when ``stop`` is set or when the run's control
    state says ``stopping`` (which then sets ``stop`` too), for waits deep inside a component.
    ``is_set()`` polls Redis at most every ``poll_s`` seconds (an outage counts as "not
    stopping"); ``wait(timeout)`` wakes at once on a signal, within ``poll_s`` on a stop request.
    """

    def __init__(self, stop: StopFlag, control: RunControl, poll_s: float = 0.5) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0 seconds, got {poll_s!r}")
        self.stop, self.control, self.poll_s = stop, control, poll_s
        self._next_poll = 0.0

    def is_set(self) -> bool:
        if self.stop.is_set():
            return True
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_s
            try:
                stopping, reason = self.control.stopping()
            except OUTAGE_ERRORS:
                return False
            if stopping:
                self.stop.set(f"run stopping ({reason or 'stop requested'})")
        return self.stop.is_set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.stop.wait(min(remaining, self.poll_s))
        return True
