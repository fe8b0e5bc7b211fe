"""A run's own state in Redis, in one place: the control hash (running / stopping and why), the
learner's status report (JSON with a TTL), the experiment config that ``launch`` stores for
``agent --run`` and friends, and dropping every key of a run.

Every call is one or a few round trips and blocks only for those."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from surreal_redis.keys import RunKeys

RUNNING = "running"
STOPPING = "stopping"


class RunControl:
    """The state of run ``run``: ``control`` hash, ``learner`` status string, ``config`` hash."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client, self.run = client, run
        self.keys = RunKeys(run)

    # ---------------------------------------------------------------- running / stopping
    def start(self) -> None:
        self.client.hset(self.keys.control, mapping={"state": RUNNING, "reason": ""})

    def request_stop(self, reason: str) -> None:
        self.client.hset(self.keys.control, mapping={"state": STOPPING, "reason": reason})

    def stopping(self) -> tuple[bool, str]:
        """(whether a stop was requested, its reason)."""
        state, reason = self.client.hmget(self.keys.control, ["state", "reason"])
        return state == STOPPING.encode(), (reason or b"").decode()

    # ---------------------------------------------------------------- learner status
    def write_learner_status(self, status: dict[str, Any], ttl_s: int) -> None:
        """The learner's report (iteration, version, env steps, returns, state, time); it expires
        after ``ttl_s`` seconds, so a dead learner's last report does not look alive for long."""
        self.client.set(self.keys.learner, json.dumps(status), ex=max(1, int(ttl_s)))

    def learner_status(self) -> dict[str, Any]:
        """The learner's last report as a dict; empty when no learner has reported (or it expired)."""
        raw = self.client.get(self.keys.learner)
        return json.loads(raw) if raw else {}

    # ---------------------------------------------------------------- stored config
    def store_config(self, yaml_text: str) -> None:
        """The run's experiment config, for processes started with ``--run`` instead of ``--config``."""
        self.client.hset(self.keys.config, mapping={"yaml": yaml_text, "created": time.time()})

    def stored_config(self) -> str | None:
        """The YAML that :meth:`store_config` wrote, or None."""
        raw = self.client.hget(self.keys.config, "yaml")
        return None if raw is None else raw.decode()

    # ---------------------------------------------------------------- dropping
    def drop(self) -> int:
        """Delete every key of the run (SCAN + UNLINK in batches of 500); returns how many."""
        deleted = 0
        for pattern in self.keys.all_patterns():
            batch = []
            for key in self.client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += self.client.unlink(*batch)
                    batch = []
            if batch:
                deleted += self.client.unlink(*batch)
        return deleted
