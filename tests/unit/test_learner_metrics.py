"""The learner's metrics count what the janitor and the receiver set aside or could not parse."""

from __future__ import annotations

import surreal_redis.learner.metrics as metrics_module
from surreal_redis.config import ExperimentConfig
from surreal_redis.hub.experience.receiver import ReceiverStats
from surreal_redis.hub.experience.retention import JanitorStats
from surreal_redis.keys import RunKeys
from surreal_redis.learner.metrics import LearnerMetrics, LearnerProgress


class RecordingTracker:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float | None], int]] = []

    def log_metrics(self, metrics: dict[str, float | None], step: int) -> None:
        self.logged.append((dict(metrics), step))


def test_junk_keys_malformed_references_and_refused_moves_are_metrics(fake_redis):
    # fakeredis has no INFO, so the hub numbers that need Redis fail (logged); these totals do not
    tracker = RecordingTracker()
    metrics = LearnerMetrics(fake_redis, ExperimentConfig(), tracker)
    metrics.observe_janitor(JanitorStats(trimmed=0, unread_dropped=0, obs_deleted=3, calls=2, obs_skipped=4,
                                         malformed_removed=2, junk_deleted=3))
    metrics.observe_janitor(JanitorStats(trimmed=0, unread_dropped=0, obs_deleted=0, calls=1, obs_skipped=1))
    receiver = ReceiverStats(chunks=0, steps=0, bytes=0, dead=5, cache_hits=0, cache_misses=0, claimed=0,
                             consumers_removed=0, retained=0, retained_skipped=0, move_errors=2)
    metrics.maybe_flush(LearnerProgress(iteration=7, env_steps=100, param_version=3, mean_return=None, elapsed_s=1.0),
                        {}, receiver, force=True)
    (logged, step), = tracker.logged
    assert step == 7
    assert logged["hub/obs_junk_keys_skipped_total"] == 5.0
    assert logged["hub/obs_junk_keys_deleted_total"] == 3.0
    assert logged["hub/obsref_malformed_removed_total"] == 2.0
    assert logged["hub/move_errors_total"] == 2.0 and logged["hub/dead_entries_total"] == 5.0
    assert logged["hub/obs_deleted_total"] == 3.0


def test_unread_entries_trimmed_for_memory_name_memory_not_max_entries(fake_redis, caplog):
    metrics = LearnerMetrics(fake_redis, ExperimentConfig(), None)
    metrics.observe_janitor(JanitorStats(trimmed=5, unread_dropped=3, obs_deleted=0, calls=1, pressure_trimmed=5))
    metrics.observe_janitor(JanitorStats(trimmed=2, unread_dropped=2, obs_deleted=0, calls=1))
    first, second = [r.getMessage() for r in caplog.records if "had not read" in r.getMessage()]
    assert "maxmemory" in first and "max_entries" not in first
    assert "max_entries" in second


def test_dedup_ratio_is_estimated_only_for_shards_storing_observation_blobs(real_redis, monkeypatch):
    """The estimate parses stream entries on the update's thread; without blobs it is None anyway."""
    config = ExperimentConfig()
    estimated = []
    monkeypatch.setattr(metrics_module, "dedup_ratio",
                        lambda client, keys, length: estimated.append(keys.obsref) or (2.0, 1))
    metrics = LearnerMetrics(real_redis, config, None)
    keys = RunKeys(config.run).shard(0)
    real_redis.xadd(keys.exp, {"x": b"1"})
    assert "hub/dedup_ratio" not in metrics._hub_numbers() and estimated == []
    real_redis.zadd(keys.obsref, {"blob": 1})
    assert metrics._hub_numbers()["hub/dedup_ratio"] == 2.0 and estimated == [keys.obsref]
