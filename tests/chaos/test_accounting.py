"""The chaos ledger's classification, on hand-written ledger files (no Redis)."""

import json
import re
from collections import Counter

import pytest

from surreal_redis.hub.experience.ledger import Ledger
from surreal_redis.hub.experience.wire import Origin

from .ledger import Demotion, account, reported_trims


def test_every_acknowledged_chunk_lands_in_exactly_one_class(tmp_path):
    agent, learner = Ledger(tmp_path, "agent"), Ledger(tmp_path, "learner")
    agent.acked("aa", 1, 3)  # chunks aa:1:1..3
    agent.acked("aa", 2, 2)
    agent.acked("bb", 1, 4)
    learner.trained([Origin("aa", 1, 1, 3), Origin("aa", 1, 2, 3), None])
    learner.trained([Origin("aa", 1, 2, 3)])  # twice
    learner.dead([Origin("aa", 1, 3, 3)])
    learner.trained([Origin("cc", 7, 1, 1)])  # no ack line: its agent died before writing it
    in_stream = [Origin("aa", 2, 1, 2), Origin("aa", 1, 1, 3)]  # unread, and an already trained one
    # gone from the stream untrained: aa:2:2, bb:1:1..4 = 5; 3 trims reported
    result = account(tmp_path, in_stream, trims_reported=3)
    assert result.acknowledged == 9
    assert (result.trained_once, result.trained_twice, result.dead_lettered) == (1, 1, 1)
    assert (result.unread_at_stop, result.trimmed, result.unaccounted) == (1, 3, 2)
    assert result.trained_without_ack_record == 1
    assert result.examples["trained twice"] == [Origin("aa", 1, 2, 3)]
    assert len(result.examples["unaccounted"]) == 2
    table = result.table(Counter(redis_kill=2), "yes")
    assert re.search(r"^trained twice \(must be 0\) +1$", table, re.M) and "redis_kill 2" in table
    assert "trained twice: e.g. aa:1:2:3" in table


def test_a_chunk_retrained_after_a_kill_between_its_line_and_the_xack_is_not_twice(tmp_path):
    Ledger(tmp_path, "agent").acked("aa", 1, 2)
    killed = tmp_path / "learner-999999.jsonl"
    killed.write_text(json.dumps({"k": "trained", "o": [["aa", 1, 1, 2]]}) + "\n"
                      + json.dumps({"k": "trained", "o": [["aa", 1, 2, 2]]}) + "\n")
    Ledger(tmp_path, "learner").trained([Origin("aa", 1, 2, 2)])  # handed out again from the pending list
    assert account(tmp_path, [], 0).trained_twice == 1  # without knowing the kill
    result = account(tmp_path, [], 0, killed_learners=[999999])
    assert (result.trained_once, result.trained_twice, result.retrained_after_kill) == (2, 0, 1)
    killed.write_text(json.dumps({"k": "trained", "o": [["aa", 1, 2, 2]]}) + "\n"  # not its last line: twice
                      + json.dumps({"k": "trained", "o": [["aa", 1, 1, 2]]}) + "\n")
    assert account(tmp_path, [], 0, killed_learners=[999999]).trained_twice == 1


def test_trims_are_read_from_every_kind_of_log_line():
    log = ("shard 0: 12 entries trimmed before the learner read them (retention.max_entries=5000 reached)\n"
           "memory pressure: trimmed 40 entries (7 of them unread, dropped) and deleted 3 observations\n"
           "shard 0: 2 entries were trimmed while pending, before anyone stored them\n"
           "memory pressure: trimmed 5 entries (0 of them unread, dropped)\n")
    assert reported_trims(log) == 21


def test_a_chunk_lost_with_a_demoted_primary_is_classed_by_that_demotion_and_no_other(tmp_path):
    ledger = tmp_path / "agent-1.jsonl"
    lines = [{"k": "acked", "tag": "aa", "seq": 1, "n": 2, "t": 100.0, "node": "h:1"},  # long before the kill
             {"k": "acked", "tag": "aa", "seq": 2, "n": 1, "t": 109.9, "node": "h:1"},  # just before it
             {"k": "acked", "tag": "aa", "seq": 3, "n": 1, "t": 109.8, "node": "h:2"},  # a node never demoted
             {"k": "acked", "tag": "aa", "seq": 4, "n": 1, "t": 109.7}]  # no node: standalone
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    Ledger(tmp_path, "learner").trained([Origin("aa", 1, 1, 2)])
    demotion = Demotion("h:1", "kill -9", fault_at=110.0, seen_at=114.0)
    result = account(tmp_path, [], trims_reported=1, demotions=[demotion, Demotion("h:1", "kill -9", 200.0, 204.0)])
    # aa:1:2 (acked 10 s before: it was replicated, so its loss is not the failover's), aa:2:1 lost
    # with the demotion, aa:3:1 and aa:4:1 gone: one covered by the reported trim, one unaccounted
    assert (result.trained_once, result.lost_with_failover, result.trimmed, result.unaccounted) == (1, 1, 1, 2)
    assert list(result.lost_by_demotion) == [demotion]
    assert result.lost_by_demotion[demotion] == [pytest.approx(0.1)]
    assert re.search(r"^lost with a failover or partition +1: 1 acked by h:1 -0.10 to -0.10 s from its kill -9 at "
                     r"\d\d:\d\d:\d\d, demoted$", result.table(Counter(), "yes"), re.M)
