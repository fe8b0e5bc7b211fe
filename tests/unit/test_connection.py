import random

import pytest

from surreal_redis.connection import Backoff, RedisSettings, block_ms, connect


def test_block_ms_stays_under_half_the_socket_timeout():
    settings = RedisSettings(socket_timeout=2.0)
    assert block_ms(5000, settings) < 1000
    assert block_ms(100, settings) == 100


def test_backoff_is_capped_and_jittered():
    backoff = Backoff(base=0.1, cap=1.0, rng=random.Random(0))
    delays = [backoff.next_delay() for _ in range(20)]
    assert all(0 < d <= 1.0 for d in delays) and max(delays) > 0.5
    backoff.reset()
    assert backoff.next_delay() <= 0.2


def test_bad_url_and_settings_named():
    with pytest.raises(ValueError, match="http://x"):
        connect("http://x")
    with pytest.raises(ValueError, match="retries"):
        RedisSettings(retries=-1)
