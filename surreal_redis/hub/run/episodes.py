"""Finished-episode statistics: agents and eval append to ``sr:{run}:episodes``; the learner
reads them (for stop conditions, best-k checkpoints and MLflow) and ``status`` shows them."""

from __future__ import annotations

import logging
from typing import Literal, NamedTuple

import redis

from surreal_redis.keys import RunKeys

log = logging.getLogger(__name__)

EpisodeMode = Literal["train", "eval"]


class EpisodeRecord(NamedTuple):
    """One finished episode: undiscounted return, length in agent steps, the parameter version
    that played it, unix time in seconds."""

    agent: str
    mode: EpisodeMode
    episode_return: float
    length: int
    version: int
    time: float


class EpisodeLog:
    """Appends episode records (``XADD MAXLEN ~ maxlen``), pipelined with the caller's batch."""

    def __init__(self, client: redis.Redis, run: str, maxlen: int = 100_000) -> None:
        if maxlen < 1:
            raise ValueError(f"episodes maxlen must be >= 1, got {maxlen}")
        self.client, self.key, self.maxlen = client, RunKeys(run).episodes, maxlen

    def record(self, records: list[EpisodeRecord]) -> None:
        """One round trip for all ``records``; Redis errors propagate (the caller backs off)."""
        if not records:
            return
        pipe = self.client.pipeline(transaction=False)
        for r in records:
            pipe.xadd(self.key, {"agent": r.agent, "mode": r.mode, "return": repr(float(r.episode_return)),
                                 "length": int(r.length), "version": int(r.version), "time": repr(r.time)},
                      maxlen=self.maxlen, approximate=True)
        pipe.execute()


class EpisodeReader:
    """Reads the episodes appended since the last call (non-blocking XREAD from a cursor)."""

    def __init__(self, client: redis.Redis, run: str, start_id: str = "$") -> None:
        self.client, self.key = client, RunKeys(run).episodes
        self.cursor = start_id
        self.malformed = 0

    def read_new(self, count: int = 10_000) -> list[EpisodeRecord]:
        if self.cursor == "$":  # resolve "now" once so nothing appended later is skipped
            last = self.client.xrevrange(self.key, count=1)
            self.cursor = last[0][0].decode() if last else "0-0"
        reply = self.client.xread({self.key: self.cursor}, count=count)
        records = []
        for _, entries in reply:
            for entry_id, fields in entries:
                self.cursor = entry_id.decode()
                try:
                    records.append(parse_episode(fields))
                except (KeyError, ValueError) as exc:
                    self.malformed += 1
                    log.warning("skipping malformed episode record %s: %s", self.cursor, exc)
        return records


def parse_episode(fields: dict[bytes, bytes]) -> EpisodeRecord:
    mode = fields[b"mode"].decode()
    if mode not in ("train", "eval"):
        raise ValueError(f"unknown episode mode {mode!r}")
    return EpisodeRecord(agent=fields[b"agent"].decode(), mode=mode,  # type: ignore[arg-type]
                         episode_return=float(fields[b"return"]), length=int(fields[b"length"]),
                         version=int(fields[b"version"]), time=float(fields[b"time"]))
