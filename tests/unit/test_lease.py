"""The run's lease on fakeredis: taken by one owner at a time, renewed and released by its owner
only, free once it expired; the keeper renews it and says when another launch took it."""

import json
import logging
import time

import pytest

from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.lease import (
    HELD_BY_ANOTHER,
    RENEWED,
    TAKEN_AGAIN,
    LeaseHeld,
    LeaseKeeper,
    RunLease,
    describe,
)
from surreal_redis.keys import RunKeys


def test_one_owner_at_a_time_and_the_refusal_names_the_holder(fake_redis):
    first = RunLease(fake_redis, "r", folder="/runs/a/r")
    first.acquire()
    holder = json.loads(fake_redis.get(RunKeys("r").lease))
    assert holder["folder"] == "/runs/a/r" and holder["token"] == first.owner["token"]
    assert 0 < fake_redis.pttl(first.key) <= 15000
    second = RunLease(fake_redis, "r", folder="/runs/b/r")
    with pytest.raises(LeaseHeld, match=r"pid \d+ on host .*, folder /runs/a/r") as held:
        second.acquire()
    assert held.value.holder == holder and 0 < held.value.ttl_s <= 15
    assert fake_redis.get(first.key) == first.value.encode()  # the refused launch wrote nothing
    first.acquire()  # its own lease again: renewed, not refused
    RunLease(fake_redis, "other").acquire()  # another run's lease is its own


def test_renewed_and_released_by_its_owner_only(fake_redis):
    owner, other = RunLease(fake_redis, "r", ttl_s=5), RunLease(fake_redis, "r", ttl_s=5)
    owner.acquire()
    fake_redis.pexpire(owner.key, 100)
    assert other.renew() == HELD_BY_ANOTHER and fake_redis.pttl(owner.key) <= 100
    assert other.release() is False and fake_redis.get(owner.key) == owner.value.encode()
    assert owner.renew() == RENEWED and fake_redis.pttl(owner.key) > 4000
    assert owner.release() is True and fake_redis.get(owner.key) is None
    assert owner.release() is False  # nothing left to release


def test_taken_over_only_once_it_expired(fake_redis):
    dead = RunLease(fake_redis, "r", ttl_s=0.2)
    dead.acquire()  # its launcher is killed: nobody renews it
    late = RunLease(fake_redis, "r")
    with pytest.raises(LeaseHeld):
        late.acquire()
    time.sleep(0.3)
    late.acquire()
    assert late.holder()["token"] == late.owner["token"]
    assert dead.renew() == HELD_BY_ANOTHER  # the dead owner, back, cannot renew the new owner's lease
    assert dead.release() is False and late.holder()["token"] == late.owner["token"]


def test_an_expired_lease_nobody_took_is_taken_again_by_its_owner(fake_redis):
    owner = RunLease(fake_redis, "r")
    owner.acquire()
    fake_redis.delete(owner.key)  # Redis came back empty, or was away longer than the TTL
    assert owner.renew() == TAKEN_AGAIN and owner.holder()["token"] == owner.owner["token"]


def test_dropping_an_earlier_run_keeps_the_launchs_own_lease(fake_redis):
    lease = RunLease(fake_redis, "r")
    lease.acquire()
    control = RunControl(fake_redis, "r")
    control.start()
    assert control.drop(keep_lease=True) == 1
    assert lease.holder()["token"] == lease.owner["token"]
    assert control.drop() == 1 and lease.holder() == {}


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="ttl_s must be in 0.001..3600 seconds, got 0"):
        RunLease(None, "r", ttl_s=0)
    assert describe({}) == "another launch"
    assert describe({"pid": 7, "folder": "/f"}) == "its launch (pid 7, folder /f)"


def test_the_keeper_renews_then_releases_and_reports_a_lost_lease(fake_redis, caplog):
    lease = RunLease(fake_redis, "r", ttl_s=0.6)
    lease.acquire()
    fake_redis.pexpire(lease.key, 600_000)  # a renewal sets it back to the TTL
    keeper = LeaseKeeper(lease).start()
    deadline = time.monotonic() + 30
    while fake_redis.pttl(lease.key) > 600 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 0 < fake_redis.pttl(lease.key) <= 600 and not keeper.lost.is_set()
    keeper.stop()
    assert lease.holder() == {}  # released at a clean exit

    lease = RunLease(fake_redis, "r", ttl_s=0.3)
    lease.acquire()
    keeper = LeaseKeeper(lease).start()
    fake_redis.set(lease.key, json.dumps({"token": "x", "pid": 99}))  # another launch took it over
    assert keeper.lost.wait(30)
    keeper.stop()
    assert json.loads(fake_redis.get(lease.key))["pid"] == 99  # never released by the former owner
    assert any("took the run over" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
