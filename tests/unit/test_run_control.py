"""RunControl and StopWatch on fakeredis: stop requests, learner status, stored config, dropping a run."""

import json
import time

import numpy as np
import pytest
import redis

from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.run.control import RunControl, StopWatch
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.keys import RunKeys
from surreal_redis.runtime import StopFlag


def test_stop_requests_and_a_new_start(fake_redis):
    control = RunControl(fake_redis, "r")
    assert control.stopping() == (False, "")  # nothing written yet
    control.start()
    assert control.stopping() == (False, "")
    control.request_stop("reached 100 env steps")
    assert control.stopping() == (True, "reached 100 env steps")
    assert RunControl(fake_redis, "other").stopping() == (False, "")
    control.start()  # a resumed run is running again, without the old reason
    assert control.stopping() == (False, "")


def test_learner_status_expires_and_says_whether_it_is_alive(fake_redis):
    control = RunControl(fake_redis, "r")
    assert control.learner_status() == {} and control.learner_alive() == {}
    status = {"pid": 42, "iteration": 3, "state": "running", "time": time.time()}
    control.write_learner_status(status, ttl_s=60)
    assert control.learner_status() == status and control.learner_alive() == status
    assert 0 < fake_redis.ttl(RunKeys("r").learner) <= 60
    control.write_learner_status(dict(status, time=time.time() - 31), ttl_s=60)
    assert control.learner_alive() == {}  # a report that old is a dead learner's
    control.write_learner_status(dict(status, state="stopped"), ttl_s=60)
    assert control.learner_alive() == {}
    slow = dict(status, time=time.time() - 100, every_s=60)  # learner.metrics_every_s: 60
    control.write_learner_status(slow, ttl_s=600)
    assert control.learner_alive() == slow  # three of its intervals, not 30 s
    control.write_learner_status(dict(slow, time=time.time() - 181), ttl_s=600)
    assert control.learner_alive() == {}
    control.write_learner_status(status, ttl_s=0)  # never a key without a TTL
    assert fake_redis.ttl(RunKeys("r").learner) == 1


def test_an_exited_learner_is_not_taken_for_a_running_one(fake_redis):
    control = RunControl(fake_redis, "r")
    assert not control.mark_learner_exited(42, -9)  # no report: nothing to mark
    running = {"pid": 42, "iteration": 3, "state": "running", "time": time.time()}
    control.write_learner_status(running, ttl_s=60)
    assert not control.mark_learner_exited(43, -9)  # another learner's report is left alone
    assert control.learner_alive() == running
    assert control.mark_learner_exited(42, -9)
    status = control.learner_status()
    assert status["state"] == "exited" and status["exit_code"] == -9 and status["iteration"] == 3
    assert control.learner_alive() == {}
    assert fake_redis.ttl(RunKeys("r").learner) > 60  # the last report stays for the summary
    assert not control.mark_learner_exited(42, -9)  # once
    control.write_learner_status(dict(running, state="stopped"), ttl_s=60)
    assert not control.mark_learner_exited(42, 0)  # a clean stop keeps its own state
    assert control.learner_status()["state"] == "stopped"


def test_stored_config_round_trips(fake_redis):
    control = RunControl(fake_redis, "r")
    assert control.stored_config() is None
    control.store_config("algo: ppo\nexperiment:\n  name: r\n")
    assert control.stored_config() == "algo: ppo\nexperiment:\n  name: r\n"
    assert RunControl(fake_redis, "r2").stored_config() is None


def test_drop_deletes_every_key_of_the_run_and_nothing_else(fake_redis):
    for run in ("run", "run2", "run-b"):
        control = RunControl(fake_redis, run)
        control.start()
        control.store_config("algo: ppo\n")
        control.write_learner_status({"pid": 1}, ttl_s=60)
        Heartbeat(fake_redis, run, 0, ttl_s=30).beat(1, 0, 1)
        for shard in (0, 1):
            sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2, dedup_min_bytes=16), run, shard, 2)
            for _ in range(3):
                sender.add(np.arange(2 * 8, dtype=np.float32).reshape(2, 8), np.zeros(2, np.int64),
                           np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool))
        fake_redis.hset(RunKeys(run).params.meta, "version", 1)
    before = {k.decode() for k in fake_redis.keys("*")}
    mine = {k for k in before if k.startswith(("sr:{run}", "sr:{run.s", "sr:{run.p}"))}
    assert any(":obs:" in k for k in mine) and any(k.startswith(RunKeys("run").shard(1).tag) for k in mine)
    assert RunControl(fake_redis, "run").drop() == len(mine)
    assert {k.decode() for k in fake_redis.keys("*")} == before - mine
    assert RunControl(fake_redis, "run").drop() == 0


class CountingControl(RunControl):
    def __init__(self, client, run):
        super().__init__(client, run)
        self.polls = 0

    def stopping(self):
        self.polls += 1
        return super().stopping()


def test_stop_watch_notices_a_stop_request_and_sets_the_flag(fake_redis):
    flag = StopFlag(install_handlers=False)
    control = CountingControl(fake_redis, "r")
    control.start()
    watch = StopWatch(flag, control, poll_s=0.05)
    assert not watch.is_set() and not watch.wait(0.12)
    RunControl(fake_redis, "r").request_stop("surreal-redis stop")
    assert watch.wait(5.0)
    assert flag.is_set() and flag.reason == "run stopping (surreal-redis stop)"
    polls = control.polls
    assert watch.is_set() and watch.wait(5.0) and control.polls == polls  # set: no more round trips


def test_stop_watch_polls_redis_at_most_every_poll_s(fake_redis):
    control = CountingControl(fake_redis, "r")
    watch = StopWatch(StopFlag(install_handlers=False), control, poll_s=3600)
    for _ in range(100):
        assert not watch.is_set()
    assert control.polls == 1


def test_stop_watch_wakes_on_the_flag_and_rides_out_an_outage():
    fakeredis = pytest.importorskip("fakeredis")
    server = fakeredis.FakeServer()
    server.connected = False
    down = RunControl(fakeredis.FakeRedis(server=server), "r")
    with pytest.raises(redis.ConnectionError):
        down.stopping()
    flag = StopFlag(install_handlers=False)
    watch = StopWatch(flag, down, poll_s=0.05)
    assert not watch.is_set()  # Redis unreachable: not a stop
    flag.set("signal SIGTERM")
    assert watch.is_set() and watch.wait(3600)


def test_stop_watch_rejects_a_bad_poll_interval(fake_redis):
    with pytest.raises(ValueError, match="-1"):
        StopWatch(StopFlag(install_handlers=False), RunControl(fake_redis, "r"), poll_s=-1)


def test_learner_status_is_json(fake_redis):
    RunControl(fake_redis, "r").write_learner_status({"pid": 7, "mean_return": None}, ttl_s=5)
    assert json.loads(fake_redis.get(RunKeys("r").learner)) == {"pid": 7, "mean_return": None}


@pytest.mark.parametrize("every_s", [-1, 3601, float("nan")])
def test_the_learners_report_interval_is_bounded(every_s):
    from surreal_redis.config import LearnerConfig

    with pytest.raises(ValueError, match=r"metrics_every_s must be in 0..3600 seconds, got"):
        LearnerConfig(metrics_every_s=every_s)
