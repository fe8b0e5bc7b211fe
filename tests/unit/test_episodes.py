"""Episode records: training and eval streams, and the train-return stop score (the ACL side is in
tests/integration/test_acl.py)."""


import pytest

from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeReader, EpisodeRecord, TrainReturns
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.keys import RunKeys
from surreal_redis.learner.prefetch import PrefetchQueue

RUN = "eps"


def record(agent: str, mode: str, value: float) -> EpisodeRecord:
    return EpisodeRecord(agent, mode, value, 10, 3, 1.0)


def test_train_and_eval_records_go_to_their_own_streams(fake_redis):
    fake_redis.xadd(RunKeys(RUN).episodes, {"agent": "0", "mode": "train", "return": "1", "length": 1, "version": 0,
                                            "time": 0})
    reader = EpisodeReader(fake_redis, RUN)  # from its first read on
    assert reader.read_new() == []
    log = EpisodeLog(fake_redis, RUN)
    log.record([record("0", "train", 1.5), record("eval-0", "eval", 9.0), record("1", "train", 2.5)])
    # training records wait in the agents' append-only inbox until the learner's reader moves them
    assert fake_redis.llen(RunKeys(RUN).episodes_inbox) == 2 and fake_redis.xlen(RunKeys(RUN).evals) == 1
    got = reader.read_new()
    assert fake_redis.xlen(RunKeys(RUN).episodes) == 3 and not fake_redis.exists(RunKeys(RUN).episodes_inbox)
    assert sorted(got, key=lambda r: r.episode_return) == [record("0", "train", 1.5), record("1", "train", 2.5),
                                                           record("eval-0", "eval", 9.0)]
    assert reader.read_new() == []
    with pytest.raises(ValueError, match="unknown episode mode 'test'"):
        log.record([record("0", "test", 1.0)])


@pytest.mark.parametrize("fields", [
    {"mode": "eval"},  # an eval result claimed in the agents' stream
    {"return": "inf"}, {"return": "nan"}, {"return": "high"}, {"length": "x"},
])
def test_a_malformed_or_misplaced_record_is_counted_and_skipped(fake_redis, fields):
    reader = EpisodeReader(fake_redis, RUN, start_id="0-0")
    good = {"agent": "0", "mode": "train", "return": "1.0", "length": 5, "version": 1, "time": 2.0}
    fake_redis.xadd(RunKeys(RUN).episodes, {**good, **fields})
    fake_redis.xadd(RunKeys(RUN).episodes, good)
    assert reader.read_new() == [EpisodeRecord("0", "train", 1.0, 5, 1, 2.0)] and reader.malformed == 1


def test_a_train_record_in_the_eval_stream_is_not_taken(fake_redis):
    reader = EpisodeReader(fake_redis, RUN, start_id="0-0")
    fake_redis.xadd(RunKeys(RUN).evals, {"agent": "0", "mode": "train", "return": "1", "length": 1, "version": 0,
                                         "time": 0})
    assert reader.read_new() == [] and reader.malformed == 1


def test_stop_score_is_the_lower_median_of_the_agents_means():
    returns = TrainReturns(window=6)
    returns.add([record("0", "train", 1e9)] * 3 + [record("eval-0", "eval", 1e9)])
    assert returns.stop_score() is None and len(returns) == 3  # eval records do not count; window not full
    assert returns.stop_score({"0", "1"}) is None  # agent 1 heartbeats, has sent nothing: not there yet
    returns.add([record("1", "train", 10.0), record("1", "train", 20.0), record("2", "train", 12.0)])
    assert returns.stop_score() is None  # 3 agents: the last 2 of each, 5 episodes of 6 so far
    returns.add([record("2", "train", 12.0)])
    assert returns.stop_score() == 15.0  # means 1e9, 15, 12: one agent's records cannot lift it further
    assert returns.mean() == pytest.approx((2e9 + 54) / 6)  # charts: the last 6 of all agents
    returns.add([record("2", "train", 12.0)] * 5)
    assert returns.stop_score() == 15.0 and returns.mean() == 12.0  # agent 2's flood fills its own window only
    two = TrainReturns(window=2)
    two.add([record("0", "train", 1e9), record("1", "train", 3.0)])
    assert two.stop_score() == 3.0  # of two agents, both must reach a target
    with pytest.raises(ValueError, match="window must be >= 1"):
        TrainReturns(0)


def test_queued_records_that_do_not_parse_are_counted_and_skipped(fake_redis):
    """An agent may push anything to the inbox: junk is counted, never read as a record, and
    never stops the records queued after it."""
    reader = EpisodeReader(fake_redis, RUN, start_id="0-0")
    inbox = RunKeys(RUN).episodes_inbox
    EpisodeLog(fake_redis, RUN).record([record("0", "train", 1.0)])
    junk = [b"", b"not json", b"[1, 2]", b'{"mode": "train"}', b'{"agent": "0", "mode": "eval", "return": 1e9, '
            b'"length": 1, "version": 0, "time": 0}', b"[" * 5000 + b"]" * 5000, b'{"agent": "x"}' + b" " * 2000]
    fake_redis.rpush(inbox, *junk)
    EpisodeLog(fake_redis, RUN).record([record("1", "train", 2.0)])
    got = reader.read_new()
    assert [r.episode_return for r in got] == [1.0, 2.0] and reader.malformed == len(junk)
    assert not fake_redis.exists(inbox)


def test_a_flooding_agent_cannot_push_the_others_out_of_the_stop_window():
    """Each agent id keeps its own window: 1000 records at 500 under one id (the issue's run
    stopped as solved after 18 updates) leave the lower median at the other agents' mean."""
    returns = TrainReturns(window=100)
    for _ in range(25):
        returns.add([record(agent, "train", 20.0) for agent in ("0", "1", "2", "3")])
    returns.add([record("3", "train", 500.0)] * 1000)
    live = {"0", "1", "2", "3"}
    assert returns.stop_score(live) == 20.0 and returns.stop_score() == 20.0
    # records under ids no agent heartbeats with are left out (with live agents known)
    returns.add([record(f"fake-{i}", "train", 500.0) for i in range(50) for _ in range(25)])
    assert returns.stop_score(live) == 20.0
    # agents that heartbeat and have sent nothing count as not reaching it: the flooder and two
    # silent agents give no score
    assert returns.stop_score({"3", "4", "5"}) is None


def test_the_stop_window_fills_per_agent():
    returns = TrainReturns(window=4)  # with 2 agents: the last 2 episodes of each
    returns.add([record("0", "train", 1e9)] * 10)
    assert returns.stop_score({"0", "1"}) is None  # agent 1 has sent nothing: no score yet
    returns.add([record("1", "train", 5.0), record("1", "train", 7.0), record("1", "train", 9.0)])
    assert returns.stop_score({"0", "1"}) == 8.0  # agent 1's last 2; both must reach a target
    assert returns.stop_score({"1"}) is None  # alone: a window of 4, 3 episodes so far


def test_a_flooding_agent_does_not_stop_the_learner(fake_redis, tmp_path):
    """The issue's run: one agent wrote 1000 records at 492.5 under its id and the learner
    stopped as solved; the other three agents' windows keep it running until they reach it."""
    from .test_learner import episode, learner_for, ppo_config

    config = ppo_config(tmp_path, "stop.target_return=475", "stop.return_window=100")
    learner = learner_for(config, fake_redis)
    learner.start()
    for agent in range(4):
        Heartbeat(fake_redis, config.run, agent, config.agent.heartbeat_ttl_s).beat(0, 0, 0, force=True)
    log = EpisodeLog(fake_redis, config.run)
    log.record([episode("train", 20.0, 1, str(agent)) for agent in range(4) for _ in range(25)])
    log.record([episode("train", 492.5, 1, "3")] * 1000)
    learner.iterate(PrefetchQueue(1))
    assert not learner.stop and learner.mean_return() == 492.5  # the charts' window is the flooder's
    log.record([episode("train", 480.0, 1, str(agent)) for agent in (0, 1) for _ in range(25)])
    learner._next_housekeeping = 0.0  # the next round's housekeeping, without waiting a second
    learner.iterate(PrefetchQueue(1))
    assert learner.stop and "train return 480.0" in learner.stop.reason  # 3 of 4 agents reached it
