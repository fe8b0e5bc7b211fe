"""Parameter fan-out benchmark: ``python bench/fanout.py [--readers N] [--megabytes M] [--quick]``.

Starts a primary redis-server (TCP) and ``--replicas`` read replicas of it, publishes one
``--megabytes`` parameter blob, then lets ``--readers`` processes download it ``--downloads``
times each (a fresh :class:`ParameterClient` per download, as agents meeting a new version),
first all from the primary, then through read replicas (``ParameterClient(replicas=...)``).
Server CPU is the ``used_cpu_user + used_cpu_sys`` growth of each redis-server (INFO cpu) over
the reading phase. Every process shares this machine's cores, so the readers' CPU competes with
the servers' and throughput figures are only comparable within one run.

Progress goes to stderr through logging; the last line of stdout is one JSON object: per mode,
wall seconds, GB served, GB/s, server CPU seconds per GB on the primary and on the replicas, and
the ratios ``primary_cpu_per_gb_ratio`` (primary CPU per GB with replicas / without: the load
taken off the learner's server) and ``throughput_ratio`` (GB/s with replicas / without).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import time

import numpy as np
from harness.cluster import attach_replica

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
)
from surreal_redis.runtime import setup_logging

log = logging.getLogger("bench.fanout")
RUN = "fanout"


def server_cpu_s(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def reader(primary_url: str, replica_urls: list[str], downloads: int, ready, go, results) -> None:
    """One reader process: ``downloads`` full downloads, each by a fresh client; puts the bytes
    it loaded and its replica/primary download counts on ``results``."""
    primary = connect(primary_url)
    replicas = [connect(url) for url in replica_urls]
    ready.put(True)
    go.wait()
    loaded = from_replicas = from_primary = 0
    for _ in range(downloads):
        client = ParameterClient(primary, RUN, ParameterClientConfig(), replicas=replicas)
        params, info = client.fetch()
        if params is None:
            raise RuntimeError(f"download failed: {client.rejections} rejections, info {info}")
        loaded += info.nbytes
        from_replicas += client.replica_downloads
        from_primary += client.primary_downloads
    results.put((loaded, from_replicas, from_primary))


def read_phase(primary, replicas, urls: dict, readers: int, downloads: int, use_replicas: bool) -> dict:
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    replica_urls = urls["replicas"] if use_replicas else []
    procs = [ctx.Process(target=reader, args=(urls["primary"], replica_urls, downloads, ready, go, results))
             for _ in range(readers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    cpu_before = [server_cpu_s(c) for c in (primary, *replicas)]
    started = time.perf_counter()
    go.set()
    outcomes = [results.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - started
    cpu = [server_cpu_s(c) - b for c, b in zip((primary, *replicas), cpu_before)]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a reader exited with code {proc.exitcode}")
    gigabytes = sum(o[0] for o in outcomes) / 1e9
    return {"wall_s": round(wall, 3), "gb_served": round(gigabytes, 3), "gb_per_s": round(gigabytes / wall, 3),
            "primary_cpu_s": round(cpu[0], 3), "replicas_cpu_s": round(sum(cpu[1:]), 3),
            "primary_cpu_s_per_gb": round(cpu[0] / gigabytes, 4),
            "replicas_cpu_s_per_gb": round(sum(cpu[1:]) / gigabytes, 4),
            "downloads_from_replicas": sum(o[1] for o in outcomes),
            "downloads_from_primary": sum(o[2] for o in outcomes)}


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_fanout_bench(readers: int, replicas: int, megabytes: int, downloads: int) -> dict:
    servers = [EmbeddedRedis(maxmemory="1gb", port=free_port()).start()]
    servers += [EmbeddedRedis(maxmemory="1gb").start() for _ in range(replicas)]
    clients = [connect(server.url) for server in servers]
    try:
        primary, replica_clients = clients[0], clients[1:]
        primary.config_set("repl-diskless-sync-delay", 0)
        for replica in replica_clients:
            attach_replica(replica, servers[0].port)
        rng = np.random.default_rng(0)
        params = {"w": rng.standard_normal(megabytes * (1 << 20) // 4, dtype=np.float32)}
        ParameterPublisher(primary, RUN, PublisherConfig()).publish(params, 1)
        if primary.wait(replicas, 30_000) < replicas:
            raise RuntimeError("replicas did not acknowledge the publish")
        urls = {"primary": servers[0].url, "replicas": [s.url for s in servers[1:]]}
        log.info("%d readers x %d downloads of %d MB from the primary", readers, downloads, megabytes)
        direct = read_phase(primary, replica_clients, urls, readers, downloads, use_replicas=False)
        log.info("... and through %d replicas", replicas)
        fanned = read_phase(primary, replica_clients, urls, readers, downloads, use_replicas=True)
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop()
    return {"readers": readers, "replicas": replicas, "megabytes": megabytes, "downloads_per_reader": downloads,
            "primary_only": direct, "with_replicas": fanned,
            "primary_cpu_per_gb_ratio": round(fanned["primary_cpu_s_per_gb"] / direct["primary_cpu_s_per_gb"], 4),
            "throughput_ratio": round(fanned["gb_per_s"] / direct["gb_per_s"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--megabytes", type=int, default=10)
    parser.add_argument("--downloads", type=int, default=10, help="downloads per reader and mode")
    parser.add_argument("--quick", action="store_true", help="2 readers, 1 replica, 1 MB, 2 downloads: seconds")
    args = parser.parse_args()
    setup_logging("INFO")
    if args.quick:
        args.readers, args.replicas, args.megabytes, args.downloads = 2, 1, 1, 2
    for name in ("readers", "replicas", "megabytes", "downloads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    print(json.dumps(run_fanout_bench(args.readers, args.replicas, args.megabytes, args.downloads)))


if __name__ == "__main__":
    main()
