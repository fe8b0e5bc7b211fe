"""The parameter broadcast's two savings: float16 payloads (``hub.publisher.dtype``) and agents
that skip versions (``hub.params_client.min_version_lag``), on fakeredis."""

from __future__ import annotations

import json

import numpy as np
import pytest

from surreal_redis.config import load_config
from surreal_redis.configtools import ConfigError
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    ParamFetchError,
    PublisherConfig,
    from_wire,
    param_spec,
    to_wire,
)
from surreal_redis.keys import RunKeys

from .test_params import CountingClient

RUN = "unit"
KEYS = RunKeys(RUN).params


def learner_params(seed: int = 0) -> dict[str, np.ndarray]:
    """What a learner publishes: float32 weights, float64 normalizer statistics, an integer."""
    rng = np.random.default_rng(seed)
    return {"actor.0.weight": (rng.standard_normal((512, 64)) * 0.3).astype(np.float32),
            "actor.0.bias": rng.uniform(-1e-3, 1e-3, 64).astype(np.float32),
            "obs_normalizer.mean": rng.standard_normal(17) * 1000.0,
            "obs_normalizer.count": np.array(123456, np.int64)}


# ---------------------------------------------------------------- float16 payloads

def test_float16_payload_halves_the_bytes_and_loads_as_float32(fake_redis):
    params = learner_params()
    kept = {name: value.copy() for name, value in params.items()}
    full = ParameterPublisher(fake_redis, "full", PublisherConfig())
    half = ParameterPublisher(fake_redis, RUN, PublisherConfig(dtype="float16"))
    full.publish(params, 1)
    half.publish(params, 1)
    for name in params:  # the learner's own arrays are not touched
        assert params[name].dtype == kept[name].dtype
        np.testing.assert_array_equal(params[name], kept[name])
    full_bytes = int(fake_redis.hget(RunKeys("full").params.meta, "nbytes"))
    half_bytes = int(fake_redis.hget(KEYS.meta, "nbytes"))
    float32_bytes = sum(v.nbytes for v in params.values() if v.dtype == np.float32)
    # every float32 leaf's bytes halved (the header around them differs by a few bytes of padding)
    assert abs(full_bytes - half_bytes - float32_bytes // 2) <= 64
    assert half_bytes < 0.52 * full_bytes
    assert fake_redis.hget(KEYS.meta, "codec") == b"srt1+float16"
    spec = json.loads(fake_redis.hget(KEYS.meta, "spec"))
    assert spec["actor.0.weight"] == ["float32", [512, 64]]  # the dtypes agents load, not the wire's

    got, info = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert info.version == 1 and info.nbytes == half_bytes
    assert {name: value.dtype for name, value in got.items()} == {name: v.dtype for name, v in params.items()}
    for name in ("actor.0.weight", "actor.0.bias"):
        np.testing.assert_array_equal(got[name], params[name].astype(np.float16).astype(np.float32))
        assert not np.array_equal(got[name], params[name])  # rounded: the test sees the wire
        np.testing.assert_allclose(got[name], params[name], rtol=2.0 ** -11, atol=2.0 ** -25)  # subnormals
    np.testing.assert_array_equal(got["obs_normalizer.mean"], params["obs_normalizer.mean"])  # float64 as is
    assert got["obs_normalizer.count"] == 123456


def test_float16_with_lz4_round_trips(fake_redis):
    params = learner_params(1)
    ParameterPublisher(fake_redis, RUN, PublisherConfig(dtype="float16", compress_min_bytes=0)).publish(params, 1)
    assert fake_redis.hget(KEYS.meta, "codec") == b"srt1+lz4+float16"
    got, _ = ParameterClient(fake_redis, RUN, ParameterClientConfig(piece_bytes=4096)).fetch()
    np.testing.assert_array_equal(got["actor.0.weight"], params["actor.0.weight"].astype(np.float16).astype(np.float32))


def test_a_leaf_beyond_float16_range_travels_as_float32():
    params = {"w": np.array([1.0, 7e4], np.float32), "nan": np.array([np.nan, np.inf, 1.0], np.float32)}
    wire = to_wire(params, "float16")
    assert wire["w"].dtype == np.float32 and wire["w"] is params["w"]  # 7e4 would arrive as inf
    assert wire["nan"].dtype == np.float16  # what was not finite stays so, nothing overflowed
    back = from_wire(wire, param_spec(params))
    np.testing.assert_array_equal(back["w"], params["w"])
    assert back["nan"].dtype == np.float32 and np.isnan(back["nan"][0]) and back["nan"][1] == np.inf
    assert to_wire(params, "float32") == params


def test_a_spec_that_disagrees_with_the_blob_is_rejected(fake_redis):
    with pytest.raises(ParamFetchError, match="'w' arrived as float16, the spec says float64"):
        from_wire({"w": np.zeros(2, np.float16)}, {"w": ["float64", [2]]})
    with pytest.raises(ParamFetchError, match="'x' is not in the published spec"):
        from_wire({"x": np.zeros(2, np.float16)}, {"w": ["float32", [2]]})
    ParameterPublisher(fake_redis, RUN, PublisherConfig(dtype="float16")).publish(learner_params(), 1)
    fake_redis.hset(KEYS.meta, "spec", "not json")
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig())
    assert client.fetch() == (None, client.info) and client.rejections == 1


@pytest.mark.parametrize("bad", ["bfloat16", "fp16", "float64", ""])
def test_a_bad_publisher_dtype_is_named(bad):
    from surreal_redis.config import ExperimentConfig
    from surreal_redis.configtools import ConfigError, from_dict

    with pytest.raises(ValueError, match=f"publisher dtype must be one of float32, float16, got {bad!r}"):
        PublisherConfig(dtype=bad)
    with pytest.raises(ValueError, match="wire dtype"):
        to_wire({}, bad)
    with pytest.raises((ValueError, ConfigError), match=repr(bad)):
        from_dict(ExperimentConfig, {"hub": {"publisher": {"dtype": bad}}})
    config = from_dict(ExperimentConfig, {"hub": {"publisher": {"dtype": "float16"},
                                                  "params_client": {"min_version_lag": 2}}})
    assert config.hub.publisher.dtype == "float16" and config.hub.params_client.min_version_lag == 2


# ---------------------------------------------------------------- skipping versions

def test_min_version_lag_skips_versions_until_far_enough_behind(fake_redis):
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    counting = CountingClient(fake_redis)
    client = ParameterClient(counting, RUN, ParameterClientConfig(min_version_lag=2))
    pub.publish(learner_params(1), 1)
    pub.publish(learner_params(2), 2)
    got, info = client.fetch()  # holding nothing: the newest, whatever the lag
    assert info.version == 2 and got is not None
    pub.publish(learner_params(3), 3)
    counting.commands.clear()
    assert client.fetch() == (None, info)  # one version ahead: not downloaded
    assert counting.commands == ["hget"]  # the poll only
    pub.publish(learner_params(4), 4)
    got, info = client.fetch()  # two ahead: the newest
    assert info.version == 4
    np.testing.assert_array_equal(got["actor.0.weight"], learner_params(4)["actor.0.weight"])
    pub.publish(learner_params(5), 5)
    assert client.fetch()[0] is None and client.info.version == 4
    assert client.fetch(force=True)[1].version == 5  # force ignores the lag
    pub.publish(learner_params(6), 6)
    pub.publish(learner_params(7), 7)
    pub.publish(learner_params(8), 8)
    assert client.fetch()[1].version == 8  # three ahead


def test_a_version_asked_for_is_downloaded_whatever_the_lag(fake_redis):
    """Lockstep agents fetch(at_least=v) the version a claim named: the lag never delays it."""
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(min_version_lag=3))
    pub.publish(learner_params(1), 1)
    assert client.fetch()[1].version == 1
    pub.publish(learner_params(2), 2)
    assert client.fetch()[0] is None
    assert client.fetch(at_least=1)[0] is None  # a version not above the one held asks for nothing
    got, info = client.fetch(at_least=2)
    assert info.version == 2 and got is not None


def test_a_lower_version_is_still_refused_with_a_lag(fake_redis):
    """A learner that started over publishes below the version held: refused and counted (so
    it republishes above), not hidden by the lag."""
    pub = ParameterPublisher(fake_redis, RUN, PublisherConfig())
    client = ParameterClient(fake_redis, RUN, ParameterClientConfig(min_version_lag=2))
    pub.publish(learner_params(1), 1)
    pub.publish(learner_params(2), 2)
    assert client.fetch()[1].version == 2
    fake_redis.flushall()
    ParameterPublisher(fake_redis, RUN, PublisherConfig()).publish(learner_params(9), 1)
    assert client.fetch()[0] is None and client.rejections == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_min_version_lag_is_named(bad):
    with pytest.raises(ValueError, match=f"min_version_lag must be an integer >= 1, got {bad!r}"):
        ParameterClientConfig(min_version_lag=bad)


# ---------------------------------------------------------------- a trained policy in float16

def test_a_trained_cartpole_policy_acts_alike_from_float16_weights(fake_redis):
    """PPO trained 16 updates on CartPole (mean return ~130 from ~20: weights moved ~0.3, logits
    spread ~2.7 nats), published as float16 through the real publisher and client, then run by
    the numpy agent policy on 520 states the trained policy visits: the logits, log-probs and
    values of the float32 and the float16 weights agree to ~1e-4 (measured: logits 1.2e-4,
    log-probs 9e-5, KL 1.4e-9 nats, values 1.4e-4 at seed 0) and every greedy action is the same."""
    import torch

    from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
    from surreal_redis.algos.ppo.trainer import PPOConfig, PPOTrainer
    from surreal_redis.envs import EnvConfig, make_vector_env
    from surreal_redis.testing.local_loop import ChunkCollector, LocalLoopConfig, run_local

    config = PPOConfig(learning_rate=2.5e-3, device="cpu")
    torch.manual_seed(0)
    envs = make_vector_env(EnvConfig(env_id="CartPole-v1"), 8, seed=0)
    algo = PPOTrainer(config, envs.single_observation_space, envs.single_action_space, seed=0)
    policy = NumpyPPOPolicy(config, envs.single_observation_space, envs.single_action_space, 8, seed=0)
    result = run_local(algo, policy, envs, LocalLoopConfig(total_steps=16384, chunk_steps=128, seed=0, log_every=100))
    assert result.mean_return > 60  # trained: a fresh policy balances ~20 steps
    params = algo.actor_params()
    ParameterPublisher(fake_redis, RUN, PublisherConfig(dtype="float16")).publish(params, result.updates)
    wire, _ = ParameterClient(fake_redis, RUN, ParameterClientConfig()).fetch()
    assert all(wire[name].dtype == np.float32 for name in params)
    obs = np.concatenate([chunk.obs for chunk in ChunkCollector(envs, policy, seed=1).collect(64)])
    envs.close()

    def heads(weights):
        net = NumpyPPOPolicy(config, envs.single_observation_space, envs.single_action_space, len(obs))
        net.load_params(weights, 1)
        z = net.encoder(obs)
        logits = net.actor(z).astype(np.float64)
        return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True), net.critic(z)[:, 0].astype(np.float64)

    (log_p, value), (log_q, value16) = heads(params), heads(wire)
    assert np.ptp(log_p) > 1.0  # the policy prefers actions: rounding could flip close calls
    assert np.abs(log_p - log_q).max() < 2e-3
    assert (np.exp(log_p) * (log_p - log_q)).sum(axis=1).max() < 1e-6
    assert (log_p.argmax(axis=1) == log_q.argmax(axis=1)).mean() >= 0.99
    assert np.abs(value - value16).max() < 2e-3


@pytest.mark.slow
def test_a_trained_pong_network_acts_alike_from_float16_weights():
    """The Nature CNN (1.69M parameters) after 12 PPO updates on the scale bench's paddle task
    (~25 s of CPU), on 64 synthetic Pong frames (measured at seed 0: logits 5.8e-4 of a 5.7-nat
    spread, log-probs 9.7e-4, KL 1.8e-8 nats, values 2.2e-3, every greedy action the same)."""
    pytest.importorskip("torch")
    from harness.scale import fp16_logit_check, trained_pong_params

    check = fp16_logit_check(trained_pong_params())
    assert check["logit_spread"] > 1.0  # a fresh network's spread is ~0.01: rounding has more to flip here
    assert check["max_abs_logit_diff"] < 0.01 and check["max_abs_logp_diff"] < 0.01
    assert check["max_kl"] < 1e-6
    assert check["greedy_agreement"] >= 0.95
    assert check["max_abs_value_diff"] < 0.02


def test_a_version_lag_beyond_the_learners_staleness_limit_is_refused_in_free_production():
    with pytest.raises(ConfigError, match=r"min_version_lag 3 needs replay.fifo.max_policy_lag >= 3 .*got 2"):
        load_config(None, ["learner.on_policy_sync=free", "hub.params_client.min_version_lag=3",
                           "replay.fifo.max_policy_lag=2"])
    # lockstep agents load the version each claim names: the lag does not apply to them
    assert load_config(None, ["learner.on_policy_sync=lockstep", "hub.params_client.min_version_lag=3",
                              "replay.fifo.max_policy_lag=1"]).hub.params_client.min_version_lag == 3
    assert load_config(None, ["learner.on_policy_sync=free", "hub.params_client.min_version_lag=3",
                              "replay.fifo.max_policy_lag=3"]).replay.fifo.max_policy_lag == 3
