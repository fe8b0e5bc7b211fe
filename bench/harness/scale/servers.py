"""The servers of one scale-bench case (one primary, read replicas, or a Redis Cluster) and
what the bench reads from them and from the machine while it runs."""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import redis

from surreal_redis.connection import RedisClient, RedisSettings, connect
from surreal_redis.embedded import EmbeddedRedis
from surreal_redis.keys import RunKeys

from ..cluster import LocalCluster, attach_replica
from ..hub_bench import server_cpu_s
from .spec import RUN, CaseSpec

PATIENT = RedisSettings(socket_timeout=120.0)  # the bench's own INFO reads wait out a busy server
OUTAGES = (redis.ConnectionError, redis.TimeoutError)


def rows_array(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    """Measurement rows (time, value, ...) as a float64 array of ``width`` columns (none: 0 rows)."""
    return np.asarray(rows, dtype=np.float64).reshape(-1, width)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class HubServers(NamedTuple):
    """The servers of one case. ``url``: what agents, reader and publisher connect to (a
    ``redis+cluster://`` URL for a cluster); ``replica_urls``: parameter read replicas;
    ``servers``: (label, client of that one server) for INFO; ``params_server``: the label of the
    server holding the parameter keys."""

    url: str
    replica_urls: list[str]
    servers: list[tuple[str, RedisClient]]
    params_server: str


@contextmanager
def hub_servers(spec: CaseSpec, maxmemory: str = "8gb") -> Iterator[HubServers]:
    """Start the case's servers (TCP on loopback, as remote agents reach them); stop them after."""
    if spec.hub == "cluster":
        cluster = LocalCluster(primaries=spec.primaries, replicas=0, maxmemory=maxmemory).start()
        clients: list[RedisClient] = []
        try:
            ports = cluster.ports[:spec.primaries]
            clients = [connect(f"redis://127.0.0.1:{port}/0", PATIENT) for port in ports]
            params_port = cluster.primary_port_of(RunKeys(RUN).params.meta)
            yield HubServers(cluster.url, [], [(f"node{i}", c) for i, c in enumerate(clients)],
                             f"node{ports.index(params_port)}")
        finally:
            for client in clients:
                client.close()
            cluster.stop()
        return
    count = 1 + (spec.replicas if spec.hub == "replicas" else 0)
    servers = [EmbeddedRedis(maxmemory=maxmemory, port=_free_port()).start() for _ in range(count)]
    clients = [connect(server.url, PATIENT) for server in servers]
    try:
        clients[0].config_set("repl-diskless-sync-delay", 0)
        for replica in clients[1:]:
            attach_replica(replica, servers[0].port)
        labels = ["primary"] + [f"replica{i}" for i in range(1, count)]
        yield HubServers(servers[0].url, [s.url for s in servers[1:]], list(zip(labels, clients)), "primary")
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop()


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores so far (/proc/stat)."""
    with open("/proc/stat") as stat:
        values = [float(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)
    return sum(values) - idle, sum(values)


def snapshot(servers: Sequence[tuple[str, RedisClient]]) -> dict[str, Any]:
    """Now (``t``), the machine's busy jiffies and, per server label, its CPU seconds, clients,
    memory, network bytes and per-command microseconds so far (INFO; blocks for its round trips)."""
    out: dict[str, Any] = {"t": time.monotonic(), "machine": _machine_busy()}
    for label, client in servers:
        stats = client.info("stats")
        memory = client.info("memory")
        out[label] = {
            "cpu": server_cpu_s(client),
            "clients": int(client.info("clients")["connected_clients"]),
            "mem_clients": int(memory["mem_clients_normal"]),
            "used_memory": int(memory["used_memory"]),
            "net_out": int(stats["total_net_output_bytes"]),
            "net_in": int(stats["total_net_input_bytes"]),
            "cmd_usec": {name.removeprefix("cmdstat_"): float(v["usec"])
                         for name, v in client.info("commandstats").items()},
        }
    return out


class Mailbox:
    """The children's messages ``(kind, pid, payload)``, kept until asked for."""

    def __init__(self, results: Any) -> None:
        self.results = results
        self.kept: dict[tuple[str, int], Any] = {}

    def wait_for(self, pids: set[int], what: str, timeout: float,
                 servers: Sequence[tuple[str, RedisClient]] = (), samples: list[dict[str, Any]] | None = None
                 ) -> dict[int, Any]:
        """The ``what`` messages of ``pids``; raises with a child's traceback. With ``samples``,
        a snapshot of ``servers`` is appended every 0.5 s meanwhile."""
        deadline = time.monotonic() + timeout
        while not all((what, pid) in self.kept for pid in pids):
            try:
                kind, pid, payload = self.results.get(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = [pid for pid in pids if (what, pid) not in self.kept]
                    raise RuntimeError(f"{len(missing)} processes not {what} within {timeout:.0f}s") from None
                if samples is not None:
                    samples.append(snapshot(servers))
                continue
            if kind == "error":
                raise RuntimeError(f"a bench process failed:\n{payload}")
            self.kept[(kind, pid)] = payload
        return {pid: self.kept.pop((what, pid)) for pid in pids}


def sleep_until(instant: float, servers: Sequence[tuple[str, RedisClient]], samples: list[dict[str, Any]]) -> None:
    """Sleep until the monotonic ``instant``, appending a snapshot of ``servers`` every 0.5 s."""
    while (left := instant - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        if time.monotonic() < instant:
            samples.append(snapshot(servers))
