"""Numpy inference (algos/numpy_nets.py, algos/ppo/numpy_policy.py) against the torch networks it
mirrors, on random weights: the same features, logits, values and log-probs, so the learner's
importance ratios start at 1 whichever backend an agent acted with."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.algos.base import ActMode
from surreal_redis.algos.networks import module_params, obs_to_tensor
from surreal_redis.algos.numpy_nets import ParamsMismatch
from surreal_redis.algos.policies import make_policy, resolved_inference
from surreal_redis.algos.ppo.config import PPOConfig
from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
from surreal_redis.algos.ppo.policy import ActorCritic, PPOPolicy
from surreal_redis.config import load_config
from surreal_redis.configtools import ConfigError

FRAME = gym.spaces.Box(0, 255, (84, 84), np.uint8)
SPACES = {
    "vector": gym.spaces.Box(-5, 5, (4,), np.float64),
    "matrix": gym.spaces.Box(-1, 1, (3, 2), np.float32),
    "frames": gym.spaces.Tuple([FRAME] * 4),
    "small_hwc": gym.spaces.Box(0, 255, (12, 10, 3), np.uint8),
    "chw": gym.spaces.Box(0, 255, (2, 40, 36), np.uint8),
    "dict": gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,), np.float32),
                             "cam": gym.spaces.Box(0, 255, (16, 16), np.uint8),
                             "vel": gym.spaces.Box(-1, 1, (2,), np.float64)}),
}
ACTIONS = {"discrete": gym.spaces.Discrete(5, start=2),
           "box": gym.spaces.Box(np.array([-1, 0, -2], np.float32), np.array([1, 3, 2], np.float32), dtype=np.float32)}


def _randomized(config: PPOConfig, obs_space: gym.Space, action_space: gym.Space, seed: int) -> ActorCritic:
    """A torch ActorCritic with every weight and normalizer statistic random (not the init's)."""
    torch.manual_seed(seed)
    net = ActorCritic(config, obs_space, action_space)
    with torch.no_grad():
        for name, value in net.state_dict().items():
            if name.endswith(".var"):
                value.copy_(torch.rand_like(value) * 3 + 0.1)
            elif name.endswith(".count"):
                value.fill_(17)
            elif value.dim() >= 2:  # 1/sqrt(fan-in): activations stay of order 1 through every layer
                value.copy_(torch.randn_like(value) / value[0].numel() ** 0.5)
            else:
                value.copy_(torch.randn_like(value) * 0.3)
    return net.eval()


def _obs(space: gym.Space, n: int, rng: np.random.Generator):
    if isinstance(space, gym.spaces.Dict):
        return {key: _obs(leaf, n, rng) for key, leaf in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_obs(leaf, n, rng) for leaf in space.spaces)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
    return (rng.standard_normal((n, *space.shape)) * 3).astype(space.dtype)


@pytest.mark.parametrize("action_kind", ACTIONS)
@pytest.mark.parametrize("space_kind", SPACES)
@pytest.mark.parametrize("activation,normalize", [("tanh", True), ("relu", False), ("elu", True)])
def test_numpy_policy_computes_the_torch_network(space_kind, action_kind, activation, normalize):
    obs_space, action_space = SPACES[space_kind], ACTIONS[action_kind]
    config = PPOConfig(hidden_sizes=(32, 16), activation=activation, normalize_obs=normalize, obs_clip=2.0,
                       init_log_std=-0.3)
    net = _randomized(config, obs_space, action_space, seed=len(space_kind) + len(activation))
    policy = NumpyPPOPolicy(config, obs_space, action_space, num_envs=6, seed=0)
    policy.load_params(module_params("", net), 7)
    assert policy.version == 7
    obs = _obs(obs_space, 6, np.random.default_rng(1))

    with torch.no_grad():
        z_ref = net.features(obs_to_tensor(obs, "cpu"))
        head_ref = net.policy_head(z_ref).numpy()
        value_ref = net.value(z_ref).numpy()
    z = policy.encoder(policy.normalizer(obs) if policy.normalizer else obs)
    np.testing.assert_allclose(z, z_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(policy.actor(z), head_ref, rtol=1e-4, atol=1e-5)

    out = policy.act(obs, ActMode.TRAINING)
    np.testing.assert_allclose(out.extras["value"], value_ref, rtol=1e-4, atol=1e-5)
    assert out.extras["logp"].dtype == out.extras["value"].dtype == np.float32
    assert out.extras["logp"].shape == out.extras["value"].shape == (6,)
    with torch.no_grad():  # the learner's log-prob of what the numpy policy did
        dist = net.distribution(torch.as_tensor(head_ref))
        if action_kind == "box":
            raw = out.extras["raw_action"]
            assert raw.shape == (6, 3) and raw.dtype == np.float32
            np.testing.assert_array_equal(out.actions, np.clip(raw, action_space.low, action_space.high))
        else:
            raw = out.actions - action_space.start
            assert out.actions.dtype == np.int64 and action_space.contains(out.actions[0])
        logp_ref = dist.log_prob(torch.as_tensor(raw)).numpy()
    np.testing.assert_allclose(out.extras["logp"], logp_ref, rtol=1e-4, atol=1e-4)

    deterministic = policy.act(obs, ActMode.EVAL_DETERMINISTIC)
    assert deterministic.extras == {} and policy.act(obs, ActMode.EVAL_STOCHASTIC).extras == {}
    if action_kind == "box":
        np.testing.assert_allclose(deterministic.actions, np.clip(head_ref, action_space.low, action_space.high),
                                   rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_array_equal(deterministic.actions, head_ref.argmax(-1) + action_space.start)


def test_samples_follow_the_distribution():
    """Discrete draws match the softmax (an impossible action is never drawn); Gaussian draws have
    the head as mean and exp(log_std) as spread."""
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    config = PPOConfig(hidden_sizes=(8,), init_log_std=-0.5)
    policy = NumpyPPOPolicy(config, space, gym.spaces.Discrete(4), num_envs=20_000, seed=3)
    logits = np.array([1.0, -np.inf, 0.0, 2.0], np.float32)
    policy.actor = lambda z: np.tile(logits, (z.shape[0], 1))
    actions = policy.act(np.zeros((20_000, 2), np.float32)).actions
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    counts = np.bincount(actions, minlength=4) / len(actions)
    assert counts[1] == 0
    np.testing.assert_allclose(counts, probs, atol=0.015)

    box = NumpyPPOPolicy(config, space, gym.spaces.Box(-10, 10, (2,), np.float32), num_envs=20_000, seed=4)
    box.actor = lambda z: np.tile(np.array([0.5, -1.0], np.float32), (z.shape[0], 1))
    raw = box.act(np.zeros((20_000, 2), np.float32)).extras["raw_action"]
    np.testing.assert_allclose(raw.mean(axis=0), [0.5, -1.0], atol=0.02)
    np.testing.assert_allclose(raw.std(axis=0), np.exp(-0.5), rtol=0.03)


def test_seeded_policies_repeat_and_differ():
    space, actions = SPACES["vector"], ACTIONS["box"]
    config = PPOConfig(hidden_sizes=(8,))
    params = module_params("", _randomized(config, space, actions, seed=0))
    obs = _obs(space, 3, np.random.default_rng(0))
    draws = []
    for seed in (5, 5, 6):
        policy = NumpyPPOPolicy(config, space, actions, num_envs=3, seed=seed)
        policy.load_params(params, 1)
        draws.append(policy.act(obs).actions)
    np.testing.assert_array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])


def test_parameters_that_do_not_fit_are_refused_by_name():
    space, actions = SPACES["dict"], ACTIONS["box"]
    config = PPOConfig(hidden_sizes=(8,), normalize_obs=True)
    good = module_params("", _randomized(config, space, actions, seed=0))
    policy = NumpyPPOPolicy(config, space, actions, num_envs=2)
    for name in ("actor.2.weight", "encoder.stems.cam.conv.0.bias", "obs_normalizer.stats.vel.var", "actor_logstd"):
        missing = {k: v for k, v in good.items() if k != name}
        with pytest.raises(ParamsMismatch, match=rf"'{name}' is missing"):
            policy.load_params(missing, 2)
    wrong = dict(good, **{"critic.0.weight": np.zeros((8, 3), np.float32)})
    with pytest.raises(ParamsMismatch, match=r"'critic.0.weight' has shape \(8, 3\)"):
        policy.load_params(wrong, 2)
    assert policy.version == -1  # nothing loaded: the agent keeps acting with what it had
    policy.load_params(good, 3)
    assert policy.version == 3


def test_loaded_weights_are_private_copies():
    """The downloaded arrays are read-only views of one blob: the policy keeps its own copies."""
    space, actions = SPACES["vector"], ACTIONS["discrete"]
    config = PPOConfig(hidden_sizes=(8,))
    params = module_params("", _randomized(config, space, actions, seed=0))
    policy = NumpyPPOPolicy(config, space, actions, num_envs=2, seed=0)
    policy.load_params(params, 1)
    obs = _obs(space, 2, np.random.default_rng(0))
    before = policy.act(obs, ActMode.EVAL_DETERMINISTIC).extras, policy.actor(policy.encoder(obs))
    for value in params.values():
        value[...] = 0
    np.testing.assert_array_equal(policy.actor(policy.encoder(obs)), before[1])


def test_auto_picks_numpy_for_vector_ppo_and_torch_otherwise():
    vector, frames = SPACES["vector"], SPACES["frames"]
    assert resolved_inference(PPOConfig(), vector) == "numpy"
    assert resolved_inference(PPOConfig(), frames) == "torch"
    assert resolved_inference(PPOConfig(), SPACES["dict"]) == "torch"
    assert resolved_inference(PPOConfig(use_lstm=True), vector) == "torch"
    assert resolved_inference(PPOConfig(), frames, "numpy") == "numpy"
    assert resolved_inference(PPOConfig(), vector, "torch") == "torch"
    ddpg = load_config("ddpg_pendulum").algo_config
    assert resolved_inference(ddpg, vector) == "torch"
    with pytest.raises(ValueError, match="cannot run DDPGConfig"):
        resolved_inference(ddpg, vector, "numpy")
    with pytest.raises(ValueError, match="cannot run an LSTM policy"):
        resolved_inference(PPOConfig(use_lstm=True), vector, "numpy")
    with pytest.raises(ValueError, match="'gpu'"):
        resolved_inference(PPOConfig(), vector, "gpu")
    box = ACTIONS["box"]
    assert isinstance(make_policy(PPOConfig(), vector, box, 2, 0, 1, 0), NumpyPPOPolicy)
    assert isinstance(make_policy(PPOConfig(), vector, box, 2, 0, 1, 0, "torch"), PPOPolicy)


def test_config_refuses_numpy_inference_where_it_cannot_act():
    with pytest.raises(ConfigError, match="agent.inference=numpy cannot run DDPGConfig"):
        load_config("ddpg_pendulum", ["agent.inference=numpy"])
    with pytest.raises(ConfigError, match="agent.inference=numpy cannot run an LSTM policy"):
        load_config("ppo_cartpole", ["agent.inference=numpy", "ppo.use_lstm=true"])
    with pytest.raises(ConfigError, match="inference"):
        load_config("ppo_cartpole", ["agent.inference=cuda"])
    assert load_config("ppo_pong", ["agent.inference=numpy"]).agent.inference == "numpy"


def test_an_agent_or_eval_acting_with_numpy_never_imports_torch():
    """The agent and eval commands' whole import chain, and a CartPole policy built and acting."""
    code = ("import sys; import surreal_redis.cli.group, surreal_redis.agent, surreal_redis.evaluator\n"
            "from surreal_redis.algos.policies import make_policy\n"
            "from surreal_redis.config import load_config\n"
            "from surreal_redis.envs import make_vector_env\n"
            "config = load_config('ppo_cartpole')\n"
            "envs = make_vector_env(config.env, seed=0)\n"
            "policy = make_policy(config.algo_config, envs.single_observation_space, envs.single_action_space,"
            " envs.num_envs, 0, 1, 0, config.agent.inference)\n"
            "obs, _ = envs.reset(seed=0)\n"
            "print(type(policy).__name__, policy.act(obs).actions.shape, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    envs = load_config("ppo_cartpole").env.num_envs  # one action per env
    assert result.stdout.split() == ["NumpyPPOPolicy", f"({envs},)", "False"]
