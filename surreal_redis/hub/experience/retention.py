"""Eviction of experience: move what agents queued into the shard streams, trim the streams (by
count, age and, under memory pressure, memory: :class:`RetentionConfig`), then collect
unreferenced observations (two-phase gc, see ``lua/gc.lua``).

Every script call does bounded work; :meth:`HubJanitor.run_once` loops in Python. Trimming and gc
only free memory, so they run while Redis refuses writes for ``maxmemory`` (OOM).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import redis

from surreal_redis.connection import RedisClient, stream_entries, string_list
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ReceiverConfig
from surreal_redis.hub.experience.wire import id_score
from surreal_redis.keys import CONSUMER_GROUP, RunKeys, ShardKeys, is_digest
from surreal_redis.redis_cluster import node_client
from surreal_redis.scripts import ScriptError, Scripts

log = logging.getLogger(__name__)

DEAD_KEEP = 100  # dead-letter records per shard kept under memory pressure (the newest)


@dataclass(frozen=True)
class RetentionConfig:
    """How much experience each shard stream keeps.

    ``max_entries``: hard cap on entries per shard (approximate: whole stream nodes are trimmed);
    unread entries over the cap are dropped, counted and logged. ``max_age_s``: entries older than
    this (server time) go, but only those the learner's group has acked. None disables either.
    ``trim_limit``: entries per trim call (<= 1000); ``gc_batch``: obs keys per gc call (<= 256);
    ``max_calls``: script calls per shard and run (a safety bound). ``orphan_scan_count``: obs keys
    examined per shard and run (one SCAN call) for orphans, keys no entry can reach (written
    around ``insert.lua``); 0 disables the sweep. ``memory_high_water``: the fraction of a server's
    ``maxmemory`` (INFO memory) above which the janitor trims by memory, acked entries first, then
    unread ones oldest first (counted like the cap's), ``pressure_step`` entries per trim call, until
    used memory is below it again; None trims by memory only after a write was refused for OOM, and
    then acked entries only. A server without maxmemory is never under pressure.
    """

    max_entries: int | None = 100_000
    max_age_s: float | None = None
    trim_limit: int = 1000
    gc_batch: int = 256
    max_calls: int = 10_000
    orphan_scan_count: int = 1000
    memory_high_water: float | None = 0.9
    pressure_step: int = 100

    def __post_init__(self) -> None:
        if self.max_entries is not None and self.max_entries < 0:
            raise ValueError(f"retention.max_entries must be >= 0 or None, got {self.max_entries}")
        if self.max_age_s is not None and self.max_age_s <= 0:
            raise ValueError(f"retention.max_age_s must be > 0 or None, got {self.max_age_s}")
        for name, top in (("trim_limit", 1000), ("gc_batch", 256), ("pressure_step", 1000)):
            if not 1 <= getattr(self, name) <= top:
                raise ValueError(f"retention.{name} must be in 1..{top}, got {getattr(self, name)}")
        if self.max_calls < 1:
            raise ValueError(f"retention.max_calls must be >= 1, got {self.max_calls}")
        if self.orphan_scan_count < 0:
            raise ValueError(f"retention.orphan_scan_count must be >= 0, got {self.orphan_scan_count}")
        if self.memory_high_water is not None and not 0 < self.memory_high_water <= 1:
            raise ValueError(f"retention.memory_high_water must be in (0, 1] or None, got {self.memory_high_water}")


class JanitorStats(NamedTuple):
    """What one :meth:`HubJanitor.run_once` did, summed over shards. ``unread_dropped``: entries
    trimmed before the learner's group was given them; ``obs_deleted``: obs keys deleted;
    ``orphans_deleted``: those no entry could reach (included in ``obs_deleted``); ``moved``:
    queued batches taken from the inboxes first; ``set_aside``: those of them written to the
    dead-letter stream instead; ``malformed_removed``: obsref members that are no digest
    (removed); ``obs_skipped``: keys the sweep met that are no obs key of the shard (left alone);
``junk_deleted``: obs keys whose name holds no digest, which nothing can reach (deleted, included
in ``obs_deleted``);
    ``pressure_trimmed``: entries trimmed for memory pressure (included in ``trimmed``, and their
    unread ones in ``unread_dropped``); ``dead_trimmed``: dead-letter records trimmed for memory
    pressure (before any entry)."""

    trimmed: int
    unread_dropped: int
    obs_deleted: int
    calls: int
    orphans_deleted: int = 0
    moved: int = 0
    set_aside: int = 0
    malformed_removed: int = 0
    obs_skipped: int = 0
    pressure_trimmed: int = 0
    dead_trimmed: int = 0
    junk_deleted: int = 0

    def as_metrics(self) -> dict[str, float]:
        """These counts as the learner's ``hub/*_total`` metrics, by name."""
        return {
            "hub/trimmed_total": float(self.trimmed),
            "hub/unread_trimmed_total": float(self.unread_dropped),
            "hub/obs_deleted_total": float(self.obs_deleted),
            "hub/obs_orphans_deleted_total": float(self.orphans_deleted),
            "hub/obs_junk_keys_skipped_total": float(self.obs_skipped),
            "hub/obs_junk_keys_deleted_total": float(self.junk_deleted),
            "hub/obsref_malformed_removed_total": float(self.malformed_removed),
            "hub/dead_trimmed_total": float(self.dead_trimmed),
        }


class HubJanitor:
    """Runs trim and gc for every shard of a run (the learner calls :meth:`run_once` periodically).

    ``unread_dropped_total``: entries trimmed before the learner's group was given them, since
    construction. Works in a full Redis: it only reads and frees memory. Connection errors
    propagate (a lost trim reply would lose its count). ``dead_letters(reason, shard, count)`` is
    told of every inbox item its moves set aside (the learner passes its receiver's
    ``count_dead_letters``). A move refused as a whole is logged and the trim and gc go on.
    ``full_sweep``: every run sweeps all obs keys of each shard (SCAN to the end, within
    ``max_calls`` pages), as ``surreal-redis gc`` does; else one page a run, the cursor carried over.
    """

    def __init__(self, client: RedisClient, config: RetentionConfig, run: str, num_shards: int,
                 receiver: ReceiverConfig = ReceiverConfig(),
                 dead_letters: Callable[[str, int, int], None] | None = None, full_sweep: bool = False) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.client, self.config = client, config
        self._receiver = receiver  # its move settings: both movers keep the same dedup windows
        self._dead_letters = dead_letters
        self._shards = RunKeys(run).shards(num_shards)
        self._scripts = Scripts(client)
        self._scan_cursors = dict.fromkeys(range(num_shards), 0)
        self._scan_denied = False
        self._full_sweep = full_sweep  # each run sweeps every obs key (the administrator's gc), not one page
        self._oom_noted = False
        self._info_denied = False
        self.unread_dropped_total = 0

    def note_oom(self) -> None:
        """A write was refused for OOM: the next :meth:`run_once` trims acked entries by memory
        even below the high-water mark."""
        self._oom_noted = True

    def run_once(self) -> JanitorStats:
        """Move every shard's queued batches into its stream, trim it by age, then by count, then
        gc, then sweep one page of obs keys for orphans; under memory pressure, then trim by
        memory. Blocks for the script calls (each bounded: ``trim_limit`` entries, ``gc_batch`` keys).
        """
        totals = [0] * len(JanitorStats._fields)
        now_ms = None
        if self.config.max_age_s is not None:
            seconds, micros = self.client.time()
            now_ms = seconds * 1000 + micros // 1000
        oom, self._oom_noted = self._oom_noted, False
        for keys in self._shards:
            stats = self._run_shard(keys, now_ms, oom)
            totals = [a + b for a, b in zip(totals, stats)]
        totals = [a + b for a, b in zip(totals, self._relieve(oom))]
        result = JanitorStats(*totals)
        self.unread_dropped_total += result.unread_dropped
        return result

    def _run_shard(self, keys: ShardKeys, now_ms: int | None, oom: bool) -> JanitorStats:
        """The inbox move, age and count passes of one shard, its gc and orphan sweep."""
        cfg = self.config
        rc = self._receiver
        trimmed = dropped = calls = moved = set_aside = 0
        while calls < cfg.max_calls:
            calls += 1
            try:
                result = move_inbox(self._scripts, keys, rc.move_items, rc.seen_ttl_s, rc.dead_maxlen,
                                    rc.max_payload_bytes)
            except ScriptError as exc:
                log.error("shard %d: moving the inbox failed, its batches stay queued: %s", keys.shard, exc)
                break
            except redis.exceptions.OutOfMemoryError as exc:  # move.lua adds about what it frees
                log.warning("shard %d: moving the inbox refused for lack of memory, trimming first: %s",
                            keys.shard, exc)
                self._oom_noted = True
                break
            moved += result.taken
            for reason, count in result.set_aside.items():
                set_aside += count
                log.warning("shard %d: %d inbox items set aside in the dead-letter stream (%s)", keys.shard, count,
                            reason)
                if self._dead_letters is not None:
                    self._dead_letters(reason, keys.shard, count)
            if result.done:
                break
        first: bytes | None = None
        passes: list[tuple[str, str | int]] = []
        if now_ms is not None and cfg.max_age_s is not None:
            passes.append(("AGE", f"{max(0, now_ms - int(cfg.max_age_s * 1000))}-0"))
        if cfg.max_entries is not None:
            passes.append(("CAP", cfg.max_entries))
        for mode, threshold in passes:
            while calls < cfg.max_calls:
                removed, unread, first_id = self._scripts.call(
                    "trim", [keys.exp], [CONSUMER_GROUP, mode, threshold, cfg.trim_limit])
                calls += 1
                first = first_id or None
                trimmed, dropped = trimmed + removed, dropped + unread
                if not removed:
                    break
        if dropped:
            log.warning("shard %d: %d entries trimmed before the learner read them (retention.max_entries"
                        "=%s reached; the learner is too slow or absent)", keys.shard, dropped, cfg.max_entries)
        if not passes:
            head = stream_entries(self.client.xrange(keys.exp, count=1))
            first = head[0][0] if head else None
        deleted, gc_calls, malformed = self._collect(keys, first, cfg.max_calls - calls)
        swept, orphans, skipped, junk = self._sweep_orphans(keys, self._full_sweep)
        return JanitorStats(trimmed, dropped, deleted + swept, calls + gc_calls, orphans, moved, set_aside,
                            malformed, skipped, junk_deleted=junk)

    def _over_high_water(self, keys: ShardKeys) -> bool:
        """Whether the server holding this shard uses more than ``memory_high_water`` of its maxmemory."""
        if self.config.memory_high_water is None or self._info_denied:
            return False
        try:
            memory = node_client(self.client, keys.exp).info("memory")
        except redis.exceptions.ResponseError as exc:  # ACL or a server without INFO
            self._info_denied = True
            log.warning("memory high-water mark off: INFO memory refused (%s); trimming by memory only after a "
                        "write refused for OOM, acked entries only", exc)
            return False
        limit = int(memory.get("maxmemory", 0))
        return limit > 0 and int(memory["used_memory"]) > self.config.memory_high_water * limit

    def _relieve(self, oom: bool) -> JanitorStats:
        """Trim by memory while the servers are over the high-water mark: the dead-letter streams
        first (to their newest ``DEAD_KEEP`` records), then the acked entries of every shard
        (also when ``oom``, though below the mark), then the oldest, shard by shard in turn,
        collecting after each step. Stops when below the mark, when nothing is left to free, or
        after ``max_calls`` script calls per shard."""
        cfg = self.config
        oom |= self._oom_noted  # an inbox move refused in this run
        self._oom_noted = False
        totals = [0] * len(JanitorStats._fields)
        totals[JanitorStats._fields.index("dead_trimmed")] = self._trim_dead_letters(oom)
        budget = cfg.max_calls * len(self._shards)
        for mode in ("ACKED", "OLDEST"):
            left = list(self._shards)  # shards that may still free something in this mode
            while left and totals[3] < budget:
                for keys in list(left):
                    if not self._over_high_water(keys) and not (oom and mode == "ACKED"):
                        left.remove(keys)
                        continue
                    step = self._trim_step(keys, mode, budget - totals[3])
                    totals = [a + b for a, b in zip(totals, step)]
                    if not step.trimmed:
                        left.remove(keys)  # nothing of this kind left in this shard
        stats = JanitorStats(*totals)
        if stats.trimmed:
            log.warning("memory pressure: trimmed %d entries (%d of them unread, dropped) and deleted %d observations "
                        "(retention.memory_high_water=%s)", stats.trimmed, stats.unread_dropped, stats.obs_deleted,
                        cfg.memory_high_water)
        elif any(self._over_high_water(keys) for keys in self._shards[:1]):
            log.warning("Redis is over retention.memory_high_water=%s of maxmemory and this run holds no experience "
                        "to free", cfg.memory_high_water)
        return stats

    def _trim_dead_letters(self, oom: bool) -> int:
        """XTRIM the dead-letter stream of every shard over the high-water mark (every shard when
        ``oom``) to its newest ``DEAD_KEEP`` records (they are diagnostics; the entries are the
        run's data). Returns the records trimmed; XTRIM runs in a full Redis."""
        trimmed = 0
        for keys in self._shards:
            if oom or self._over_high_water(keys):
                trimmed += self.client.xtrim(keys.dead, maxlen=DEAD_KEEP, approximate=False)
        if trimmed:
            log.warning("memory pressure: trimmed %d dead-letter records (kept the newest %d per shard)", trimmed,
                        DEAD_KEEP)
        return trimmed

    def _trim_step(self, keys: ShardKeys, mode: str, budget: int) -> JanitorStats:
        """One trim call by memory (``trim_limit`` acked entries, or the ``pressure_step`` oldest),
        then the gc of what it unreferenced."""
        cfg = self.config
        removed, unread, first_id = self._scripts.call(
            "trim", [keys.exp], [CONSUMER_GROUP, mode, "", cfg.trim_limit if mode == "ACKED" else cfg.pressure_step])
        deleted = gc_calls = malformed = 0
        if removed:
            deleted, gc_calls, malformed = self._collect(keys, first_id or None, budget - 1)
        return JanitorStats(removed, unread, deleted, 1 + gc_calls, malformed_removed=malformed,
                            pressure_trimmed=removed)

    def _collect(self, keys: ShardKeys, first_id: bytes | None, budget: int) -> tuple[int, int, int]:
        """One pass over the obsref members that score below the first entry, ``gc_batch`` per
        gc call, paging past those gc spares (pinned, or referenced again meanwhile). Members that
        are no digest are removed. Returns (obs keys deleted, gc calls, malformed members removed)."""
        upper = f"({id_score(first_id)}" if first_id else "+inf"
        deleted = calls = malformed = spared = 0
        while calls < budget:
            members = string_list(self.client.zrangebyscore(keys.obsref, "-inf", upper, start=spared,
                                                            num=self.config.gc_batch))
            if not members:
                return deleted, calls, malformed
            digests = [m.decode("utf-8", "replace") for m in members]
            bad = [m for m, d in zip(members, digests) if not is_digest(d)]
            if bad:
                malformed += self.client.zrem(keys.obsref, *bad)
                log.warning("shard %d: removed %d obsref members that are not digests (e.g. %r)", keys.shard, len(bad),
                            bad[0][:80])
            good = [d for d in digests if is_digest(d)]
            if good:
                reply = self._scripts.call("gc", [keys.exp, keys.obsref, keys.pinned, *keys.obs_keys(good)], [])
                deleted, spared = deleted + reply[0], spared + reply[3]
                calls += 1
        log.warning("shard %d: gc stopped after %d calls (retention.max_calls) with candidates left",
                    keys.shard, calls)
        return deleted, calls, malformed

    def _sweep_orphans(self, keys: ShardKeys, to_end: bool = False) -> tuple[int, int, int, int]:
        """SCAN pages of this shard's obs keys through gc.lua, which deletes the orphans among them
        (and any the gc above would have) and the junk, keys whose name holds no digest: one page,
        the cursor carried over to the next run, or with ``to_end`` every page to the end of the
        keyspace (at most ``max_calls`` pages). Returns (deleted, orphans among them, skipped, junk
        among them)."""
        totals = [0, 0, 0, 0]
        for _ in range(self.config.max_calls if to_end else 1):
            if not self.config.orphan_scan_count or self._scan_denied:
                break
            totals = [a + b for a, b in zip(totals, self._sweep_page(keys))]
            if to_end and self._scan_cursors[keys.shard] == 0:
                break
        deleted, orphans, skipped, junk = totals
        if orphans:
            log.warning("shard %d: deleted %d observation keys no entry references (written around "
                        "insert.lua)", keys.shard, orphans)
        if junk:
            log.warning("shard %d: deleted %d obs keys whose name holds no digest (written around insert.lua)",
                        keys.shard, junk)
        return deleted, orphans, skipped, junk

    def _sweep_page(self, keys: ShardKeys) -> tuple[int, int, int, int]:
        """One SCAN page of :meth:`_sweep_orphans` (SCAN refused: the sweep is turned off)."""
        try:
            # the shard's keys share one slot: SCAN the server that owns it (a cluster's SCAN spans nodes)
            cursor, names = node_client(self.client, keys.exp).scan(
                self._scan_cursors[keys.shard], match=keys.obs_prefix + "*", count=self.config.orphan_scan_count)
        except redis.exceptions.NoPermissionError as exc:  # SCAN would list other runs' key names
            self._scan_denied = True
            log.warning("orphan sweep off: %s (only insert.lua's own uploads are guaranteed referenced)", exc)
            return 0, 0, 0, 0
        self._scan_cursors[keys.shard] = cursor
        deleted = orphans = skipped = junk = 0
        batch = self.config.gc_batch
        for start in range(0, len(names), batch):
            reply = self._scripts.call("gc", [keys.exp, keys.obsref, keys.pinned, *names[start:start + batch]], [])
            deleted, orphans, skipped, junk = deleted + reply[0], orphans + reply[1], skipped + reply[2], junk + reply[4]
        return deleted, orphans, skipped, junk
