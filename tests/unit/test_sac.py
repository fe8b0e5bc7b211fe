"""SAC: one update against a reference written out here, bootstrapping, the numpy actor against the
torch one, config checks, checkpoints, the torch-free agent path and prioritized replay."""

from __future__ import annotations

import copy
import io
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from surreal_redis.algos.base import ActMode
from surreal_redis.algos.networks import normalized_obs, obs_to_tensor
from surreal_redis.algos.numpy_nets import ParamsMismatch
from surreal_redis.algos.policies import make_policy, resolved_inference
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.algos.sac.numpy_policy import NumpySACPolicy
from surreal_redis.algos.sac.policy import Actor, SACPolicy
from surreal_redis.algos.sac.trainer import SACTrainer
from surreal_redis.chunks import TransitionBatch
from surreal_redis.config import load_config
from surreal_redis.configtools import ConfigError, from_dict

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACE = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
UNIT_ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
SMALL = {"actor_hidden": (8,), "critic_hidden": (8,)}


def make_algo(seed: int = 0, obs_space: gym.Space = OBS_SPACE, action_space: gym.Space = ACTION_SPACE,
              **overrides) -> SACTrainer:
    torch.manual_seed(seed)
    return SACTrainer(SACConfig(**{**SMALL, **overrides}), obs_space, action_space, device="cpu", seed=seed)


def make_batch(size: int = 4, seed: int = 0, **fields) -> TransitionBatch:
    rng = np.random.default_rng(seed)
    batch = TransitionBatch(
        obs=rng.uniform(-1, 1, (size, 3)).astype(np.float32),
        actions=rng.uniform([-2, 0], [2, 1], (size, 2)).astype(np.float32),
        rewards=rng.normal(size=size).astype(np.float32),
        next_obs=rng.uniform(-1, 1, (size, 3)).astype(np.float32),
        discounts=np.full(size, 0.99, np.float32),
        weights=np.ones(size, np.float32),
        indices=np.arange(size),
    )
    return batch._replace(**fields)


def randomize(module: torch.nn.Module, seed: int, gain: float = 1.5) -> None:
    """Weights far from the small initial heads, so that log-stds and squashing are exercised:
    Gaussian, std ``gain / sqrt(fan_in)`` (biases ``0.2 gain``)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p[0].numel() if p.dim() > 1 else 25
            p.copy_(torch.randn(p.shape, generator=generator) * gain / fan_in ** 0.5)


def copied_adam(params, optimizer: torch.optim.Adam, lr: float) -> torch.optim.Adam:
    """A fresh Adam over ``params`` holding ``optimizer``'s moments (empty before its first step)."""
    fresh = torch.optim.Adam(params, lr=lr)
    fresh.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    return fresh


class Reference:
    """One SAC update written out from the equations, on copies of ``algo``'s networks, optimizer
    moments, temperature and noise generator."""

    def __init__(self, algo: SACTrainer) -> None:
        cfg = algo.config
        self.cfg = cfg
        self.actor = copy.deepcopy(algo.actor)
        self.critic = copy.deepcopy(algo.critic)
        self.target = copy.deepcopy(algo.critic_target)
        self.log_alpha = algo.log_alpha.detach().clone().requires_grad_(True)
        self.actor_opt = copied_adam(self.actor.parameters(), algo.actor_optimizer, cfg.actor_lr)
        self.critic_opt = copied_adam(self.critic.parameters(), algo.critic_optimizer, cfg.critic_lr)
        self.alpha_opt = copied_adam([self.log_alpha], algo.alpha_optimizer, cfg.alpha_lr)
        self.generator = torch.Generator()
        self.generator.set_state(algo.generator.get_state())
        self.iteration = algo.iteration
        self.target_entropy = -2.0  # -|A|

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actor, cfg = self.actor, self.cfg
        h = actor.trunk(obs)  # a Box observation: the encoder only flattens
        mean = actor.mean(h)
        log_std = cfg.log_std_min + 0.5 * (cfg.log_std_max - cfg.log_std_min) * (torch.tanh(actor.log_std(h)) + 1)
        std = log_std.exp()
        u = mean + std * torch.randn(mean.shape, generator=self.generator)
        a = torch.tanh(u) * actor.action_scale + actor.action_bias
        log_prob = (Normal(mean, std).log_prob(u)
                    - torch.log(actor.action_scale * (1 - torch.tanh(u) ** 2) + 1e-6)).sum(-1)
        return a, log_prob

    def q(self, critic: torch.nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = torch.cat([obs, actions], -1)
        return critic.q1.mlp(x)[:, 0], critic.q2.mlp(x)[:, 0]

    def update(self, batch: TransitionBatch) -> tuple[torch.Tensor, dict[str, float]]:
        obs, next_obs = torch.as_tensor(batch.obs), torch.as_tensor(batch.next_obs)
        actions, rewards = torch.as_tensor(batch.actions), torch.as_tensor(batch.rewards)
        discounts, weights = torch.as_tensor(batch.discounts), torch.as_tensor(batch.weights)
        alpha = self.log_alpha.exp().item()
        with torch.no_grad():
            next_a, next_logp = self.sample(next_obs)
            y = rewards + discounts * (torch.min(*self.q(self.target, next_obs, next_a)) - alpha * next_logp)
        q1, q2 = self.q(self.critic, obs, actions)
        critic_loss = (weights * (q1 - y) ** 2).mean() + (weights * (q2 - y) ** 2).mean()
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()
        stats = {"losses/critic_loss": critic_loss.item()}
        self.iteration += 1
        if self.iteration % self.cfg.policy_frequency == 0:
            for _ in range(self.cfg.policy_frequency):
                pi, logp = self.sample(obs)
                actor_loss = (alpha * logp - torch.min(*self.q(self.critic, obs, pi))).mean()
                self.actor_opt.zero_grad()
                actor_loss.backward()
                self.actor_opt.step()
                with torch.no_grad():
                    _, logp = self.sample(obs)
                alpha_loss = (-self.log_alpha * (logp + self.target_entropy)).mean()
                self.alpha_opt.zero_grad()
                alpha_loss.backward()
                self.alpha_opt.step()
                alpha = self.log_alpha.exp().item()
                stats.update({"losses/actor_loss": actor_loss.item(), "losses/alpha_loss": alpha_loss.item()})
        with torch.no_grad():
            for target, online in zip(self.target.parameters(), self.critic.parameters()):
                target.copy_((1 - self.cfg.tau) * target + self.cfg.tau * online)
        return torch.maximum((y - q1).abs(), (y - q2).abs()).detach(), stats


@pytest.mark.parametrize("policy_frequency", [1, 2])
def test_updates_match_the_reference_written_out(policy_frequency):
    algo = make_algo(policy_frequency=policy_frequency, tau=0.1, init_alpha=0.5, actor_lr=0.01, critic_lr=0.01,
                     alpha_lr=0.05)
    randomize(algo.actor, seed=3)
    start = {name: copy.deepcopy(getattr(algo, name)) for name in ("actor", "critic", "critic_target")}
    reference = Reference(algo)
    for step in range(3):  # with policy_frequency 2: a critic-only update, then one with 2 actor steps
        batch = make_batch(16, seed=step, weights=np.random.default_rng(step).uniform(0.2, 2, 16).astype(np.float32))
        expected_td, expected_stats = reference.update(batch)
        stats, td_errors = algo.update(batch)
        np.testing.assert_allclose(td_errors, expected_td.numpy(), rtol=1e-5, atol=1e-5)
        assert td_errors.dtype == np.float32 and td_errors.shape == (16,)
        for key, value in expected_stats.items():
            assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        assert ("losses/actor_loss" in stats) == ((step + 1) % policy_frequency == 0)
    for name, mine in (("actor", reference.actor), ("critic", reference.critic), ("critic_target", reference.target)):
        for (key, a), b in zip(getattr(algo, name).named_parameters(), mine.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name}.{key}")
        # and they moved: the comparison is not between untouched copies
        assert any(not torch.equal(a, b) for a, b in zip(getattr(algo, name).parameters(),
                                                         start[name].parameters())), name
    torch.testing.assert_close(algo.log_alpha, reference.log_alpha)
    assert algo.alpha != pytest.approx(0.5) and stats["losses/alpha"] == pytest.approx(algo.alpha)


def test_the_tanh_log_prob_correction_is_that_of_a_tanh_transformed_gaussian():
    torch.manual_seed(0)
    actor = Actor(SACConfig(**SMALL), OBS_SPACE, UNIT_ACTIONS)  # scale 1, bias 0
    randomize(actor, seed=1, gain=0.5)
    obs = torch.rand(64, 3) * 2 - 1
    noise = torch.randn(64, 2)
    with torch.no_grad():
        actions, log_prob = actor.sample(obs, noise=noise)
        mean, log_std = actor(obs)
        u = mean + log_std.exp() * noise
        assert u.abs().max() < 3  # where 1e-6 inside the log is far below 1 - tanh(u)^2
        squashed = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
        torch.testing.assert_close(actions, torch.tanh(u))
        torch.testing.assert_close(log_prob, squashed.log_prob(actions).sum(-1), rtol=1e-4, atol=1e-4)
    assert log_std.min() >= -5 and log_std.max() <= 2


def test_a_termination_drops_the_bootstrap_and_a_truncation_keeps_it():
    algo = make_algo(autotune=False, alpha=0.2)
    with torch.no_grad():  # Q(s, a) = 2 everywhere, for both critics and their targets
        for critic in (algo.critic.q1, algo.critic.q2, algo.critic_target.q1, algo.critic_target.q2):
            for p in critic.parameters():
                p.zero_()
            critic.mlp[-1].bias.fill_(2.0)
    batch = make_batch(2, rewards=np.array([1.0, 1.0], np.float32),
                       next_obs=np.zeros((2, 3), np.float32),
                       discounts=np.array([0.99, 0.0], np.float32))  # truncated (bootstraps), terminated
    generator = torch.Generator()
    generator.set_state(algo.generator.get_state())
    with torch.no_grad():
        _, next_log_prob = algo.actor.sample(torch.zeros(2, 3), generator=generator)
    _, td_errors = algo.update(batch)
    # terminated: y = r = 1, |td| = |1 - 2|; truncated: y = r + 0.99 (2 - alpha log pi(a'|s'))
    assert td_errors[1] == pytest.approx(1.0, abs=1e-6)
    assert td_errors[0] == pytest.approx(abs(1 + 0.99 * (2 - 0.2 * next_log_prob[0].item()) - 2), abs=1e-5)


def test_the_priority_is_the_larger_absolute_td_error_so_opposite_errors_do_not_cancel():
    """Critics at 3 and 1 against a target of 2: errors -1 and +1. Their mean (0) ranked the
    transition last in prioritized replay; the priority is max(|td_1|, |td_2|) = 1 (TD7's)."""
    algo = make_algo(autotune=False, alpha=0.2)
    with torch.no_grad():
        for critic, value in ((algo.critic.q1, 3.0), (algo.critic.q2, 1.0)):
            for p in critic.parameters():
                p.zero_()
            critic.mlp[-1].bias.fill_(value)
    batch = make_batch(2, rewards=np.array([2.0, 2.5], np.float32), discounts=np.zeros(2, np.float32))
    _, td_errors = algo.update(batch)  # y = r (terminated): errors (-1, +1) and (-0.5, +1.5)
    np.testing.assert_allclose(td_errors, [1.0, 1.5], atol=1e-6)


SPACES = {
    "vector": gym.spaces.Box(-5, 5, (3,), np.float64),
    "dict_with_image": gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (12, 10, 3), np.uint8),
                                        "pos": gym.spaces.Box(-1, 1, (3,), np.float32)}),
}


def sample_obs(space: gym.Space, n: int, rng: np.random.Generator):
    if isinstance(space, gym.spaces.Dict):
        return {key: sample_obs(leaf, n, rng) for key, leaf in space.spaces.items()}
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
    return rng.normal(1.0, 2.0, (n, *space.shape)).astype(space.dtype)


@pytest.mark.parametrize("space_name", list(SPACES))
@pytest.mark.parametrize("normalize_obs", [False, True])
def test_numpy_actor_matches_the_torch_actor_on_random_weights(space_name, normalize_obs):
    space = SPACES[space_name]
    config = SACConfig(actor_hidden=(16, 8), critic_hidden=(8,), activation="elu", normalize_obs=normalize_obs)
    torch.manual_seed(0)
    algo = SACTrainer(config, space, ACTION_SPACE, device="cpu")
    randomize(algo.actor, seed=5, gain=0.7)
    rng = np.random.default_rng(0)
    if normalize_obs:
        algo.obs_normalizer.update(obs_to_tensor(sample_obs(space, 50, rng), torch.device("cpu")))
    params = algo.actor_params()
    numpy_policy = NumpySACPolicy(config, space, ACTION_SPACE, num_envs=6, seed=11)
    numpy_policy.load_params(params, version=4)
    torch_policy = SACPolicy(config, space, ACTION_SPACE, num_envs=6, seed=11)
    torch_policy.load_params(params, version=4)
    assert numpy_policy.version == torch_policy.version == 4
    obs = sample_obs(space, 6, rng)

    with torch.no_grad():
        x = normalized_obs(obs, algo.device, algo.obs_normalizer)  # what the learner's update feeds the actor
        mean, log_std = algo.actor(x)
        noise = np.random.default_rng(7).standard_normal((6, 2), dtype=np.float32)
        torch_actions, torch_log_prob = algo.actor.sample(x, noise=torch.from_numpy(noise))
    normalized = numpy_policy.normalizer(obs) if normalize_obs else obs
    numpy_mean, numpy_log_std = numpy_policy.actor(normalized)
    np.testing.assert_allclose(numpy_mean, mean.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(numpy_log_std, log_std.numpy(), rtol=1e-4, atol=1e-5)
    assert log_std.std() > 0.1  # the log-std head is exercised, not stuck at one value
    numpy_actions, numpy_log_prob = numpy_policy.actor.sample(normalized, noise)
    np.testing.assert_allclose(numpy_actions, torch_actions.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(numpy_log_prob, torch_log_prob.numpy(), rtol=1e-4, atol=1e-4)

    deterministic = algo.actor.squash(mean).numpy()
    assert np.abs(np.tanh(mean.numpy())).max() < 0.999  # not saturated at the bounds
    for policy in (numpy_policy, torch_policy):
        out = policy.act(obs, ActMode.EVAL_DETERMINISTIC)
        np.testing.assert_allclose(out.actions, deterministic, rtol=1e-5, atol=1e-5)
        assert out.actions.shape == (6, 2) and out.actions.dtype == np.float32 and out.extras == {}
    # training samples with the policy's Generator: the same noise through the torch actor
    drawn = np.random.default_rng(11).standard_normal((6, 2), dtype=np.float32)
    with torch.no_grad():
        expected, _ = algo.actor.sample(x, noise=torch.from_numpy(drawn))
    np.testing.assert_allclose(numpy_policy.act(obs, ActMode.TRAINING).actions, expected.numpy(), rtol=1e-4, atol=1e-5)
    stochastic = numpy_policy.act(obs, ActMode.EVAL_STOCHASTIC).actions
    assert not np.allclose(stochastic, deterministic)
    assert np.all(stochastic >= ACTION_SPACE.low) and np.all(stochastic <= ACTION_SPACE.high)


def test_numpy_policy_names_a_missing_parameter():
    policy = NumpySACPolicy(SACConfig(**SMALL), OBS_SPACE, ACTION_SPACE)
    params = make_algo().actor_params()
    del params["actor.log_std.weight"]
    with pytest.raises(ParamsMismatch, match="actor.log_std.weight"):
        policy.load_params(params, 1)


def test_sampling_spreads_over_the_bounds_and_is_seeded():
    config = SACConfig(**SMALL)
    obs = np.zeros((4000, 3), np.float32)
    a = NumpySACPolicy(config, OBS_SPACE, ACTION_SPACE, 4000, seed=1)
    a.load_params(make_algo().actor_params(), 0)
    b = NumpySACPolicy(config, OBS_SPACE, ACTION_SPACE, 4000, seed=1)
    b.load_params(make_algo().actor_params(), 0)
    first = a.act(obs).actions
    np.testing.assert_array_equal(first, b.act(obs).actions)
    assert not np.array_equal(first, a.act(obs).actions)
    # initial log-std -1.5 (the middle of [-5, 2]): std 0.22 before squashing, ~0.21 after, times the scale
    assert first[:, 0].std() == pytest.approx(2 * 0.21, rel=0.1)
    assert first[:, 1].std() == pytest.approx(0.5 * 0.21, rel=0.1)


@pytest.mark.parametrize(("field", "value"), [
    ("gamma", 1.5), ("tau", 0.0), ("actor_lr", 0.0), ("critic_lr", -1.0), ("alpha_lr", 0.0), ("init_alpha", 0.0),
    ("alpha", -0.1), ("policy_frequency", 0), ("target_network_frequency", 0), ("actor_hidden", (64, 0)),
    ("critic_hidden", (0,)), ("activation", "gelu"), ("target_entropy", float("inf")), ("log_std_min", 3.0),
    ("log_std_max", -6.0), ("obs_clip", 0.0),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SACConfig(**{field: value})


def test_config_from_yaml_data_and_overrides():
    config = from_dict(SACConfig, {"actor_hidden": [64, 64], "target_entropy": -3, "autotune": False})
    assert config.actor_hidden == (64, 64) and config.target_entropy == -3.0 and not config.autotune
    with pytest.raises(ConfigError, match="policy_frequency"):
        from_dict(SACConfig, {"policy_frequency": 0})
    with pytest.raises(ConfigError, match="tau"):
        load_config("sac_pendulum", ["sac.tau=0"])
    with pytest.raises(ConfigError, match="sac.n_step"):  # a shared off_policy setting
        load_config("sac_pendulum", ["sac.n_step=3"])
    assert load_config("sac_halfcheetah").algo_config.policy_frequency == 2


def test_fixed_temperature_and_explicit_target_entropy():
    fixed = make_algo(autotune=False, alpha=0.3)
    assert fixed.alpha_optimizer is None and fixed.alpha == 0.3
    stats, _ = fixed.update(make_batch())
    stats, _ = fixed.update(make_batch())
    assert fixed.alpha == 0.3 and stats["losses/alpha"] == 0.3 and "losses/alpha_loss" not in stats
    assert make_algo(target_entropy=-0.5).target_entropy == -0.5 and make_algo().target_entropy == -2.0


@pytest.mark.parametrize("autotune", [True, False])
def test_state_dict_round_trip_resumes_exactly(autotune):
    algo = make_algo(seed=0, normalize_obs=True, autotune=autotune)
    for seed in range(3):
        algo.observe_inserted(make_batch(seed=seed + 20).obs * 3 + 1)  # the z-filter moves too
        algo.update(make_batch(seed=seed))
    assert algo.obs_normalizer.stats["_"].count.item() == 12
    buffer = io.BytesIO()
    torch.save(algo.state_dict(), buffer)
    buffer.seek(0)
    restored = make_algo(seed=1, normalize_obs=True, autotune=autotune)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.iteration == 3 and restored.alpha == algo.alpha
    stats_a, td_a = algo.update(make_batch(seed=9))
    stats_b, td_b = restored.update(make_batch(seed=9))  # same moments, temperature and noise -> same step
    assert stats_a == stats_b
    np.testing.assert_array_equal(td_a, td_b)
    for net in ("actor", "critic", "critic_target", "obs_normalizer"):
        for a, b in zip(getattr(algo, net).state_dict().values(), getattr(restored, net).state_dict().values()):
            assert torch.equal(a, b)
    assert torch.equal(algo.log_alpha, restored.log_alpha)


def test_actor_params_are_what_agents_load():
    algo = make_algo(normalize_obs=True)
    params = algo.actor_params()
    assert set(params) == {f"actor.{k}" for k in algo.actor.state_dict()} | {
        f"obs_normalizer.{k}" for k in algo.obs_normalizer.state_dict()}
    assert all(isinstance(v, np.ndarray) for v in params.values())


def test_only_bounded_box_actions_are_accepted():
    with pytest.raises(ValueError, match="Discrete"):
        make_algo(action_space=gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="finite bounds"):
        NumpySACPolicy(SACConfig(), OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, (2,)))


def test_agents_act_in_numpy_by_default_and_torch_for_images():
    image = gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)
    assert resolved_inference(SACConfig(), OBS_SPACE) == "numpy"
    assert resolved_inference(SACConfig(), image) == "torch"
    assert resolved_inference(SACConfig(), image, "numpy") == "numpy"
    assert isinstance(make_policy(SACConfig(**SMALL), OBS_SPACE, ACTION_SPACE, 2, 0, 1, 0), NumpySACPolicy)
    assert isinstance(make_policy(SACConfig(**SMALL), OBS_SPACE, ACTION_SPACE, 2, 0, 1, 0, "torch"), SACPolicy)


def test_an_agent_or_eval_acting_with_numpy_never_imports_torch():
    """The agent and eval commands' whole import chain, and a Pendulum SAC policy built and acting."""
    code = ("import sys; import surreal_redis.cli.group, surreal_redis.agent, surreal_redis.evaluator\n"
            "from surreal_redis.algos.policies import make_policy\n"
            "from surreal_redis.config import load_config\n"
            "from surreal_redis.envs import make_vector_env\n"
            "config = load_config('sac_pendulum')\n"
            "envs = make_vector_env(config.env, seed=0)\n"
            "policy = make_policy(config.algo_config, envs.single_observation_space, envs.single_action_space,"
            " envs.num_envs, 0, 1, 0, config.agent.inference)\n"
            "obs, _ = envs.reset(seed=0)\n"
            "print(type(policy).__name__, policy.act(obs).actions.shape, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["NumpySACPolicy", "(1,", "1)", "False"]


def test_importance_weights_scale_the_critic_loss_per_transition():
    algo = make_algo(policy_frequency=2)  # no actor step in the first update
    with torch.no_grad():  # identical critics: both TD errors are the returned one, up to sign
        algo.critic.q2.load_state_dict(algo.critic.q1.state_dict())
        algo.critic_target.q2.load_state_dict(algo.critic_target.q1.state_dict())
    weights = np.array([0.0, 1.0, 3.0, 0.5], np.float32)
    stats, td_errors = algo.update(make_batch(4, weights=weights))
    assert td_errors.shape == (4,) and td_errors.dtype == np.float32 and np.all(td_errors != 0)
    assert stats["losses/critic_loss"] == pytest.approx(2 * np.mean(weights * td_errors ** 2), rel=1e-5)
    assert stats["losses/qf1_loss"] == pytest.approx(stats["losses/qf2_loss"])


def test_prioritized_replay_loop_updates_priorities_from_the_td_errors():
    from surreal_redis.envs import EnvConfig, make_vector_env
    from surreal_redis.replay import ReplayConfig
    from surreal_redis.replay.feeds import OffPolicyConfig
    from surreal_redis.testing.offpolicy_loop import OffPolicyLoopConfig, run_offpolicy

    config = SACConfig(**SMALL, device="cpu")
    envs = make_vector_env(EnvConfig(env_id="Pendulum-v1", max_episode_steps=40), 2, seed=0)
    algo = SACTrainer(config, envs.single_observation_space, envs.single_action_space)
    policy = NumpySACPolicy(config, envs.single_observation_space, envs.single_action_space, 2, seed=0)
    seen = []
    update = algo.update

    def recording_update(batch):
        stats, td_errors = update(batch)
        seen.append((batch.weights.copy(), td_errors))
        return stats, td_errors

    algo.update = recording_update
    off_policy = OffPolicyConfig(batch_size=16, n_step=3, learning_starts=90, updates_per_step=0.5, max_train_s=None,
                                 replay=ReplayConfig(selector="prioritized", capacity=1000))
    result = run_offpolicy(algo, policy, envs, OffPolicyLoopConfig(total_steps=200, chunk_steps=25,
                                                                    off_policy=off_policy), config.gamma)
    envs.close()
    assert result.updates == algo.iteration == len(seen) == 3 * 25
    assert all(td.shape == (16,) and td.dtype == np.float32 and np.isfinite(td).all() for _, td in seen)
    # importance weights below 1 once priorities differ (they are normalized by the largest)
    assert any(np.any(w < 1.0) for w, _ in seen[1:]) and all(np.all(w <= 1.0 + 1e-6) for w, _ in seen)
    assert policy.version == result.updates
    assert np.isfinite(list(result.last_stats.values())).all()
