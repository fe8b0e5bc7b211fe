"""Redis Cluster benchmark: ``python bench/cluster.py [--primaries 1,2,3] [--senders N] [--shards N] [--quick]``.

Scaling (always): for each primary count P, a fresh local cluster of P primaries (no replicas);
``--senders`` processes each insert fixed chunks into shard ``i % --shards`` for ``--seconds``
(the shards' salted tags spread them evenly over the primaries), then the learner's receiver
drains every shard. Reports insert throughput (env steps/s acked to the senders) and receive
throughput (env steps/s) per P, and their ratios against P=1 measured in the same run.
Every process (servers, senders, receiver) shares this machine's cores: on 2 cores the CPU, not
Redis, is the bound and the ratios stay near 1; run it with more ``--senders`` on a larger machine.

``--loss N``: N times, a cluster of 3 primaries + 3 replicas; ``--senders`` processes insert at
full speed into shards of one primary, which is killed with SIGKILL, while a learner's receiver
consumes those shards (receive, then ack); after the replica took over the senders go on briefly
and the receiver reads until the shards are quiet. Counted the way the learner sees it: chunks
consumed (handed out; ``handed_twice`` must stay 0), copies delivered again and dropped (the
promoted replica lacked the move, the delivery or the ack), and lost = chunks acked to the
senders - chunks consumed: the window of acknowledged writes that asynchronous replication loses.
``--lag-ms M``: the killed primary's replica is stopped (SIGSTOP) M ms before the kill and resumed
after it, so it lags by that much (on loopback it otherwise keeps up within a millisecond).

``--sender-wait-ms M``: the senders' ``hub.sender.wait_replica_ms`` (an insert counts as stored
once a replica has it), for ``--loss``: then nothing acked may be lost.

``--wait-cost``: parameter publish latency (a ``--param-kb`` model) on a primary with one replica,
with and without ``hub.publisher.wait_replica_ms`` (WAIT 1 replica after the publish), and one
sender's insert throughput with and without ``hub.sender.wait_replica_ms``.

Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import signal
import threading
import time
from functools import partial

import numpy as np
from harness.cluster import LocalCluster

from surreal_redis.connection import connect
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.experience.wire import Origin
from surreal_redis.hub.params import ParameterPublisher, PublisherConfig
from surreal_redis.keys import RunKeys
from surreal_redis.outage import OUTAGE_ERRORS
from surreal_redis.runtime import setup_logging

log = logging.getLogger("bench.cluster")
RUN = "cbench"
ENVS, FLUSH, OBS_DIM = 8, 16, 32  # one chunk: 16 steps x 8 envs of 32 floats


def sender_process(url: str, shard: int, num_shards: int, index: int, seconds: float, wait_ms: int, ready, go,
                   results) -> None:
    """Insert chunks into ``shard`` for ``seconds`` (after ``go``); put the chunks acked."""
    client = connect(url)
    agent_id = shard + num_shards * index  # agents send to shard agent_id % num_shards
    config = SenderConfig(flush_steps=FLUSH, max_wait_s=120, wait_replica_ms=wait_ms)
    sender = ExperienceSender(client, config, RUN, agent_id, num_shards)
    rng = np.random.default_rng(agent_id)
    obs = rng.standard_normal((ENVS, OBS_DIM), dtype=np.float32)
    zeros, actions, rewards = np.zeros(ENVS, bool), np.zeros(ENVS, np.int64), np.ones(ENVS, np.float32)
    ready.put(True)
    go.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(FLUSH):
            obs += 1.0  # new observations every step (no deduplication)
            sender.add(obs, actions, rewards, zeros, zeros)
    sender.flush()
    results.put(sender.stats().chunks)


def run_senders(url: str, senders: int, shards: list[int], num_shards: int, seconds: float,
                during=None, wait_ms: int = 0) -> tuple[int, float]:
    """``senders`` processes over ``shards`` (round robin) for ``seconds``, with
    ``hub.sender.wait_replica_ms`` ``wait_ms``; ``during()`` runs in between. Returns (chunks
    acked, wall seconds)."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=sender_process, args=(url, shards[i % len(shards)], num_shards, i, seconds,
                                                       wait_ms, ready, go, results)) for i in range(senders)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    started = time.perf_counter()
    go.set()
    if during is not None:
        during()
    acked = sum(results.get(timeout=600) for _ in procs)
    wall = time.perf_counter() - started
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a sender exited with code {proc.exitcode}")
    return acked, wall


def scaling(primaries: list[int], senders: int, num_shards: int, seconds: float) -> dict:
    rows = {}
    for count in primaries:
        cluster = LocalCluster(count, replicas=0, maxmemory="1gb").start()
        try:
            client = connect(cluster.url)
            receiver = ExperienceReceiver(client, ReceiverConfig(), RUN, num_shards)
            receiver.start()
            log.info("%d primaries: %d senders over %d shards for %.0f s", count, senders, num_shards, seconds)
            acked, wall = run_senders(cluster.url, senders, list(range(num_shards)), num_shards, seconds)
            received, started = 0, time.perf_counter()
            while received < acked:
                batch = receiver.receive(512, block_ms=100)
                receiver.ack(batch)
                received += len(batch)
                if not batch and time.perf_counter() - started > 120:
                    raise RuntimeError(f"received {received} of {acked} chunks")
            receive_wall = time.perf_counter() - started
            client.close()
        finally:
            cluster.stop()
        rows[count] = {"insert_steps_per_s": round(acked * FLUSH * ENVS / wall),
                       "receive_steps_per_s": round(received * FLUSH * ENVS / receive_wall)}
    base = rows[primaries[0]]
    for row in rows.values():
        row["insert_ratio"] = round(row["insert_steps_per_s"] / base["insert_steps_per_s"], 3)
        row["receive_ratio"] = round(row["receive_steps_per_s"] / base["receive_steps_per_s"], 3)
    return {str(count): row for count, row in rows.items()}


def kill_halfway(cluster: LocalCluster, seconds: float, lag_ms: int = 0, rejoin: bool = False) -> None:
    """Halfway through, SIGKILL the primary of shard 0; with ``lag_ms``, its replica is stopped
    that long before (what it has not read by then is lost) and resumed after the kill. With
    ``rejoin`` the killed node is started again once its replica took over, and rejoins as the
    new primary's replica (senders that wait for a replica wait for it)."""
    key = RunKeys(RUN).shard(0).exp
    primary = cluster.primary_port_of(key)
    replica = next(p for p in cluster.ports if p != primary
                   and cluster.node(p).info("replication").get("master_port") == primary)
    time.sleep(max(0.0, seconds / 2 - lag_ms / 1000))
    if lag_ms:
        cluster.processes[replica].send_signal(signal.SIGSTOP)
        time.sleep(lag_ms / 1000)
    killed = cluster.kill_primary_of(key)
    if lag_ms:
        cluster.processes[replica].send_signal(signal.SIGCONT)
    if rejoin:
        deadline = time.monotonic() + 60
        while cluster.role(replica) != "master":
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {replica} was not promoted within 60 s")
            time.sleep(0.1)
        cluster.restart(killed)


class Consumer(threading.Thread):
    """The learner's side: receive and ack ``shards`` until ``stop``, riding out the failover;
    ``handed`` counts chunks handed out, ``origins`` the distinct ones."""

    def __init__(self, url: str, shards: list[int], stop: threading.Event) -> None:
        super().__init__(name="consumer", daemon=True)
        self.client = connect(url)
        self.receiver = ExperienceReceiver(self.client, ReceiverConfig(block_ms=100), RUN, 6, shards=shards)
        self.receiver.start()
        self.stop, self.handed, self.last_chunk = stop, 0, time.monotonic()
        self.origins: set[Origin | None] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                batch = self.receiver.receive(512, block_ms=100)
            except OUTAGE_ERRORS:
                time.sleep(0.1)
                continue
            self.handed += len(batch)  # in the feed now, as the learner does before it acks
            self.origins.update(item.origin for item in batch)
            if batch:
                self.last_chunk = time.monotonic()
            try:
                self.receiver.ack(batch)
            except OUTAGE_ERRORS:  # kept by the receiver and sent with the next ack
                time.sleep(0.1)


def failover_loss(repeats: int, senders: int, seconds: float, lag_ms: int = 0, wait_ms: int = 0) -> dict:
    runs = []
    for attempt in range(repeats):
        cluster = LocalCluster(3, replicas=1, maxmemory="1gb").start()
        try:
            client = connect(cluster.url)
            owner = client.get_node_from_key(RunKeys(RUN).shard(0).exp).name
            shards = [i for i in range(6) if client.get_node_from_key(RunKeys(RUN).shard(i).exp).name == owner]
            stop = threading.Event()
            consumer = Consumer(cluster.url, shards, stop)
            consumer.start()
            kill = partial(kill_halfway, cluster, seconds, lag_ms, rejoin=wait_ms > 0)
            acked, _ = run_senders(cluster.url, senders, shards, 6, seconds, during=kill, wait_ms=wait_ms)
            cluster.wait_ok()
            while time.monotonic() - consumer.last_chunk < 2.0:  # until the shards are quiet
                time.sleep(0.1)
            stop.set()
            consumer.join()
            client = connect(cluster.url)
            entries = sum(client.xlen(RunKeys(RUN).shard(i).exp) for i in shards)
            client.close()
            consumer.client.close()
        finally:
            cluster.stop()
        consumed = len(consumer.origins)
        runs.append({"acked_chunks": acked, "consumed_chunks": consumed, "handed_twice": consumer.handed - consumed,
                     "redelivered_dropped": consumer.receiver.stats().duplicates_consumed,
                     "stream_entries": entries, "lost_chunks": acked - consumed})
        log.info("failover %d: %s", attempt + 1, runs[-1])
    rates = [r["acked_chunks"] / seconds for r in runs]
    return {"runs": runs, "lost_chunks_max": max(r["lost_chunks"] for r in runs),
            "handed_twice_max": max(r["handed_twice"] for r in runs),
            "redelivered_dropped_max": max(r["redelivered_dropped"] for r in runs),
            "lost_ms_of_inserts_max": round(max(r["lost_chunks"] / rate * 1000 for r, rate in zip(runs, rates)), 1)}


def wait_cost(param_kb: int, publishes: int, seconds: float) -> dict:
    cluster = LocalCluster(1, replicas=1, maxmemory="1gb").start()
    try:
        client = connect(cluster.url)
        params = {"w": np.random.default_rng(0).standard_normal(param_kb * 256, dtype=np.float32)}
        result = {}
        for name, wait_ms in (("no_wait", 0), ("wait_1_replica", 1000)):
            publisher = ParameterPublisher(client, RUN, PublisherConfig(wait_replica_ms=wait_ms))
            times = []
            for i in range(publishes):
                started = time.perf_counter()
                publisher.publish(params, i, force=True)
                times.append(time.perf_counter() - started)
            result[name] = {"publish_ms_median": round(float(np.median(times)) * 1000, 3),
                            "publish_ms_p90": round(float(np.percentile(times, 90)) * 1000, 3)}
        client.close()
        for name, wait_ms in (("insert_no_wait", 0), ("insert_wait_1_replica", 1000)):
            acked, wall = run_senders(cluster.url, 1, [0], 1, seconds, wait_ms=wait_ms)
            result[name] = {"env_steps_per_s": round(acked * ENVS * FLUSH / wall)}
    finally:
        cluster.stop()
    result["wait_ratio"] = round(result["wait_1_replica"]["publish_ms_median"] / result["no_wait"]["publish_ms_median"], 3)
    result["insert_wait_ratio"] = round(result["insert_wait_1_replica"]["env_steps_per_s"]
                                        / result["insert_no_wait"]["env_steps_per_s"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--primaries", default="1,2,3", help="comma-separated primary counts (the first is the baseline)")
    parser.add_argument("--senders", type=int, default=3)
    parser.add_argument("--shards", type=int, default=3, help="redis.num_shards")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of inserting per phase")
    parser.add_argument("--loss", type=int, default=0, help="failover loss runs (0: none)")
    parser.add_argument("--lag-ms", type=int, default=0, help="--loss: the replica lags this long at the kill")
    parser.add_argument("--sender-wait-ms", type=int, default=0, help="--loss: hub.sender.wait_replica_ms")
    parser.add_argument("--wait-cost", action="store_true", help="publish latency and insert rate with and without WAIT")
    parser.add_argument("--param-kb", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="1,2 primaries, 2 senders, 1 s: seconds")
    args = parser.parse_args()
    setup_logging("INFO")
    if args.quick:
        args.primaries, args.senders, args.seconds = "1,2", 2, 1.0
    try:
        primaries = [int(p) for p in args.primaries.split(",")]
    except ValueError:
        parser.error(f"--primaries must be comma-separated integers, got {args.primaries!r}")
    for name, value in (("primaries", min(primaries)), ("senders", args.senders), ("shards", args.shards),
                        ("param-kb", args.param_kb)):
        if value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.seconds <= 0 or args.loss < 0 or args.lag_ms < 0 or args.sender_wait_ms < 0:
        parser.error(f"--seconds must be > 0, --loss, --lag-ms and --sender-wait-ms >= 0, got {args.seconds}, "
                     f"{args.loss}, {args.lag_ms}, {args.sender_wait_ms}")
    out = {"senders": args.senders, "shards": args.shards, "seconds": args.seconds,
           "scaling": scaling(primaries, args.senders, args.shards, args.seconds)}
    if args.loss:
        out["failover_loss"] = failover_loss(args.loss, args.senders, max(args.seconds, 4.0), args.lag_ms,
                                             args.sender_wait_ms)
    if args.wait_cost:
        out["wait_cost"] = wait_cost(args.param_kb, 20, args.seconds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
