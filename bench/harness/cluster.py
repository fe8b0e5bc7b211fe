"""A throwaway Redis Cluster on loopback for tests and benchmarks (not used by the package core).

``LocalCluster(primaries, replicas)`` starts ``primaries * (1 + replicas)`` redis-server nodes in
cluster mode (``cluster-node-timeout`` 2000 ms, no persistence, ``noeviction``), splits the slots
evenly over the primaries (CLUSTER ADDSLOTSRANGE, so one or two primaries work too), attaches the
replicas and waits for ``cluster_state:ok`` with every replica link up (~3 s for 3+3). With
``appendonly=True`` every node keeps an AOF fsynced on every write, so a node killed and restarted
(:meth:`LocalCluster.restart`) comes back with everything it acknowledged."""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.crc import key_slot

from surreal_redis.connection import RedisClient
from surreal_redis.embedded import find_redis_server


def attach_replica(replica: RedisClient, port: int, timeout_s: float = 30.0) -> None:
    """Make ``replica`` a replica of the server on 127.0.0.1:``port`` and block until its link is
    up (``master_link_status``); RuntimeError after ``timeout_s``."""
    replica.replicaof("127.0.0.1", port)
    deadline = time.monotonic() + timeout_s
    while replica.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica did not sync with 127.0.0.1:{port} within {timeout_s} s")
        time.sleep(0.02)

SLOTS = 16384


class LocalCluster:
    """``url``: its ``redis+cluster://`` URL; ``node(port)``: a plain client of one node;
    ``kill_primary_of(key)``: SIGKILL the primary serving ``key`` (its replica takes over in ~3 s);
    ``restart(port)``: start a killed node again (same argv and folder: it rejoins, as a replica when
    its slots moved meanwhile); ``role(port)``: ``master`` or ``slave``; ``wait_ok()``: block until
    the cluster is whole again. ``stop()`` kills every node and removes the folder when the cluster
    made it."""

    def __init__(self, primaries: int = 3, replicas: int = 1, folder: Path | None = None,
                 maxmemory: str = "256mb", appendonly: bool = False) -> None:
        binary = find_redis_server()
        if binary is None or shutil.which("redis-cli") is None:
            raise RuntimeError("a local Redis Cluster needs redis-server and redis-cli on PATH")
        self.binary = binary
        self._own_folder = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="sr-cluster-")) if folder is None else Path(folder)
        self.primaries, self.replicas, self.maxmemory = primaries, replicas, maxmemory
        self.appendonly = appendonly
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen] = {}
        self._argv: dict[int, list[str]] = {}

    def _free_port(self) -> int:
        """A free loopback port whose cluster bus port (+10000) is free too."""
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            if port + 10000 >= 65536 or port in self.ports:
                continue
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:self.primaries])

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

    def start(self) -> LocalCluster:
        for _ in range(self.primaries * (1 + self.replicas)):
            port = self._free_port()
            self.ports.append(port)
            folder = self.folder / str(port)
            folder.mkdir(parents=True)
            persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
            self._argv[port] = [
                str(self.binary), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                "--cluster-config-file", str(folder / "nodes.conf"), "--cluster-node-timeout", "2000",
                "--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0", "--dir", str(folder),
                "--save", "", *persistence, "--maxmemory", self.maxmemory,
                "--maxmemory-policy", "noeviction", "--logfile", str(folder / "redis.log")]
            self._spawn(port)
        for port in self.ports:
            self._until(functools.partial(self._pings, port), f"node {port} did not start")
        # distinct config epochs before the nodes meet, as redis-cli --cluster create gives them: left
        # at 0, the nodes resolve the collision by bumping epochs after cluster_state is ok, and a
        # replica whose primary dies before it heard of the bump asks for the failover with a stale
        # epoch, is denied ("slot epoch (5) > reqEpoch (3)") and retries for ever
        for epoch, port in enumerate(self.ports, start=1):
            self.node(port).execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        first = self.node(self.ports[0])
        for i, port in enumerate(self.ports[:self.primaries]):
            lo, hi = i * SLOTS // self.primaries, (i + 1) * SLOTS // self.primaries - 1
            self.node(port).execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        for port in self.ports[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        self._until(lambda: all(len(self.node(p).execute_command("CLUSTER", "NODES").splitlines()) == len(self.ports)
                                for p in self.ports), "nodes did not meet")
        ids = [self.node(p).execute_command("CLUSTER", "MYID").decode() for p in self.ports[:self.primaries]]
        for k, port in enumerate(self.ports[self.primaries:]):
            primary_id = ids[k % self.primaries]  # known by id once the handshake is over
            def knows_primary(p: int = port, i: str = primary_id) -> bool:
                return i in self.node(p).execute_command("CLUSTER", "NODES").decode()

            self._until(knows_primary, "replica does not know its primary")
            self.node(port).execute_command("CLUSTER", "REPLICATE", primary_id)
        self.wait_ok()
        return self

    def _spawn(self, port: int) -> None:
        self.processes[port] = subprocess.Popen(self._argv[port], stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def restart(self, port: int) -> None:
        """Start the killed node on ``port`` again and block until it answers (loading its AOF
        included); RuntimeError if it is still running."""
        if self.processes[port].poll() is None:
            raise RuntimeError(f"node {port} is still running")
        self._spawn(port)
        self._until(functools.partial(self._pings, port), f"node {port} did not restart")

    def role(self, port: int) -> str:
        """``master`` or ``slave``, as the node on ``port`` sees itself."""
        return str(self.node(port).info("replication")["role"])

    def _pings(self, port: int) -> bool:
        try:
            return bool(self.node(port).ping())
        except redis.ConnectionError:
            return False

    def _ok(self) -> bool:
        alive = [p for p, proc in self.processes.items() if proc.poll() is None]
        try:
            infos = [self.node(p).info("replication") for p in alive]
            states = [self.node(p).cluster("info")["cluster_state"] for p in alive]
        except redis.RedisError:
            return False
        return (all(s == "ok" for s in states)
                and sum(i["role"] == "master" for i in infos) == self.primaries
                and all(i.get("master_link_status") == "up" for i in infos if i["role"] == "slave"))

    @staticmethod
    def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(what)
            time.sleep(0.05)

    def wait_ok(self, timeout: float = 60.0) -> None:
        self._until(self._ok, "cluster not ok (state, primaries or replica links)", timeout)

    def primary_port_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        slot = key_slot(key.encode())
        alive = next(p for p, proc in self.processes.items() if proc.poll() is None)
        for start, end, primary, *_ in self.node(alive).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise RuntimeError(f"no node serves slot {slot}")

    def kill_primary_of(self, key: str) -> int:
        """SIGKILL the primary serving ``key``; returns its port."""
        port = self.primary_port_of(key)
        self.processes[port].kill()
        self.processes[port].wait()
        return port

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)
