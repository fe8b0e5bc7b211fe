"""The scale bench's load generator at tiny N on real redis-server processes: every chunk the
simulated agents stored reaches the learner-side reader and is acked exactly once, and the
latencies, server loads and capacities come out of the measurement (values are not checked
against any time: the machine may be busy)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from harness import scale
from harness.scale import BroadcastOptions, CaseSpec, run_case

from surreal_redis.embedded import find_redis_server

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="needs redis-server")

PARAMS = {"actor.0.weight": np.linspace(-1, 1, 1 << 16, dtype=np.float32).reshape(256, 256),
          "obs_normalizer.stats._.mean": np.zeros(17)}


def _tiny(env: str, **changes) -> CaseSpec:
    return CaseSpec(env, 4, workers=2, warmup_s=0.2, quiet_s=1.0, loaded_s=3.0, publish_every_s=0.5,
                    idle_priority=False, **changes)


def _assert_exactly_once(out: dict) -> None:
    assert out["chunks_stored"] > 0
    assert out["chunks_dropped"] == 0 and out["steps_dropped"] == 0
    assert out["chunks_acked"] == out["chunks_stored"]
    assert out["chunks_unique"] == out["chunks_stored"]
    assert out["chunks_duplicated"] == 0
    assert out["dead_letters"] == {}


def _assert_latencies(summary: dict, least: int) -> None:
    assert summary["n"] >= least
    if summary["n"]:
        assert 0 < summary["p50_ms"] <= summary["p99_ms"]


def test_pong_agents_free_production_every_chunk_once_and_latencies_reported():
    out = run_case(_tiny("pong"), PARAMS)
    _assert_exactly_once(out)
    totals = out["totals"]
    _assert_latencies(totals["insert"], least=4)  # each agent's last flush at least
    _assert_latencies(totals["poll"], least=1)
    _assert_latencies(totals["download"], least=1)
    assert totals["claim"]["n"] == 0
    assert out["phase_b"]["downloads"] >= 1 and out["phase_b"]["gb_served"] > 0
    assert 0 <= out["phase_b"]["version_age_p50"] <= out["phase_b"]["version_age_p99"]
    assert out["param_nbytes"] > PARAMS["actor.0.weight"].nbytes
    assert out["connections"]["primary"] >= 4  # one per simulated agent
    assert out["mem_per_connection_bytes"]["primary"] > 0
    assert out["redis_cpu_s_per_1k_total"] is None or out["redis_cpu_s_per_1k_total"] >= 0
    for phase in ("phase_a", "phase_b"):
        assert out[phase]["produced_sps"] >= 0 and out[phase]["redis_cpu_frac_max"] >= 0
        _assert_latencies(out[phase]["probe_poll"], least=1)


def test_halfcheetah_lockstep_claims_and_fp16_every_other_version():
    """hub.publisher.dtype float16 and hub.params_client.min_version_lag 2: claims name the live
    version, which agents download whatever the lag (else they would wait for it forever)."""
    options = BroadcastOptions(dtype="float16", min_version_lag=2)
    out = run_case(_tiny("halfcheetah", sync="lockstep", broadcast=options), PARAMS)
    _assert_exactly_once(out)
    totals = out["totals"]
    _assert_latencies(totals["claim"], least=4)  # every flush is claimed first
    _assert_latencies(totals["insert"], least=4)
    assert totals["poll"]["n"] == 0  # on grants, claims tell the live version
    # the blob went out as float16: about half the float32 bytes
    assert out["param_nbytes"] < 0.6 * sum(v.nbytes for v in PARAMS.values())


def test_pong_agents_polling_with_a_lag_of_2_download_every_other_float16_version():
    spec = _tiny("pong", broadcast=BroadcastOptions(dtype="float16", min_version_lag=2))
    out = run_case(spec, PARAMS)
    _assert_exactly_once(out)
    assert out["param_fetch_failures"] == 0
    assert out["param_nbytes"] < 0.6 * sum(v.nbytes for v in PARAMS.values())
    # ~6 publishes in phase B: every agent downloads at most every other one (every one: ~24)
    publishes = spec.loaded_s / spec.publish_every_s
    assert 1 <= out["phase_b"]["downloads"] <= spec.agents * (publishes / 2 + 1)


def test_replicas_serve_the_downloads():
    out = run_case(_tiny("halfcheetah", hub="replicas"), PARAMS)
    _assert_exactly_once(out)
    assert set(out["connections"]) == {"primary", "replica1", "replica2"}
    assert out["totals"]["download"]["n"] >= 1
    assert out["phase_b"]["gb_from_replicas"] > 0


def test_version_ages_count_publishes_behind_on_the_clock():
    publishes = np.array([[10.0, 1, 0], [11.0, 2, 0], [12.0, 3, 0]])
    held = [np.array([[9.0, 1], [11.5, 2]]), np.array([[9.0, 1], [12.2, 3]])]
    ages = scale.version_ages(held, publishes, 10.0, 12.5)
    grid = np.arange(10.0, 12.5, 0.05)
    live = np.where(grid >= 12.0, 3, np.where(grid >= 11.0, 2, 1))
    first = live - np.where(grid >= 11.5, 2, 1)
    second = live - np.where(grid >= 12.2, 3, 1)
    np.testing.assert_array_equal(ages, np.concatenate([first, second]))


def test_capacity_adds_idle_experience_and_parameter_loads():
    spec = CaseSpec("pong", 100, publish_every_s=1.0)  # 500 env steps/s per agent
    out = scale.capacity(spec, fixed={"primary": 0.1}, per_t={"primary": 1e-5}, per_gb={"primary": 1.0},
                               download_share={"primary": 1.0}, nbytes=1_000_000, params_server="primary")
    assert out["needed_gb_per_s"] == pytest.approx(0.1)  # 100 agents x 1 MB per publish each second
    assert out["load_at_full_rate"]["primary"] == pytest.approx(0.1 + 0.5 + 0.1)
    assert out["agents_per_hub"] == pytest.approx(0.9 / 0.006)
    assert out["agents_per_hub_experience_only"] == pytest.approx(0.9 / 0.005)
    assert out["param_share_at_full_rate"] == pytest.approx(0.1 / 0.7)
    skipping = scale.capacity(replace(spec, broadcast=BroadcastOptions(min_version_lag=2)), {"primary": 0.1},
                                    {"primary": 1e-5}, {"primary": 1.0}, {"primary": 1.0}, 1_000_000, "primary")
    assert skipping["needed_gb_per_s"] == pytest.approx(0.05)


def test_capacity_with_replicas_counts_the_replication_stream_once_per_replica():
    spec = CaseSpec("pong", 100, hub="replicas", publish_every_s=1.0)
    labels = ("primary", "replica1", "replica2")
    out = scale.capacity(spec, fixed=dict.fromkeys(labels, 0.0), per_t=dict.fromkeys(labels, 1e-5),
                               per_gb=dict.fromkeys(labels, 1.0),
                               download_share={"primary": 0.0, "replica1": 0.5, "replica2": 0.5},
                               nbytes=1_000_000, params_server="primary")
    assert out["replication_gb_per_s"] == pytest.approx(0.002)  # 1 MB to each of 2 replicas a second
    assert out["param_load_at_full_rate"]["primary"] == pytest.approx(0.002)  # whatever the N
    assert out["param_load_at_full_rate"]["replica1"] == pytest.approx(0.05)
    assert out["load_at_full_rate"]["replica2"] == pytest.approx(0.5 + 0.05)
    assert out["param_share_at_full_rate"] == pytest.approx(0.002 / 0.502)
