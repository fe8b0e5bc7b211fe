"""DDPG: losses on tiny fixed inputs, target updates, checkpoints, learner -> policy parameters."""

from __future__ import annotations

import copy
import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.algos.base import ActMode
from surreal_redis.algos.ddpg.noise import NoiseConfig
from surreal_redis.algos.ddpg.policy import DDPGConfig, DDPGPolicy
from surreal_redis.algos.ddpg.trainer import DDPGTrainer
from surreal_redis.chunks import TransitionBatch
from surreal_redis.configtools import ConfigError, from_dict

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACE = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
SMALL = {"actor_hidden": (8,), "critic_hidden": (8,), "policy_frequency": 1}  # the paper's: an actor step each update


def make_algo(seed: int = 0, obs_space: gym.Space = OBS_SPACE, **overrides) -> DDPGTrainer:
    torch.manual_seed(seed)
    return DDPGTrainer(DDPGConfig(**{**SMALL, **overrides}), obs_space, ACTION_SPACE, device="cpu")


def make_batch(size: int = 4, seed: int = 0, **fields) -> TransitionBatch:
    rng = np.random.default_rng(seed)
    batch = TransitionBatch(
        obs=rng.uniform(-1, 1, (size, 3)).astype(np.float32),
        actions=rng.uniform(-1, 1, (size, 2)).astype(np.float32),
        rewards=rng.normal(size=size).astype(np.float32),
        next_obs=rng.uniform(-1, 1, (size, 3)).astype(np.float32),
        discounts=np.full(size, 0.99, np.float32),
        weights=np.ones(size, np.float32),
        indices=np.arange(size),
    )
    return batch._replace(**fields)


def params_of(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def test_critic_loss_td_errors_and_actor_loss_by_hand():
    algo = make_algo(critic_lr=0.01)
    with torch.no_grad():  # Q(s, a) = 2 everywhere, for the critic and its target
        for critic in (algo.critic, algo.critic_target):
            for p in critic.parameters():
                p.zero_()
            critic.mlp[-1].bias.fill_(2.0)
    batch = make_batch(2, rewards=np.array([1.0, 0.0], np.float32),
                       discounts=np.array([0.5, 0.0], np.float32),  # the second one terminated
                       weights=np.array([1.0, 3.0], np.float32))
    stats, td_errors = algo.update(batch)
    # y = r + discount * 2 = [2, 0]; td = y - 2 = [0, -2]; loss = mean(w * td^2) = mean([0, 12])
    np.testing.assert_allclose(td_errors, [0.0, -2.0], atol=1e-6)
    assert stats["losses/critic_loss"] == pytest.approx(6.0)
    assert stats["losses/q_values"] == pytest.approx(2.0)
    # only the output bias has a gradient (dL/db = mean(-2 w td) = 6 > 0); Adam's first step moves
    # it by lr, and the actor loss is -Q(s, mu(s)) with the updated critic
    assert algo.critic.mlp[-1].bias.item() == pytest.approx(2.0 - 0.01, abs=1e-6)
    assert stats["losses/actor_loss"] == pytest.approx(-(2.0 - 0.01), abs=1e-6)


def test_actor_loss_uses_the_updated_critic_and_the_actor_before_its_step():
    algo = make_algo()
    batch = make_batch(8)
    actor_before = copy.deepcopy(algo.actor)
    stats, _ = algo.update(batch)
    obs = torch.as_tensor(batch.obs)
    with torch.no_grad():
        expected = -algo.critic(obs, actor_before(obs)).mean().item()
    assert stats["losses/actor_loss"] == pytest.approx(expected, rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(params_of(actor_before), params_of(algo.actor)))


def test_policy_frequency_delays_the_actor_and_the_targets_as_cleanrl_does():
    """CleanRL's ``policy_frequency`` 2: the critic steps every update, the actor and the soft
    targets every second one (the default)."""
    algo = make_algo(policy_frequency=2)
    actor, critic, critic_target = (params_of(m) for m in (algo.actor, algo.critic, algo.critic_target))
    stats, _ = algo.update(make_batch())
    assert "losses/actor_loss" not in stats
    assert all(torch.equal(a, b) for a, b in zip(actor, params_of(algo.actor)))
    assert all(torch.equal(a, b) for a, b in zip(critic_target, params_of(algo.critic_target)))
    assert any(not torch.equal(a, b) for a, b in zip(critic, params_of(algo.critic)))
    stats, _ = algo.update(make_batch(seed=1))
    assert "losses/actor_loss" in stats
    assert any(not torch.equal(a, b) for a, b in zip(actor, params_of(algo.actor)))
    assert any(not torch.equal(a, b) for a, b in zip(critic_target, params_of(algo.critic_target)))
    assert DDPGConfig().policy_frequency == 2


def test_soft_target_update_is_polyak_averaging():
    algo = make_algo(tau=0.1)
    target_before = params_of(algo.critic_target)
    algo.update(make_batch())
    for old, new_target, online in zip(target_before, algo.critic_target.parameters(), algo.critic.parameters()):
        torch.testing.assert_close(new_target, 0.9 * old + 0.1 * online.detach())
    assert not torch.equal(target_before[0], algo.critic_target.mlp[0].weight)


def test_hard_target_update_copies_every_n_updates():
    algo = make_algo(target_update="hard", hard_update_every=3)
    actor_target_init = params_of(algo.actor_target)
    for _ in range(2):
        algo.update(make_batch())
    for a, b in zip(actor_target_init, algo.actor_target.parameters()):
        assert torch.equal(a, b)
    algo.update(make_batch())
    for target, online in ((algo.actor_target, algo.actor), (algo.critic_target, algo.critic)):
        for a, b in zip(target.parameters(), online.parameters()):
            assert torch.equal(a, b)


def test_grad_clipping_clips_what_the_optimizer_sees_and_reports_the_norm_before():
    algo = make_algo(critic_max_grad_norm=1e-3)
    seen = []
    step = algo.critic_optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(torch.sqrt(sum(p.grad.square().sum() for p in algo.critic.parameters())).item())
        return step(*args, **kwargs)

    algo.critic_optimizer.step = recording_step
    stats, _ = algo.update(make_batch())
    assert stats["losses/critic_grad_norm"] > 1e-2
    assert seen == [pytest.approx(1e-3, rel=1e-4)]


def test_state_dict_round_trip_resumes_exactly():
    algo = make_algo(seed=0, normalize_obs=True)
    for seed in range(3):
        algo.observe_inserted(make_batch(seed=seed + 20).obs * 3 + 1)  # the z-filter moves too
        algo.update(make_batch(seed=seed))
    assert algo.obs_normalizer.stats["_"].count.item() == 12
    buffer = io.BytesIO()
    torch.save(algo.state_dict(), buffer)
    buffer.seek(0)
    restored = make_algo(seed=1, normalize_obs=True)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.iteration == 3
    stats_a, td_a = algo.update(make_batch(seed=9))
    stats_b, td_b = restored.update(make_batch(seed=9))  # same optimizer moments -> same step
    assert stats_a == stats_b
    np.testing.assert_array_equal(td_a, td_b)
    for net in ("actor", "critic", "actor_target", "critic_target", "obs_normalizer"):
        for a, b in zip(getattr(algo, net).state_dict().values(), getattr(restored, net).state_dict().values()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_policy_with_actor_params_acts_like_the_learner(normalize_obs):
    algo = make_algo(normalize_obs=normalize_obs)
    for seed in range(3):
        batch = make_batch(seed=seed, obs=np.random.default_rng(seed).normal(5, 2, (4, 3)).astype(np.float32))
        algo.observe_inserted(batch.obs)
        algo.update(batch)
    policy = DDPGPolicy(algo.config, OBS_SPACE, ACTION_SPACE, num_envs=5, seed=0)
    policy.load_params(algo.actor_params(), version=7)
    obs = np.random.default_rng(1).uniform(-1, 1, (5, 3)).astype(np.float32)
    with torch.no_grad():
        x = torch.as_tensor(obs)
        expected = algo.actor(algo.obs_normalizer(x) if normalize_obs else x).numpy()
    out = policy.act(obs, ActMode.EVAL_DETERMINISTIC)
    np.testing.assert_allclose(out.actions, expected, rtol=1e-6, atol=1e-6)
    assert out.actions.shape == (5, 2) and out.actions.dtype == np.float32 and out.extras == {}
    assert policy.version == 7


def test_training_noise_is_scaled_to_the_bounds_and_clipped():
    config = DDPGConfig(**SMALL, noise=NoiseConfig(sigma=0.2))
    policy = DDPGPolicy(config, OBS_SPACE, ACTION_SPACE, num_envs=4000, seed=0)
    obs = np.zeros((4000, 3), np.float32)
    mean = policy.act(obs, ActMode.EVAL_DETERMINISTIC).actions
    actions = policy.act(obs, ActMode.TRAINING).actions
    assert np.all(actions >= ACTION_SPACE.low) and np.all(actions <= ACTION_SPACE.high)
    # dimension 0 spans [-2, 2] (half-range 2, mean action near 0): std = 0.2 * 2
    assert (actions[:, 0] - mean[:, 0]).std() == pytest.approx(0.4, rel=0.05)
    eval_actions = policy.act(obs, ActMode.EVAL_STOCHASTIC).actions
    assert (eval_actions[:, 0] - mean[:, 0]).std() == pytest.approx(0.05 * 2, rel=0.05)


def test_episode_start_resets_that_envs_ou_noise():
    config = DDPGConfig(**SMALL, noise=NoiseConfig(kind="ou"))
    policy = DDPGPolicy(config, OBS_SPACE, ACTION_SPACE, num_envs=2, seed=0)
    policy.act(np.zeros((2, 3), np.float32))
    policy.on_episode_start(1)
    assert np.all(policy.noise.state[1] == 0) and np.all(policy.noise.state[0] != 0)


def test_per_agent_noise_scale_reaches_the_policy():
    config = DDPGConfig(**SMALL, noise=NoiseConfig(sigma=0.4, agent_schedule="linear"))
    sigmas = [DDPGPolicy(config, OBS_SPACE, ACTION_SPACE, 1, agent_id=k, num_agents=4).noise.sigma
              for k in range(4)]
    assert sigmas == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_parameter_noise_adapts_toward_the_target_action_distance():
    noise = NoiseConfig(sigma=0.0, param_noise=True, param_initial_sigma=0.01, param_target_distance=0.3,
                        param_adapt_coef=1.05, param_adapt_every=1)
    config = DDPGConfig(actor_hidden=(32, 32), noise=noise)
    torch.manual_seed(0)
    policy = DDPGPolicy(config, OBS_SPACE, ACTION_SPACE, num_envs=64, seed=0)
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    clean = policy.act(obs, ActMode.EVAL_DETERMINISTIC).actions
    assert np.all(policy.act(obs, ActMode.TRAINING).actions != clean)
    distances = []
    for _ in range(300):
        perturbed = policy.act(obs, ActMode.TRAINING).actions
        distances.append(np.sqrt(np.mean(((perturbed - clean) / policy.actor.action_scale.numpy()) ** 2)))
    assert policy.param_noise.sigma > 0.01  # it had to grow from the tiny initial sigma
    assert np.mean(distances[-100:]) == pytest.approx(0.3, rel=0.5)


def test_dict_observations_with_an_image_stem():
    space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
                             "state": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    rng = np.random.default_rng(0)

    def obs(n):
        return {"pixels": rng.integers(0, 256, (n, 1, 36, 36), dtype=np.uint8),
                "state": rng.uniform(-1, 1, (n, 2)).astype(np.float32)}

    algo = make_algo(obs_space=space, normalize_obs=True)
    batch = make_batch(4)._replace(obs=obs(4), next_obs=obs(4))
    algo.observe_inserted(batch.obs)  # numpy leaves; only "state" has statistics
    assert set(algo.obs_normalizer.stats) == {"state"} and algo.obs_normalizer.stats["state"].count.item() == 4
    stats, td_errors = algo.update(batch)
    assert np.isfinite(list(stats.values())).all() and td_errors.shape == (4,)
    policy = DDPGPolicy(algo.config, space, ACTION_SPACE, num_envs=3)
    policy.load_params(algo.actor_params(), version=1)
    assert policy.act(obs(3)).actions.shape == (3, 2)


def test_only_bounded_box_actions_are_accepted():
    with pytest.raises(ValueError, match="Discrete"):
        DDPGTrainer(DDPGConfig(**SMALL), OBS_SPACE, gym.spaces.Discrete(3), device="cpu")
    with pytest.raises(ValueError, match="finite bounds"):
        DDPGPolicy(DDPGConfig(**SMALL), OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, (2,)), num_envs=1)


def test_config_from_dict_and_validation():
    config = from_dict(DDPGConfig, {"actor_hidden": [64, 64], "critic_max_grad_norm": 5,
                                    "noise": {"kind": "ou", "sigma": 0.2}})
    assert config.actor_hidden == (64, 64) and config.noise.kind == "ou" and config.critic_max_grad_norm == 5.0
    with pytest.raises(ConfigError, match="target_update"):
        from_dict(DDPGConfig, {"target_update": "polyak"})
    with pytest.raises(ConfigError, match="activation"):
        from_dict(DDPGConfig, {"activation": "gelu"})
    with pytest.raises(ValueError, match="policy_frequency must be >= 1, got 0"):
        DDPGConfig(policy_frequency=0)
    with pytest.raises(ConfigError, match="n_step"):  # a shared off-policy setting: not DDPG's section
        from_dict(DDPGConfig, {"n_step": 3})


@pytest.mark.parametrize("selector", ["uniform", "prioritized"])
def test_offpolicy_loop_feeds_replay_and_updates_at_the_replay_ratio(selector):
    from surreal_redis.envs import EnvConfig, make_vector_env
    from surreal_redis.replay import ReplayConfig
    from surreal_redis.replay.feeds import OffPolicyConfig
    from surreal_redis.testing.offpolicy_loop import OffPolicyLoopConfig, evaluate, run_offpolicy

    config = DDPGConfig(**SMALL, device="cpu")
    envs = make_vector_env(EnvConfig(env_id="Pendulum-v1", max_episode_steps=40), 2, seed=0)
    algo = DDPGTrainer(config, envs.single_observation_space, envs.single_action_space)
    policy = DDPGPolicy(config, envs.single_observation_space, envs.single_action_space, 2, seed=0)
    off_policy = OffPolicyConfig(batch_size=16, n_step=3, learning_starts=90, updates_per_step=0.5, max_train_s=None,
                                 replay=ReplayConfig(capacity=1000, selector=selector))
    loop = OffPolicyLoopConfig(total_steps=200, chunk_steps=25, off_policy=off_policy)
    result = run_offpolicy(algo, policy, envs, loop, gamma=config.gamma)
    envs.close()
    # chunks of 2 x 25 steps; after the second chunk the replay holds 100 - 2 * 2 waiting steps >= 90,
    # then 0.5 updates per step for chunks 2 to 4
    assert result.steps == 200 and result.updates == algo.iteration == 3 * 25
    assert policy.version == result.updates
    assert len(result.episode_returns) == 2 * 2  # 2 envs x 100 steps, episodes of 40 steps
    assert np.isfinite(list(result.last_stats.values())).all()
    eval_envs = make_vector_env(EnvConfig(env_id="Pendulum-v1", max_episode_steps=40), 3, seed=5)
    assert len(evaluate(policy, eval_envs)) == 3
    eval_envs.close()
