"""bench/envs.py runs on a tiny budget and reports what it promises."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from surreal_redis.embedded import EmbeddedRedis, find_redis_server

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_redis_server() is None, reason="no redis-server binary found"),
              pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="the 'atari' extra is not installed")]


def _bench_module():
    path = Path(__file__).resolve().parents[2] / "bench" / "envs.py"
    spec = importlib.util.spec_from_file_location("bench_envs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_atari_bench_reports_overhead_bytes_and_frames():
    bench = _bench_module()
    _, config, frames, policy = bench.FAMILIES["atari"]
    server = EmbeddedRedis(maxmemory="256mb").start()
    try:
        result = bench.bench_family("atari", config, frames, policy, steps=8, rounds=1, server=server)
    finally:
        server.stop()
    assert result["plain_sps"] > 0 and result["hub_sps"] > 0 and result["policy_sps"] > 0
    assert result["frames_per_s_per_core"] == pytest.approx(4 * result["hub_sps"], rel=1e-3)
    # 4-frame stacks stored naively cost 2 x 4 x 7056 bytes a transition; the hub stores a frame once
    assert result["naive_bytes_per_transition"] > 56_000
    assert result["naive_over_redis"] > 4
