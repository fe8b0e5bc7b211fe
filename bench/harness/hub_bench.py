"""The hub benchmark: the experience and parameter paths against naive baselines, same server.

:func:`run_hub_bench` starts a throwaway embedded redis-server and, for three observation kinds
(:mod:`harness.bench_data`), measures

- ``hub_tps`` / ``naive_tps``: transitions per second stored by 2 sender processes, through the
  :class:`~surreal_redis.hub.experience.sender.ExperienceSender` (vectorized ``add``, default
  settings: humanoid's 96 KB chunk payloads are stored apart, ``payload_ref_min_bytes``) versus one
  pipelined XADD per transition carrying the obs and next_obs bytes;
- ``hub_bytes_per_t`` / ``naive_bytes_per_t``: Redis ``used_memory`` growth per stored transition;
- ``recv_tps``: transitions per second the learner-side receiver reads and decodes, and
  ``recv_server_cpu_us_per_t``: redis-server's CPU per transition meanwhile (moving the inboxes into
  the streams, the reads, payload and observation fetches, acks);
- ``{hub,naive}_{client,server}_cpu_us_per_t`` and ``cpu_ratio`` (hub / naive): CPU cost per
  transition of the senders and of redis-server, steadier than rates on a shared machine;

each the best of ``BenchSizes.repeats`` rounds of hub then naive (highest rates, lowest costs:
the rounds least disturbed by other processes on a shared machine, as ``timeit`` advises; every
round's ingest ratio is kept in ``tps_ratio_rounds``), and for parameters the latency of a no-op
poll (next to a PING) and of fetching 1 MB / 10 MB blobs next to a raw GET of the same bytes
(ratios of the best of several tries). Everything is measured, nothing asserted: ``targets`` says
which goals were met. In each round the hub half is measured before the naive half, so any
allocator warm-up favours the baseline.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from surreal_redis.connection import RedisClient, connect
from surreal_redis.embedded import EmbeddedRedis
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)
from surreal_redis.keys import RunKeys

from .bench_data import KINDS, Trajectory, index_tree, obs_bytes, synthetic_trajectory

log = logging.getLogger(__name__)

SENDERS = 2
_WORKER_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class KindSize:
    """Per sender process: ``num_envs`` vectorized envs stepped ``steps`` times."""

    num_envs: int
    steps: int


@dataclass(frozen=True)
class BenchSizes:
    """How much work each measurement does. ``repeats``: rounds of hub then naive ingestion per
    kind (the best of each is reported); ``param_megabytes``: parameter blob sizes (MiB of
    float32); ``fetch_repeats``: fetches per size (medians reported); ``polls``: no-op polls."""

    kinds: dict[str, KindSize] = field(default_factory=lambda: {
        "cartpole": KindSize(16, 2000), "humanoid": KindSize(16, 500), "atari": KindSize(8, 600)})
    repeats: int = 3
    param_megabytes: tuple[int, ...] = (1, 10)
    fetch_repeats: int = 15
    polls: int = 5000

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"BenchSizes.repeats must be >= 1, got {self.repeats}")

    @classmethod
    def quick(cls) -> BenchSizes:
        return cls(kinds={"cartpole": KindSize(16, 800), "humanoid": KindSize(8, 300), "atari": KindSize(8, 200)},
                   repeats=2, fetch_repeats=11, polls=2000)


# ---------------------------------------------------------------- sender processes

def _send_naive(client: RedisClient, run: str, traj: Trajectory) -> int:
    """One XADD per transition (obs, next_obs, action, reward, done flags), pipelined."""
    key = RunKeys(run).shard(0).exp
    first = traj.steps[0]
    size = 2 * len(obs_bytes(index_tree(first.obs, 0)))
    depth = max(16, min(256, (2 << 20) // size))  # ~2 MB per round trip, the sweet spot measured
    pipe = client.pipeline(transaction=False)
    sent = 0
    for t, step in enumerate(traj.steps):
        for env in range(len(step.rewards)):
            pipe.xadd(key, {"obs": obs_bytes(index_tree(step.obs, env)),
                            "next_obs": obs_bytes(traj.next_obs(t, env)),
                            "action": step.actions[env].tobytes(), "reward": step.rewards[env].tobytes(),
                            "terminated": b"1" if step.terminated[env] else b"0",
                            "truncated": b"1" if step.truncated[env] else b"0"})
            sent += 1
            if len(pipe) >= depth:
                pipe.execute()
    pipe.execute()
    return sent


def _send_hub(client: RedisClient, run: str, agent_id: int, traj: Trajectory) -> int:
    sender = ExperienceSender(client, SenderConfig(), run, agent_id, num_shards=SENDERS)
    for step in traj.steps:
        sender.add(step.obs, step.actions, step.rewards, step.terminated, step.truncated,
                   final_obs=step.final_obs, policy_version=1)
    sender.flush(traj.last_obs)
    return sender.stats().steps - sender.stats().steps_dropped


class SendResult(NamedTuple):
    """What a group of sender processes achieved: transitions per second over the union of their
    send windows, transitions sent, and their CPU seconds while sending."""

    tps: float
    sent: int
    cpu_s: float


def _sender_process(mode: str, url: str, run: str, agent_id: int, kind: str, size: KindSize,
                    barrier, results) -> None:
    """Child process body: build the data (untimed), wait for the others, send, report.

    The data's objects (and the parent's, inherited by the fork) are collected and frozen before
    the send: otherwise a full collection that they left due lands in the timed part now and
    then, scanning them all (measured 29 ms, a sixth of an atari hub send) whichever mode runs."""
    try:
        traj = synthetic_trajectory(kind, size.num_envs, size.steps, seed=1000 + agent_id)
        client = connect(url)
        gc.collect()
        gc.freeze()
        barrier.wait(_WORKER_TIMEOUT_S)
        start, cpu = time.monotonic(), time.process_time()
        sent = _send_naive(client, run, traj) if mode == "naive" else _send_hub(client, run, agent_id, traj)
        results.put((start, time.monotonic(), sent, time.process_time() - cpu, None))
    except BaseException:  # the parent re-raises it with the child's traceback
        results.put((0.0, 0.0, 0, 0.0, traceback.format_exc()))


def run_senders(mode: str, url: str, run: str, kind: str, size: KindSize) -> SendResult:
    """Run :data:`SENDERS` sender processes (``mode`` "hub" or "naive") at once. Blocks until all
    finish; raises RuntimeError with a child's traceback if one fails."""
    if mode not in ("hub", "naive"):
        raise ValueError(f"unknown sender mode {mode!r} (use 'hub' or 'naive')")
    ctx = mp.get_context("fork")  # fast start; children open their own connections
    barrier, results = ctx.Barrier(SENDERS), ctx.Queue()
    procs = [ctx.Process(target=_sender_process, args=(mode, url, run, i, kind, size, barrier, results),
                         name=f"{mode}-sender-{i}") for i in range(SENDERS)]
    for proc in procs:
        proc.start()
    try:
        reports = [results.get(timeout=_WORKER_TIMEOUT_S) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    failed = [r[4] for r in reports if r[4] is not None]
    if failed:
        raise RuntimeError(f"{mode} sender failed:\n{failed[0]}")
    sent = sum(r[2] for r in reports)
    elapsed = max(r[1] for r in reports) - min(r[0] for r in reports)
    return SendResult(sent / elapsed, sent, sum(r[3] for r in reports))


# ---------------------------------------------------------------- measurements

def used_memory(client: RedisClient, timeout_s: float = 5.0) -> int:
    """Redis ``used_memory`` less client buffers, read once only this client is connected and two
    readings 0.15 s apart agree: the server frees closed connections and resizes client buffers
    in its 10 Hz cron, and those bytes are not data."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        info = client.info("memory")
        now = int(info["used_memory"]) - int(info["mem_clients_normal"])
        settled = now == last and client.info("clients")["connected_clients"] == 1
        if settled or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.15)


def warm_up(client: RedisClient, kind: str) -> None:
    """Send a little of ``kind`` both ways, then FLUSHALL: first-use allocations in the server
    (script cache, Lua, stream internals) must not count as the first measured mode's data."""
    traj = synthetic_trajectory(kind, num_envs=1, steps=40, seed=0)
    _send_hub(client, "bench-warm-up", 0, traj)
    _send_naive(client, "bench-warm-up", traj)
    client.flushall()


def receive_all(client: RedisClient, run: str, expected: int) -> float:
    """Transitions per second the learner-side receiver reads, resolves, decodes and acks until it
    has seen ``expected`` transitions."""
    receiver = ExperienceReceiver(client, ReceiverConfig(), run, num_shards=SENDERS)
    got = 0
    start = time.monotonic()
    while got < expected:
        batch = receiver.receive(max_chunks=256, block_ms=0)
        if not batch:
            raise RuntimeError(f"receiver found only {got} of {expected} transitions")
        got += sum(item.chunk.num_steps for item in batch)
        receiver.ack(batch)
    return got / (time.monotonic() - start)


def server_cpu_s(client: RedisClient) -> float:
    """CPU seconds redis-server has used so far (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _measure_mode(client: RedisClient, url: str, kind: str, size: KindSize, mode: str) -> dict[str, float]:
    """One ingestion of ``kind`` by ``mode`` ("hub" or "naive") into an emptied server (and, for
    the hub, the learner-side receive of it): rates, bytes and CPU per transition."""
    out: dict[str, float] = {}
    client.flushall()
    before, cpu = used_memory(client), server_cpu_s(client)
    result = run_senders(mode, url, f"bench-{mode}-{kind}", kind, size)
    out[f"{mode}_server_cpu_us_per_t"] = 1e6 * (server_cpu_s(client) - cpu) / result.sent
    out[f"{mode}_client_cpu_us_per_t"] = 1e6 * result.cpu_s / result.sent
    out[f"{mode}_tps"] = result.tps
    out[f"{mode}_bytes_per_t"] = (used_memory(client) - before) / result.sent
    log.info("%s %s: %.0f transitions/s, %.0f bytes, %.1f + %.1f us CPU (sender + server) per "
             "transition (%d sent)", kind, mode, result.tps, out[f"{mode}_bytes_per_t"],
             out[f"{mode}_client_cpu_us_per_t"], out[f"{mode}_server_cpu_us_per_t"], result.sent)
    if mode == "hub":
        cpu = server_cpu_s(client)
        out["recv_tps"] = receive_all(client, f"bench-hub-{kind}", result.sent)
        out["recv_server_cpu_us_per_t"] = 1e6 * (server_cpu_s(client) - cpu) / result.sent
        log.info("%s receive: %.0f transitions/s, %.1f us Redis CPU per transition", kind, out["recv_tps"],
                 out["recv_server_cpu_us_per_t"])
    return out


def measure_kind(client: RedisClient, url: str, kind: str, size: KindSize, repeats: int = 1) -> dict:
    """``repeats`` rounds of hub then naive ingestion of the same transitions, and the receive
    rate, for one kind: the best of the rounds (highest rates, lowest bytes and CPU per
    transition), and ``tps_ratio_rounds``, each round's hub / naive rate.

    Besides the wall-clock rates it reports CPU microseconds per transition of the senders and of
    redis-server: on a shared machine those are steadier than rates.
    """
    warm_up(client, kind)
    rounds = [{**_measure_mode(client, url, kind, size, "hub"), **_measure_mode(client, url, kind, size, "naive")}
              for _ in range(repeats)]
    out: dict = {name: (max if name.endswith("_tps") else min)(r[name] for r in rounds) for name in rounds[0]}
    out["tps_ratio_rounds"] = [r["hub_tps"] / r["naive_tps"] for r in rounds]
    out["tps_ratio"] = out["hub_tps"] / out["naive_tps"]
    out["bytes_ratio"] = out["hub_bytes_per_t"] / out["naive_bytes_per_t"]
    out["cpu_ratio"] = ((out["hub_client_cpu_us_per_t"] + out["hub_server_cpu_us_per_t"])
                        / (out["naive_client_cpu_us_per_t"] + out["naive_server_cpu_us_per_t"]))
    return out


def mlp_params(megabytes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A float32 MLP-like parameter dict of about ``megabytes`` MiB (4 layers plus biases)."""
    rng = np.random.default_rng(seed)
    width = int(np.sqrt(megabytes * (1 << 20) / 4 / 4))
    params = {}
    for layer in range(4):
        params[f"actor/l{layer}/w"] = rng.standard_normal((width, width), dtype=np.float32)
        params[f"actor/l{layer}/b"] = rng.standard_normal(width, dtype=np.float32)
    return params


def measure_params(client: RedisClient, sizes: BenchSizes) -> dict[str, float]:
    """Poll latency (µs, next to a PING's) and full fetch time (s: poll, meta, GETRANGE pieces,
    digest check, decode) versus one raw GET of the same blob: medians and bests over
    ``fetch_repeats`` (each fetch followed by its GET), and ``fetch_<n>m_ratio`` of the bests."""
    run = "bench-params"
    publisher = ParameterPublisher(client, run, PublisherConfig())
    reader = ParameterClient(client, run, ParameterClientConfig())
    blob_key = RunKeys(run).params.blob
    out: dict[str, float] = {}
    for mb in sizes.param_megabytes:
        params = mlp_params(mb)
        fetch_s, raw_s = [], []
        for i in range(sizes.fetch_repeats):
            version = publisher.publish(params, iteration=i)
            if version is None:
                raise RuntimeError("the publish was skipped (publisher min_publish_interval): nothing to fetch")
            start = time.perf_counter()
            fetched, _ = reader.fetch()
            fetch_s.append(time.perf_counter() - start)
            if fetched is None:
                raise RuntimeError(f"fetch of parameter version {version} failed (see the warning above)")
            start = time.perf_counter()
            client.get(blob_key(version))
            raw_s.append(time.perf_counter() - start)
        out[f"fetch_{mb}m_s"] = statistics.median(fetch_s)
        out[f"raw_get_{mb}m_s"] = statistics.median(raw_s)
        out[f"fetch_{mb}m_best_s"] = min(fetch_s)
        out[f"raw_get_{mb}m_best_s"] = min(raw_s)
        out[f"fetch_{mb}m_ratio"] = min(fetch_s) / min(raw_s)
        log.info("params %d MiB: fetch %.2f ms (best %.2f), raw GET %.2f ms (best %.2f)", mb,
                 1e3 * out[f"fetch_{mb}m_s"], 1e3 * min(fetch_s), 1e3 * out[f"raw_get_{mb}m_s"], 1e3 * min(raw_s))
    # PINGs interleaved with the polls give the round-trip floor under the same machine load.
    polls, pings = [], []
    for _ in range(sizes.polls):
        start = time.perf_counter()
        reader.fetch()
        middle = time.perf_counter()
        client.ping()
        polls.append(middle - start)
        pings.append(time.perf_counter() - middle)
    for name, samples in (("poll", polls), ("ping", pings)):
        out[f"{name}_p50_us"] = 1e6 * float(np.percentile(samples, 50))
        out[f"{name}_p99_us"] = 1e6 * float(np.percentile(samples, 99))
    out["poll_vs_ping_p50"] = out["poll_p50_us"] / out["ping_p50_us"]
    log.info("params poll: p50 %.0f us, p99 %.0f us (PING p50 %.0f us, p99 %.0f us)", out["poll_p50_us"],
             out["poll_p99_us"], out["ping_p50_us"], out["ping_p99_us"])
    return out


def check_targets(results: dict) -> dict[str, dict]:
    """Each goal with its measured value and whether it was met."""
    goals = []
    for kind in KINDS:
        if kind in results:
            r = results[kind]
            goals.append((f"{kind}_tps_ratio", r["tps_ratio"], ">=", 5.0 if kind == "atari" else 2.0))
            goals.append((f"{kind}_bytes_ratio", r["bytes_ratio"], "<=", 0.05 if kind == "atari" else 0.55))
    if "cartpole" in results:
        goals.append(("cartpole_recv_tps", results["cartpole"]["recv_tps"], ">=", 300_000.0))
    params = results["params"]
    goals.append(("poll_p99_us", params["poll_p99_us"], "<", 1000.0))
    goals += [(name, params[name], "<=", 1.3) for name in params if name.endswith("m_ratio")]
    return {name: {"value": value, "target": f"{op} {bound:g}",
                   "met": value >= bound if op == ">=" else value <= bound if op == "<=" else value < bound}
            for name, value, op, bound in goals}


def run_hub_bench(quick: bool, sizes: BenchSizes | None = None) -> dict:
    """Run the whole benchmark on a fresh embedded redis-server and return the results.

    ``quick`` picks :meth:`BenchSizes.quick` (under a minute on 2 cores) unless ``sizes`` is
    given. Blocks for the duration; starts and stops its own server and sender processes.
    Keys: one dict per kind in :data:`KINDS`, ``params``, ``targets``, ``sizes``, ``repeats``, ``redis``.
    """
    sizes = sizes or (BenchSizes.quick() if quick else BenchSizes())
    unknown = set(sizes.kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown observation kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
    started = time.monotonic()
    with EmbeddedRedis(maxmemory="4gb") as server:
        client = connect(server.url)
        try:
            results: dict = {"quick": quick, "redis": client.info("server")["redis_version"], "repeats": sizes.repeats,
                             "sizes": {k: [SENDERS, s.num_envs, s.steps] for k, s in sizes.kinds.items()}}
            for kind, size in sizes.kinds.items():
                log.info("measuring %s: %d senders x %d envs x %d steps", kind, SENDERS, size.num_envs, size.steps)
                results[kind] = measure_kind(client, server.url, kind, size, sizes.repeats)
            client.flushall()
            results["params"] = measure_params(client, sizes)
        finally:
            client.close()
    results["targets"] = check_targets(results)
    results["seconds"] = time.monotonic() - started
    return results
