"""bench/solve.py splits a launch into start-up (launch to the learner's first update) and shutdown
(the learner's stop to launch's exit) from the learner log's stamps, in the format
runtime.setup_logging writes."""

from __future__ import annotations

import importlib
import logging
import sys
from datetime import datetime
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def solve(request):
    sys.path.insert(0, str(BENCH))
    request.addfinalizer(lambda: sys.path.remove(str(BENCH)))
    return importlib.import_module("solve")


def stamp(when: datetime) -> str:
    """A record's time as the learner's log handler writes it (local time, ms)."""
    formatter = logging.Formatter("%(asctime)s")
    record = logging.LogRecord("x", logging.INFO, "", 0, "", None, None)
    record.created, record.msecs = when.timestamp(), when.microsecond // 1000
    return formatter.format(record)


def test_phases_from_the_learner_log(solve):
    started = datetime(2026, 1, 2, 3, 4, 5, 250_000)
    log_text = "\n".join([
        f"{stamp(datetime(2026, 1, 2, 3, 4, 9, 0))} INFO MainProcess surreal_redis.algos.ppo.trainer: PPO on cpu",
        f"{stamp(datetime(2026, 1, 2, 3, 4, 11, 500_000))} INFO MainProcess surreal_redis.learner: first update "
        "done (1.2s after the learner was built)",
        f"{stamp(datetime(2026, 1, 2, 3, 4, 40, 0))} INFO MainProcess surreal_redis.runtime: stopping: train return "
        "480.0 reached stop.target_return=475.0",
        f"{stamp(datetime(2026, 1, 2, 3, 4, 40, 100_000))} INFO MainProcess surreal_redis.learner: learner stopped",
    ])
    split = solve.phases(log_text, started.timestamp(), started.timestamp() + 36.0)
    assert split.startup_s == pytest.approx(6.25)
    assert split.shutdown_s == pytest.approx(1.25)
    assert solve.phases("no stamps", 0.0, 1.0) == (None, None)
