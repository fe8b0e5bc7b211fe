"""Eviction of experience: trim shard streams by count and age, then collect unreferenced
observations (two-phase gc against the obsref sorted set, see ``lua/gc.lua``).

Every script call does bounded work; :meth:`HubJanitor.run_once` loops in Python. Trimming and gc
only free memory, so they run while Redis refuses writes for ``maxmemory`` (OOM).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import redis

from surreal_redis.hub.experience.backlog import read_backlog
from surreal_redis.hub.experience.wire import id_score, parse_id
from surreal_redis.keys import RunKeys, ShardKeys
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionConfig:
    """How much experience each shard stream keeps.

    ``max_entries``: hard cap on entries per shard (approximate: whole stream nodes are trimmed);
    unread entries over the cap are dropped, counted and logged. ``max_age_s``: entries older than
    this (server time) go, but only those the learner's group has already been given.
    None disables either. ``trim_limit``: entries per trim call (<= 1000); ``gc_batch``: obs
    keys per gc call (<= 256); ``max_calls``: script calls per shard and run (a safety bound).
    """

    max_entries: int | None = 100_000
    max_age_s: float | None = None
    trim_limit: int = 1000
    gc_batch: int = 256
    max_calls: int = 10_000

    def __post_init__(self) -> None:
        if self.max_entries is not None and self.max_entries < 0:
            raise ValueError(f"retention.max_entries must be >= 0 or None, got {self.max_entries}")
        if self.max_age_s is not None and self.max_age_s <= 0:
            raise ValueError(f"retention.max_age_s must be > 0 or None, got {self.max_age_s}")
        if not 1 <= self.trim_limit <= 1000:
            raise ValueError(f"retention.trim_limit must be in 1..1000, got {self.trim_limit}")
        if not 1 <= self.gc_batch <= 256:
            raise ValueError(f"retention.gc_batch must be in 1..256, got {self.gc_batch}")
        if self.max_calls < 1:
            raise ValueError(f"retention.max_calls must be >= 1, got {self.max_calls}")


class JanitorStats(NamedTuple):
    """What one :meth:`HubJanitor.run_once` did, summed over shards."""

    trimmed: int
    unread_dropped: int
    obs_deleted: int
    calls: int


class HubJanitor:
    """Runs trim and gc for every shard of a run (the learner calls :meth:`run_once` periodically).

    ``unread_dropped_total``: entries trimmed before the learner's group was given them, since
    construction.
    """

    def __init__(self, client: redis.Redis, config: RetentionConfig, run: str, num_shards: int) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.client, self.config = client, config
        self._shards = RunKeys(run).shards(num_shards)
        self._scripts = Scripts(client)
        self.unread_dropped_total = 0

    def run_once(self) -> JanitorStats:
        """Trim every shard by age, then by count, then gc until no candidate is left.

        Blocks for the script calls (each bounded: ``trim_limit`` entries, ``gc_batch`` keys).
        """
        totals = [0, 0, 0, 0]
        now_ms = None
        if self.config.max_age_s is not None:
            seconds, micros = self.client.time()
            now_ms = seconds * 1000 + micros // 1000
        for keys in self._shards:
            stats = self._run_shard(keys, now_ms)
            totals = [a + b for a, b in zip(totals, stats)]
        result = JanitorStats(*totals)
        self.unread_dropped_total += result.unread_dropped
        return result

    def _run_shard(self, keys: ShardKeys, now_ms: int | None) -> JanitorStats:
        cfg = self.config
        backlog = read_backlog(self.client, keys)
        length, unread, first = backlog.length, backlog.unread, backlog.first_id
        trimmed = dropped = calls = 0
        passes = []
        if now_ms is not None and backlog.last_delivered is not None and length:
            # MINID keeps the last delivered entry and everything after it: age never drops unread.
            cutoff = min((now_ms - int(cfg.max_age_s * 1000), 0), parse_id(backlog.last_delivered))
            passes.append(("MINID", f"{cutoff[0]}-{cutoff[1]}"))
        if cfg.max_entries is not None and length > cfg.max_entries:
            passes.append(("MAXLEN", str(cfg.max_entries)))
        for mode, threshold in passes:
            while calls < cfg.max_calls:
                removed, first_id = self._scripts.call("trim", [keys.exp], [mode, threshold, cfg.trim_limit])
                calls += 1
                first = first_id or None
                if not removed:
                    break
                # Trimming removes oldest first and delivered entries are older than unread ones.
                lost = max(0, removed - (length - unread))
                trimmed, dropped, length, unread = trimmed + removed, dropped + lost, length - removed, unread - lost
        if dropped:
            log.warning("shard %d: %d entries trimmed before the learner read them (retention.max_entries"
                        "=%s reached; the learner is too slow or absent)", keys.shard, dropped, cfg.max_entries)
        deleted, gc_calls = self._collect(keys, first, cfg.max_calls - calls)
        return JanitorStats(trimmed, dropped, deleted, calls + gc_calls)

    def _collect(self, keys: ShardKeys, first_id: bytes | None, budget: int) -> tuple[int, int]:
        """gc until no obsref member scores below the first entry; returns (deleted, calls)."""
        upper = f"({id_score(first_id)}" if first_id else "+inf"
        deleted = calls = 0
        while calls < budget:
            digests = self.client.zrangebyscore(keys.obsref, "-inf", upper, start=0, num=self.config.gc_batch)
            if not digests:
                return deleted, calls
            obs_keys = [keys.obs(d.decode()) for d in digests]
            deleted += self._scripts.call("gc", [keys.exp, keys.obsref, *obs_keys], [])
            calls += 1
        log.warning("shard %d: gc stopped after %d calls (retention.max_calls) with candidates left",
                    keys.shard, calls)
        return deleted, calls
