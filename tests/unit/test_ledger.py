"""The opt-in experience ledger: what the sender and receiver record, the file per process, the
environment switch, and a reader that survives a line torn by a kill."""

import json
import os
import time

import numpy as np
import pytest

from surreal_redis.hub.experience.ledger import LEDGER_DIR_ENV, Ledger, NullLedger, read_ledger
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.experience.wire import Origin, sender_tag

RUN = "ledger"


def send_steps(sender: ExperienceSender, steps: int, envs: int = 2) -> None:
    zeros = np.zeros(envs, bool)
    for k in range(steps):
        sender.add({"x": np.full((envs, 3), k, np.float32)}, np.zeros(envs), np.full(envs, float(k)), zeros, zeros)


def test_sender_and_receiver_record_every_acked_batch_and_chunk(fake_redis, tmp_path):
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1, ledger=Ledger(tmp_path, "agent"))
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1, ledger=Ledger(tmp_path, "learner"))
    send_steps(sender, 7)  # 3 flushes of 2 envs; the 7th step completes no chunk
    got = receiver.receive(100, 0)
    receiver.ack(got[:4])
    receiver.set_aside(got[4], "unusable", "test")
    records = [record for _, record in read_ledger(tmp_path)]
    tag = sender_tag(sender.uuid)
    acked = [r for r in records if r["k"] == "acked"]
    assert [{k: v for k, v in r.items() if k != "t"} for r in acked] == [
        {"k": "acked", "tag": tag, "seq": s, "n": 2} for s in (1, 2, 3)]  # no "node": not a cluster
    assert all(abs(r["t"] - time.time()) < 60 for r in acked)
    trained = [Origin(*o) for r in records if r["k"] == "trained" for o in r["o"]]
    assert trained == [item.origin for item in got[:4]] and {o.sender for o in trained} == {tag}
    assert [Origin(*o) for r in records if r["k"] == "dead" for o in r["o"]] == [got[4].origin]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({f"agent-{os.getpid()}.jsonl",
                                                                  f"learner-{os.getpid()}.jsonl"})


def test_the_environment_switches_it_on_and_nothing_is_recorded_without_it(fake_redis, tmp_path, monkeypatch):
    monkeypatch.delenv(LEDGER_DIR_ENV, raising=False)
    assert isinstance(Ledger.from_environment("agent"), NullLedger)
    send_steps(ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1), 3)
    monkeypatch.setenv(LEDGER_DIR_ENV, str(tmp_path / "ledger"))
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    monkeypatch.delenv(LEDGER_DIR_ENV)  # read once, at construction
    send_steps(sender, 3)
    ((name, record),) = read_ledger(tmp_path / "ledger")
    assert name == f"agent-{os.getpid()}.jsonl"
    assert record | {"t": 0} == {"k": "acked", "tag": sender_tag(sender.uuid), "seq": 1, "n": 2, "t": 0}


def test_reader_skips_a_torn_last_line_and_refuses_a_bad_one_before_it(tmp_path):
    ledger = Ledger(tmp_path, "agent")
    ledger.acked("ab", 1, 3, node="127.0.0.1:7000")
    ledger.close()
    with ledger.path.open("a") as file:
        file.write('{"k":"acked","ta')  # killed while writing
    ((_, record),) = read_ledger(tmp_path)
    assert record | {"t": 0} == {"k": "acked", "tag": "ab", "seq": 1, "n": 3, "t": 0, "node": "127.0.0.1:7000"}
    with ledger.path.open("a") as file:
        file.write('\n' + json.dumps({"k": "acked", "tag": "ab", "seq": 2, "n": 1}) + "\n")
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        list(read_ledger(tmp_path))


def test_bad_role_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="'a/b'"):
        Ledger(tmp_path, "a/b")
