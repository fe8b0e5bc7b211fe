"""Rate limiters: Reverb's blocking rules and constructor validation."""

from __future__ import annotations

import pytest

from surreal_redis.replay.rate_limiter import MinSize, RateLimiterConfig, SampleToInsertRatio


def test_min_size_blocks_sampling_until_enough_inserts():
    limiter = MinSize(3)
    limiter.record_insert(2)
    assert not limiter.can_sample(1)
    assert limiter.can_insert(1000)
    limiter.record_insert(1)
    assert limiter.can_sample(10_000)  # no ratio to keep
    limiter.record_sample(10_000)
    assert limiter.can_sample(1) and limiter.can_insert(1)


def test_ratio_blocks_the_side_that_runs_ahead():
    # 2 samples per insert after 10 inserts, drift of +-4 samples allowed
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=4.0)
    assert limiter.min_diff == 16.0 and limiter.max_diff == 24.0
    assert limiter.can_insert(10)  # stage 1: inserts are free up to the min size
    limiter.record_insert(10)
    assert limiter.can_sample(4) and not limiter.can_sample(5)  # 20 - 4 = 16 >= 16, 15 < 16
    assert limiter.can_insert(2) and not limiter.can_insert(3)  # 24 <= 24, 26 > 24
    limiter.record_insert(2)  # learner fell behind: inserts must wait for samples
    assert not limiter.can_insert(1)
    limiter.record_sample(2)
    assert limiter.can_insert(1)
    limiter.record_sample(6)  # 24 - 8 = 16: sampling is now at its bound
    assert not limiter.can_sample(1)
    limiter.record_insert(1)
    assert limiter.can_sample(2) and not limiter.can_sample(3)
    assert (limiter.inserts, limiter.samples) == (13, 8)


def test_sampling_waits_for_min_size_even_with_slack():
    limiter = SampleToInsertRatio(samples_per_insert=0.5, min_size_to_sample=4, error_buffer=100.0)
    limiter.record_insert(3)
    assert not limiter.can_sample(1)
    limiter.record_insert(1)
    assert limiter.can_sample(1)


def test_constructor_arguments_are_validated():
    with pytest.raises(ValueError, match=r"error_buffer \(1.5\) must be >= max\(1, samples_per_insert\) = 2.0"):
        SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=1.5)
    with pytest.raises(ValueError, match="samples_per_insert must be > 0, got 0"):
        SampleToInsertRatio(samples_per_insert=0, min_size_to_sample=1, error_buffer=1.0)
    with pytest.raises(ValueError, match="min_size_to_sample must be >= 1, got 0"):
        MinSize(0)
    with pytest.raises(ValueError, match="item count must be >= 1, got 0"):
        MinSize(1).can_sample(0)


def test_config_builds_the_right_limiter():
    assert isinstance(RateLimiterConfig(min_size_to_sample=5).make(), MinSize)
    limiter = RateLimiterConfig(min_size_to_sample=5, samples_per_insert=8.0, error_buffer=16.0).make()
    assert isinstance(limiter, SampleToInsertRatio) and limiter.max_diff == 56.0
    with pytest.raises(ValueError, match="must be set together"):
        RateLimiterConfig(samples_per_insert=8.0)
    with pytest.raises(ValueError, match=r"error_buffer \(2.0\) must be >= max\(1, samples_per_insert\) = 8.0"):
        RateLimiterConfig(samples_per_insert=8.0, error_buffer=2.0)


def test_state_dict_carries_the_counts():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=4.0)
    limiter.record_insert(12)
    limiter.record_sample(6)
    restored = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=4.0)
    restored.load_state_dict(limiter.state_dict())
    assert (restored.inserts, restored.samples) == (12, 6)
    assert restored.sample_allowance() == limiter.sample_allowance() == 2  # 24 - 6 - 16
    with pytest.raises(ValueError, match="rate limiter counts must be >= 0, got inserts -1, samples 0"):
        restored.load_state_dict({"inserts": -1, "samples": 0})
