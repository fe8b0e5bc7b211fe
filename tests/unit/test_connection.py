import threading
import time

import pytest
import redis

from surreal_redis.connection import Backoff, RedisSettings, block_ms, connect
from surreal_redis.outage import OutageGuard


def test_block_ms_stays_under_half_the_socket_timeout():
    settings = RedisSettings(socket_timeout=2.0)
    assert block_ms(5000, settings) < 1000
    assert block_ms(100, settings) == 100


def test_backoff_is_capped_and_jittered():
    backoff = Backoff(base=0.1, cap=1.0)
    delays = [backoff.next_delay() for _ in range(20)]
    assert all(0 < d <= 1.0 for d in delays) and max(delays) > 0.5
    backoff.reset()
    assert backoff.next_delay() <= 0.2


def test_bad_url_and_settings_named():
    with pytest.raises(ValueError, match="http://x"):
        connect("http://x")
    with pytest.raises(ValueError, match="retries"):
        RedisSettings(retries=-1)


class RecordingStop:
    """A Waiter that never sleeps: it records each wait and sets itself after ``stop_after`` waits."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.waits: list[float] = []
        self.stop_after = stop_after

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.is_set()

    def is_set(self) -> bool:
        return self.stop_after is not None and len(self.waits) >= self.stop_after


def flaky(failures: list[BaseException], result: str = "done"):
    """A call that raises each of ``failures`` in turn, then returns ``result``."""
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return result

    fn.calls = calls
    return fn


def test_outage_guard_rides_out_an_outage_with_capped_backoff(caplog):
    stop = RecordingStop()
    guard = OutageGuard("tester", stop, base=0.1, cap=1.0)
    outage = [redis.ConnectionError("refused")] * 6 + [redis.TimeoutError("slow"),
                                                       redis.exceptions.BusyLoadingError("loading")]
    fn = flaky(outage)
    assert guard.call(fn) == "done"
    assert len(fn.calls) == len(outage) + 1
    assert len(stop.waits) == len(outage) and all(0 < w <= 1.0 for w in stop.waits)
    assert stop.waits[0] <= 0.2 and max(stop.waits) > 0.5  # grows, and stays under the cap
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == len(outage) and all(m.startswith("tester: Redis unavailable") for m in warnings)
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"] == ["tester: Redis reachable again"]
    assert not guard.failing


def test_outage_guard_call_gives_up_when_stopped():
    stop = RecordingStop(stop_after=2)
    fn = flaky([redis.ConnectionError("down")] * 100)
    assert OutageGuard("tester", stop).call(fn) is None
    assert len(fn.calls) == 2  # no call after the stop


def test_outage_guard_lets_other_errors_through():
    stop = RecordingStop()
    for error in (ValueError("bug"), redis.ResponseError("WRONGTYPE")):
        with pytest.raises(type(error)):
            OutageGuard("tester", stop).call(flaky([error]))
    assert stop.waits == []
    only_timeouts = OutageGuard("tester", stop, errors=(redis.TimeoutError,))
    with pytest.raises(redis.ConnectionError):
        only_timeouts.call(flaky([redis.TimeoutError("slow"), redis.ConnectionError("down")]))
    assert len(stop.waits) == 1


def test_outage_guard_in_a_loop_of_its_own_shape(caplog):
    stop = RecordingStop()
    guard = OutageGuard("loop", stop, base=0.5, cap=0.5)
    guard.succeeded()  # nothing failed: nothing logged
    guard.failed(redis.ConnectionError("down"))
    guard.failed(redis.ConnectionError("down"))
    assert guard.failing and len(stop.waits) == 2 and all(0.25 <= w <= 0.5 for w in stop.waits)
    guard.succeeded()
    guard.succeeded()
    assert not guard.failing
    assert sum("reachable again" in r.getMessage() for r in caplog.records) == 1
    guard.failed(redis.ConnectionError("down again"))
    assert stop.waits[-1] <= 0.5  # the backoff starts over after a success


def test_outage_guard_wakes_on_stop():
    stop = threading.Event()
    stop.set()
    guard = OutageGuard("tester", stop, base=60.0, cap=60.0)
    started = time.monotonic()
    guard.failed(redis.ConnectionError("down"))  # would sleep 30-60 s if it ignored the stop
    assert time.monotonic() - started < 30


def test_retry_idempotent_retries_connection_errors_then_raises_the_last():
    from redis.backoff import EqualJitterBackoff

    from surreal_redis.connection import retry_idempotent

    assert isinstance(Backoff(), EqualJitterBackoff)  # redis-py's formula, with a failure count
    settings = RedisSettings(retries=2, backoff_base=0.001, backoff_cap=0.002)
    fn = flaky([redis.ConnectionError("a"), TimeoutError("b")])
    assert retry_idempotent(fn, settings) == "done" and len(fn.calls) == 3
    last = redis.ConnectionError("c")
    fn = flaky([redis.ConnectionError("a"), redis.TimeoutError("b"), last, redis.ConnectionError("d")])
    with pytest.raises(redis.ConnectionError) as raised:
        retry_idempotent(fn, settings)
    assert raised.value is last and len(fn.calls) == 3
    fn = flaky([redis.ResponseError("not a lost reply")])
    with pytest.raises(redis.ResponseError):
        retry_idempotent(fn, settings)
    assert len(fn.calls) == 1
