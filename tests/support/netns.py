"""A multi-host lab on one Linux machine: network namespaces joined by a bridge, for partition tests.

Every host is a namespace ``<tag>-<host>`` with one veth (``eth0``, address ``10.213.<net>.<n>``)
whose other end is a port of a bridge in the lab's switch namespace ``<tag>-sw``. Cutting a host
(:meth:`NetnsLab.cut`) sets its switch port down: from then on nothing it sends reaches anyone and
nothing reaches it (TCP segments queue and are retransmitted, no RST, no error), so that host alone
is partitioned from all the others until :meth:`NetnsLab.heal`. Splitting a group of hosts
(:meth:`NetnsLab.split`) moves their switch ports onto a second bridge: they still reach each other
and nobody else, until :meth:`NetnsLab.join` (a minority side with its clients). Addresses exist inside the lab's
namespaces only: nothing outside can reach them, and two labs on one machine never collide.

Needs root (``ip netns add``); :func:`netns_unavailable` says why a lab cannot be built here.
:meth:`NetnsLab.close` kills every process left in the lab's namespaces and deletes them;
:func:`remove_stale_labs` removes what a killed test run left behind.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

PREFIX = "srlab"
"""Every namespace of a lab is named ``srlab<hex>-<host>``."""
NETNS_DIR = Path("/run/netns")
STALE_AFTER_S = 1800.0
"""A lab namespace older than this is left over from a killed run (no lab test takes so long)."""
_SWITCH = "sw"
SPLIT_BRIDGE = "br1"
"""The bridge :meth:`NetnsLab.split` moves a group of hosts onto."""


def netns_unavailable() -> str | None:
    """Why namespaces cannot be built here (not root, no ``ip``), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{PREFIX}{secrets.token_hex(3)}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; a failure raises RuntimeError with the command and its stderr."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _kill_namespace_processes(namespace: str, timeout_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every process in ``namespace`` (deleting a namespace leaves them running)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                               text=True).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and subprocess.run(["ip", "netns", "pids", namespace],
                                                             capture_output=True, text=True).stdout.split():
            time.sleep(0.1)


def _delete_namespace(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    done = subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, text=True)
    if done.returncode != 0 and (NETNS_DIR / namespace).exists():
        log.warning("could not delete namespace %s: %s", namespace, done.stderr.strip())


def remove_stale_labs(max_age_s: float = STALE_AFTER_S) -> list[str]:
    """Delete lab namespaces older than ``max_age_s`` (left by a killed run) and return their names.
    Younger ones may belong to a lab in use and are left alone."""
    if not NETNS_DIR.is_dir():
        return []
    now = time.time()
    stale = [p.name for p in NETNS_DIR.iterdir()
             if p.name.startswith(PREFIX) and now - p.stat().st_mtime > max_age_s]
    for namespace in stale:
        _delete_namespace(namespace)
    if stale:
        log.info("removed %d stale lab namespace(s): %s", len(stale), ", ".join(stale))
    return stale


@dataclass(frozen=True)
class Host:
    """One host of a lab: its namespace, its address, and its port on the lab's switch."""

    name: str
    namespace: str
    address: str
    switch_port: str


@dataclass
class LabProcess:
    """A process started in a host's namespace; its output goes to ``log_path``."""

    host: Host
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes]

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, chars: int = 3000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait(self, timeout_s: float) -> int | None:
        """The exit code once the process exits within ``timeout_s``, else None (it keeps running)."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send ``sig`` and wait for the exit (SIGKILL after ``timeout_s``); returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit %.0fs after signal %d: killing it", self.name, timeout_s, sig)
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
        return self.process.returncode


class NetnsLab:
    """Hosts ``host_names`` in namespaces on one bridge (see the module docstring).

    Use as a context manager or call :meth:`close`: it runs even when building failed halfway.
    """

    def __init__(self, host_names: Sequence[str], log_dir: Path) -> None:
        if not host_names or len(set(host_names)) != len(host_names) or len(host_names) > 250:
            raise ValueError(f"need 1-250 distinct host names, got {list(host_names)!r}")
        for name in host_names:
            if not name.isalnum() or len(name) > 12 or name == _SWITCH:
                raise ValueError(f"host name {name!r} must be 1-12 letters or digits, not {_SWITCH!r}")
        self.tag = f"{PREFIX}{secrets.token_hex(3)}"
        self.net = secrets.randbelow(256)
        self.log_dir = log_dir
        self.switch = f"{self.tag}-{_SWITCH}"
        self.hosts: dict[str, Host] = {
            name: Host(name, f"{self.tag}-{name}", f"10.213.{self.net}.{i + 1}", f"p{i}-{self.tag[-6:]}")
            for i, name in enumerate(host_names)}
        self.processes: list[LabProcess] = []
        self._namespaces: list[str] = []

    def __enter__(self) -> NetnsLab:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self) -> None:
        """Create the switch (a bridge), every host's namespace, veth and address."""
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        for bridge in ("br0", SPLIT_BRIDGE):  # every port on br0; split groups move to the other
            _ip("-n", self.switch, "link", "add", bridge, "type", "bridge")
            _ip("-n", self.switch, "link", "set", bridge, "up")
        for host in self.hosts.values():
            self._add_namespace(host.namespace)
            _ip("-n", self.switch, "link", "add", host.switch_port, "type", "veth",
                "peer", "name", "eth0", "netns", host.namespace)
            _ip("-n", self.switch, "link", "set", host.switch_port, "master", "br0")
            _ip("-n", self.switch, "link", "set", host.switch_port, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
        log.info("lab %s: %s", self.tag, ", ".join(f"{h.name} {h.address}" for h in self.hosts.values()))

    def _add_namespace(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._namespaces.append(namespace)

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise ValueError(f"no host {name!r} in this lab (hosts: {', '.join(self.hosts)})") from None

    # ---------------------------------------------------------------- partitions
    def cut(self, *names: str) -> None:
        """Partition each named host from every other host (its switch port goes down)."""
        for name in names:
            _ip("-n", self.switch, "link", "set", self.host(name).switch_port, "down")
        log.info("lab %s: cut %s", self.tag, ", ".join(names))

    def heal(self, *names: str) -> None:
        """Undo :meth:`cut` for the named hosts."""
        for name in names:
            _ip("-n", self.switch, "link", "set", self.host(name).switch_port, "up")
        log.info("lab %s: healed %s", self.tag, ", ".join(names))

    def split(self, *names: str) -> None:
        """Partition the named hosts, as a group, from every other host: they reach each other
        and nobody else (their switch ports move to the second bridge)."""
        for name in names:
            _ip("-n", self.switch, "link", "set", self.host(name).switch_port, "master", SPLIT_BRIDGE)
        log.info("lab %s: split %s from the others", self.tag, ", ".join(names))

    def join(self, *names: str) -> None:
        """Undo :meth:`split` for the named hosts."""
        for name in names:
            _ip("-n", self.switch, "link", "set", self.host(name).switch_port, "master", "br0")
        log.info("lab %s: joined %s to the others", self.tag, ", ".join(names))

    def is_cut(self, name: str) -> bool:
        """Whether the host's switch port is down (administratively: :meth:`cut`)."""
        shown = _ip("-n", self.switch, "-o", "link", "show", self.host(name).switch_port)
        flags = shown.partition("<")[2].partition(">")[0].split(",")
        return "UP" not in flags

    # ---------------------------------------------------------------- processes
    def run(self, host_name: str, args: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``args`` to completion in the host's namespace (output captured)."""
        return subprocess.run(["ip", "netns", "exec", self.host(host_name).namespace, *args],
                              capture_output=True, text=True, timeout=timeout_s)

    def start(self, host_name: str, name: str, args: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> LabProcess:
        """Start ``args`` in the host's namespace, output to ``<log_dir>/<name>.log``."""
        host = self.host(host_name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        out = log_path.open("ab")
        process = subprocess.Popen(["ip", "netns", "exec", host.namespace, *args], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=None if env is None else dict(env), cwd=cwd)
        started = LabProcess(host, name, process, log_path, out)
        self.processes.append(started)
        return started

    def close(self) -> None:
        """Stop every process started here, kill whatever else runs in the lab, delete the namespaces."""
        for started in self.processes:
            if started.process.poll() is None:
                started.stop(signal.SIGKILL, timeout_s=10)
            elif not started._log.closed:
                started._log.close()
        for namespace in reversed(self._namespaces):
            _delete_namespace(namespace)
        self._namespaces.clear()


class LabCluster:
    """A Redis Cluster with one node per lab host (``node_hosts``: primaries first, then one
    replica per primary in the same order), configured from ``admin_host`` with redis-cli:
    ``cluster-node-timeout`` ``node_timeout_ms``, no persistence, slots split evenly."""

    def __init__(self, lab: NetnsLab, node_hosts: Sequence[str], primaries: int, admin_host: str,
                 port: int = 6379, node_timeout_ms: int = 2000) -> None:
        if primaries < 1 or len(node_hosts) != 2 * primaries:
            raise ValueError(f"need one replica per primary: {primaries} primaries, hosts {list(node_hosts)!r}")
        self.lab, self.node_hosts, self.primaries = lab, list(node_hosts), primaries
        self.admin_host, self.port, self.node_timeout_ms = admin_host, port, node_timeout_ms

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{self.lab.host(h).address}:{self.port}" for h in self.node_hosts)

    def cli(self, host_name: str, *args: str) -> str:
        """``redis-cli ARGS`` against the node on ``host_name``, run on the admin host."""
        done = self.lab.run(self.admin_host, ["redis-cli", "-h", self.lab.host(host_name).address, "-p",
                                              str(self.port), "--raw", *args], timeout_s=10)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)} on {host_name} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self, slots: int = 16384, timeout_s: float = 60.0) -> LabCluster:
        for name in self.node_hosts:
            address = self.lab.host(name).address
            self.lab.start(name, f"redis-{name}", [
                "redis-server", "--bind", address, "--port", str(self.port), "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{self.lab.tag}-{name}.conf", "--dir", str(self.lab.log_dir),
                "--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-require-full-coverage", "no",
                "--repl-diskless-sync-delay", "0", "--save", "", "--appendonly", "no", "--protected-mode", "no",
                "--maxmemory", "256mb", "--maxmemory-policy", "noeviction"])
        self._until(lambda: all(self._answers(h) for h in self.node_hosts), "nodes answer PING", timeout_s)
        # distinct config epochs before the nodes meet (see testing.cluster.LocalCluster.start)
        for epoch, name in enumerate(self.node_hosts, start=1):
            self.cli(name, "CLUSTER", "SET-CONFIG-EPOCH", str(epoch))
        for i, name in enumerate(self.node_hosts[:self.primaries]):
            self.cli(name, "CLUSTER", "ADDSLOTSRANGE", str(i * slots // self.primaries),
                     str((i + 1) * slots // self.primaries - 1))
        first = self.node_hosts[0]
        for name in self.node_hosts[1:]:
            self.cli(first, "CLUSTER", "MEET", self.lab.host(name).address, str(self.port))
        self._until(lambda: all(len(self.cli(h, "CLUSTER", "NODES").splitlines()) == len(self.node_hosts)
                                for h in self.node_hosts), "nodes meet", timeout_s)
        for primary, replica in zip(self.node_hosts[:self.primaries], self.node_hosts[self.primaries:]):
            primary_id = self.cli(primary, "CLUSTER", "MYID")
            self._until(functools.partial(self._knows, replica, primary_id), f"{replica} knows {primary}", timeout_s)
            self.cli(replica, "CLUSTER", "REPLICATE", primary_id)
        self.wait_ok(timeout_s)
        return self

    def _knows(self, host_name: str, node_id: str) -> bool:
        return node_id in self.cli(host_name, "CLUSTER", "NODES")

    def _answers(self, host_name: str) -> bool:
        try:
            return self.cli(host_name, "PING") == "PONG"
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def roles(self, reachable_from: str | None = None) -> dict[str, str]:
        """host -> "master" or "slave", as the node on ``reachable_from`` (default: the first
        node) sees the cluster (failed nodes included, flagged ``fail`` in the role)."""
        by_address = {f"{self.lab.host(h).address}:{self.port}": h for h in self.node_hosts}
        roles = {}
        for line in self.cli(reachable_from or self.node_hosts[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            address, flags = fields[1].split("@")[0], fields[2].split(",")
            role = "master" if "master" in flags else "slave"
            roles[by_address[address]] = role + (" fail" if "fail" in flags else "")
        return roles

    def primary_of_slot(self, slot: int, reachable_from: str | None = None) -> str:
        """The host serving ``slot`` as the node on ``reachable_from`` sees it (CLUSTER NODES)."""
        by_address = {f"{self.lab.host(h).address}:{self.port}": h for h in self.node_hosts}
        for line in self.cli(reachable_from or self.node_hosts[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            for item in fields[8:]:
                if item.startswith("["):  # a slot being migrated
                    continue
                low, _, high = item.partition("-")
                if int(low) <= slot <= int(high or low):
                    return by_address[fields[1].split("@")[0]]
        raise RuntimeError(f"no node serves slot {slot}")

    def _ok(self, host_name: str) -> bool:
        try:
            info = self.cli(host_name, "CLUSTER", "INFO")
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return "cluster_state:ok" in info

    def wait_ok(self, timeout_s: float = 60.0, hosts: Sequence[str] | None = None) -> None:
        """Until every node (or ``hosts``) says ``cluster_state:ok``, the first of them sees no node
        failed and ``primaries`` primaries, and each replica's link is up."""
        def whole() -> bool:
            names = list(hosts or self.node_hosts)
            if not all(self._ok(h) for h in names):
                return False
            roles = self.roles(names[0])
            if any(role.endswith(" fail") for role in roles.values()) or \
                    sum(role == "master" for role in roles.values()) != self.primaries:
                return False
            replicas = [h for h, role in roles.items() if role == "slave"]
            return all("master_link_status:up" in self.cli(h, "INFO", "replication") for h in replicas)

        self._until(whole, "cluster ok with every replica link up", timeout_s)

    @staticmethod
    def _until(check: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"not within {timeout_s:.0f}s: {what}")
            time.sleep(0.2)
