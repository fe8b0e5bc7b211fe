"""Finished-episode statistics. Agents append training episodes (JSON) to the ``episodes:inbox``
list, which the learner moves into the ``episodes`` stream (``lua/drain.lua``); the eval process
alone may write the ``evals`` stream. The learner reads both (charts, best-k checkpoints, stop
conditions) and trusts a record's mode only by the stream it came from, so no agent can put a
score into the eval results; :class:`TrainReturns` keeps one agent from driving the train-return
stop rule."""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable
from typing import Literal, NamedTuple

import numpy as np
import redis
from redis.typing import EncodableT, FieldT, KeyT, StreamIdT

from surreal_redis.connection import RedisClient, as_text, stream_entries, stream_read
from surreal_redis.keys import RunKeys
from surreal_redis.redis_cluster import keyed_command
from surreal_redis.scripts import Scripts

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


MAX_RECORD_BYTES = 1024  # a training record in the inbox; longer ones are dropped by drain.lua


class EpisodeLog:
    """Appends episode records, pipelined: training records to the ``episodes`` inbox (RPUSH of
    one JSON object each), eval records to ``evals`` (``XADD MAXLEN ~ maxlen``; only the eval user
    may write it: an agent's eval record is refused with NOPERM)."""

    def __init__(self, client: RedisClient, run: str, maxlen: int = 100_000) -> None:
        if maxlen < 1:
            raise ValueError(f"episodes maxlen must be >= 1, got {maxlen}")
        keys = RunKeys(run)
        self.client, self.maxlen = client, maxlen
        self.keys: dict[str, str] = {"train": keys.episodes_inbox, "eval": keys.evals}

    def record(self, records: list[EpisodeRecord]) -> None:
        """One round trip for all ``records``; Redis errors propagate (the caller backs off)."""
        refused = self.record_some(records)
        if refused:
            raise redis.exceptions.OutOfMemoryError(f"{len(refused)} of {len(records)} episode records refused: "
                                                    "Redis is out of memory")

    def record_some(self, records: list[EpisodeRecord]) -> list[EpisodeRecord]:
        """Like :meth:`record`, but returns the records Redis refused for lack of memory (OOM) while
        the others were stored, so that only those are sent again. Connection errors and any other
        refusal (NOPERM) propagate."""
        if not records:
            return []
        pipe = self.client.pipeline(transaction=False)
        for r in records:
            if r.mode not in self.keys:
                raise ValueError(f"unknown episode mode {r.mode!r} (use 'train' or 'eval')")
            fields: dict[FieldT, EncodableT] = {
                "agent": r.agent, "mode": r.mode, "return": repr(float(r.episode_return)),
                "length": int(r.length), "version": int(r.version), "time": repr(r.time)}
            if r.mode == "train":
                pipe.rpush(self.keys["train"], json.dumps(fields))
            else:
                pipe.xadd(self.keys["eval"], fields, maxlen=self.maxlen, approximate=True)
        refused = []
        for record, reply in zip(records, pipe.execute(raise_on_error=False)):
            if isinstance(reply, redis.exceptions.OutOfMemoryError):
                refused.append(record)
            elif isinstance(reply, Exception):
                raise reply
        return refused


class EpisodeReader:
    """The learner's reader of the episodes appended since the last call: ``drain.lua``, then one
    non-blocking XREAD of both streams from their cursors. A record that does not parse, or whose
    mode is not its stream's (an agent claiming an eval), is counted in :attr:`malformed` and
    skipped; ``maxlen``: the ``episodes`` stream's approximate cap."""

    def __init__(self, client: RedisClient, run: str, start_id: str = "$", maxlen: int = 100_000) -> None:
        if maxlen < 1:
            raise ValueError(f"episodes maxlen must be >= 1, got {maxlen}")
        self.keys = keys = RunKeys(run)
        self.client, self.maxlen = client, maxlen
        self._scripts = Scripts(client)
        self.modes: dict[str, EpisodeMode] = {keys.episodes: "train", keys.evals: "eval"}
        self.cursors = {key: start_id for key in self.modes}
        self.malformed = 0

    def read_new(self, count: int = 10_000) -> list[EpisodeRecord]:
        """Up to ``count`` records of each stream, oldest first within each. Blocks for two round
        trips, two more once to resolve a ``"$"`` start. Under OOM the records wait in the inbox
        for a later call; other Redis errors propagate."""
        try:
            taken, dropped, _ = self._scripts.call("drain", [self.keys.episodes_inbox, self.keys.episodes],
                                                   [count, self.maxlen, MAX_RECORD_BYTES])
        except redis.exceptions.OutOfMemoryError:
            taken = dropped = 0
            log.debug("episode records wait in the inbox: Redis is out of memory")
        if dropped:
            self._count_malformed(f"{dropped} of {taken} queued training records over {MAX_RECORD_BYTES} bytes", dropped)
        for key, cursor in self.cursors.items():
            if cursor == "$":  # resolve "now" once so nothing appended later is skipped
                last = stream_entries(self.client.xrevrange(key, count=1))
                self.cursors[key] = last[0][0].decode() if last else "0-0"
        streams: dict[KeyT, StreamIdT] = dict(self.cursors.items())
        first = next(iter(streams))  # the run's streams share one slot (keys.py)
        reply = stream_read(keyed_command(self.client, first, "XREAD", "COUNT", count, "STREAMS",
                                          *streams.keys(), *streams.values()))
        records = []
        for name, entries in reply:
            key = as_text(name)
            for entry_id, fields in entries:
                self.cursors[key] = entry_id.decode()
                try:
                    records.append(parse_episode(fields, self.modes[key]))
                except (KeyError, ValueError, TypeError, AttributeError, RecursionError) as exc:
                    self._count_malformed(f"record {entry_id.decode()} of {key}: {exc!r}"[:300])
        return records

    def _count_malformed(self, what: str, count: int = 1) -> None:
        self.malformed += count
        if self.malformed == count or self.malformed // 1000 != (self.malformed - count) // 1000:
            log.warning("skipping malformed episode records (%d so far): %s", self.malformed, what)


def parse_episode(fields: dict[bytes, bytes], mode: EpisodeMode) -> EpisodeRecord:
    """The record of one stream entry, whose stream holds ``mode`` records: the fields themselves
    (``evals``) or one JSON object in field ``r`` (``episodes``, as an agent queued it). Raises
    ValueError (or KeyError, TypeError, AttributeError for a missing or mistyped field)."""
    if b"r" in fields:
        decoded = json.loads(fields[b"r"])
        if not isinstance(decoded, dict):
            raise ValueError(f"a record must be a JSON object, got {type(decoded).__name__}")
        fields = {str(k).encode(): str(v).encode() for k, v in decoded.items()}
    claimed = fields[b"mode"].decode()
    if claimed != mode:
        raise ValueError(f"a {claimed!r} record in the {mode} stream")
    episode_return = float(fields[b"return"])
    if not np.isfinite(episode_return):
        raise ValueError(f"episode return {episode_return}")
    return EpisodeRecord(agent=fields[b"agent"].decode(), mode=mode, episode_return=episode_return,
                         length=int(fields[b"length"]), version=int(fields[b"version"]), time=float(fields[b"time"]))


class TrainReturns:
    """Training episode returns, for charts (:meth:`mean`) and the train-return stop rule
    (:meth:`stop_score`, a window per agent id, so it reaches a target only when more than half of
    the agents do, however many records one agent writes under its own id). An agent writing
    under other ids, or heartbeating under made-up ones, still can (agents share one Redis user);
    ``stop.target_metric: eval`` cannot be driven by agents. At most ``MAX_AGENT_IDS`` ids are
    kept (the longest silent is forgotten first).
    """

    MAX_AGENT_IDS = 4096

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"return window must be >= 1 episodes, got {window}")
        self.window = window
        self._recent: deque[float] = deque(maxlen=window)
        self._by_agent: OrderedDict[str, deque[float]] = OrderedDict()

    def add(self, records: Iterable[EpisodeRecord]) -> None:
        """Keep the training records among ``records`` (eval records are left out)."""
        by_agent = self._by_agent
        for r in records:
            if r.mode != "train":
                continue
            self._recent.append(r.episode_return)
            own = by_agent.get(r.agent)
            if own is None:
                own = by_agent[r.agent] = deque(maxlen=self.window)
                if len(by_agent) > self.MAX_AGENT_IDS:
                    by_agent.popitem(last=False)
            else:
                by_agent.move_to_end(r.agent)
            own.append(r.episode_return)

    def __len__(self) -> int:
        return len(self._recent)

    def mean(self) -> float | None:
        """Mean return of the last ``window`` episodes of all agents (None before the first)."""
        return float(np.mean(self._recent)) if self._recent else None

    def stop_score(self, agents: Collection[str] | None = None) -> float | None:
        """Lower median over ``agents`` (the ids that heartbeat; default, or when empty: every id
        with records) of each one's mean return over its last ``ceil(window / n)`` episodes, n the
        agents that reported, an agent without records counting as not reaching the target; None
        until those windows hold ``window`` episodes together, or while the median agent has none."""
        ids = set(agents) if agents else set(self._by_agent)
        reporting = [self._by_agent[a] for a in ids if a in self._by_agent]
        if not reporting:
            return None
        per_agent = math.ceil(self.window / len(reporting))
        if sum(min(len(values), per_agent) for values in reporting) < self.window:
            return None
        means = sorted(float(np.mean(list(values)[-per_agent:])) for values in reporting)
        means = [-math.inf] * (len(ids) - len(reporting)) + means
        score = means[(len(means) - 1) // 2]
        return None if score == -math.inf else score
