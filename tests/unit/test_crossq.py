"""CrossQ (surreal_redis/algos/crossq): SAC without target networks, batch-normalized twin critics
evaluated jointly on [(s, a); (s', a')] in train mode, the actor against the critics in eval mode,
one actor step every ``policy_frequency`` critic steps, Adam with beta1 0.5."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch

from surreal_redis.algos import registry
from surreal_redis.algos.base import ActMode
from surreal_redis.algos.crossq.config import CrossQConfig
from surreal_redis.algos.crossq.trainer import BN_EPS, CrossQTrainer
from surreal_redis.algos.policies import make_policy
from surreal_redis.algos.sac.numpy_policy import NumpySACPolicy
from surreal_redis.algos.sac.policy import SACPolicy
from surreal_redis.chunks import TransitionBatch
from surreal_redis.config import load_config
from surreal_redis.configtools import ConfigError, from_dict
from tests.unit.test_sac import ACTION_SPACE, OBS_SPACE, make_batch

SMALL = {"actor_hidden": (8,), "critic_hidden": (16, 16)}


def make_algo(seed: int = 0, **overrides) -> CrossQTrainer:
    torch.manual_seed(seed)
    return CrossQTrainer(CrossQConfig(**{**SMALL, **overrides}), OBS_SPACE, ACTION_SPACE, device="cpu", seed=seed)


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def changed(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def batch_norms(algo: CrossQTrainer) -> list[torch.nn.BatchNorm1d]:
    return [m for m in algo.critic.modules() if isinstance(m, torch.nn.BatchNorm1d)]


def next_sample(algo: CrossQTrainer, batch: TransitionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The a' ~ pi(.|s') and log pi(a'|s') the next update draws (its generator's first draw)."""
    generator = torch.Generator()
    generator.set_state(algo.generator.get_state())
    with torch.no_grad():
        return algo.actor.sample(torch.as_tensor(batch.next_obs), generator=generator)


def joint_q(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One critic's MLP written out, each BatchNorm normalizing with the statistics of all rows
    of ``x`` (train mode: the biased batch variance)."""
    for layer in net.mlp:
        if isinstance(layer, torch.nn.BatchNorm1d):
            x = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + BN_EPS) * layer.weight + layer.bias
        else:
            x = layer(x)
    return x[:, 0]


def test_the_critics_are_batch_normalized_before_every_linear_and_there_is_no_target():
    algo = make_algo()
    layers = [type(m).__name__ for m in algo.critic.q1.mlp]
    assert layers == ["BatchNorm1d", "Linear", "ReLU", "BatchNorm1d", "Linear", "ReLU", "BatchNorm1d", "Linear"]
    assert all(m.momentum == 0.01 and m.eps == BN_EPS for m in batch_norms(algo))
    assert not hasattr(algo, "critic_target") and "critic_target" not in algo.state_dict()
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in algo.actor.modules())  # SAC's actor
    for optimizer in (algo.actor_optimizer, algo.critic_optimizer):
        assert optimizer.param_groups[0]["betas"] == (0.5, 0.999) and optimizer.param_groups[0]["lr"] == 1e-3
    assert algo.alpha_optimizer.param_groups[0]["betas"] == (0.9, 0.999)


def test_the_critic_step_matches_the_joint_forward_written_out():
    """One update against the equations: y from the critic itself on the second half of one
    train-mode forward over [(s, a); (s', a')] (its BatchNorms normalizing both halves together),
    detached; both critics regressed on it with Adam (0.5, 0.999)."""
    algo = make_algo(policy_frequency=5, autotune=False, alpha=0.2)  # no actor step in the first update
    batch = make_batch(6, discounts=np.array([0.99, 0.0, 0.99, 0.99, 0.0, 0.99], np.float32),
                       weights=np.array([1.0, 0.5, 2.0, 1.0, 1.0, 0.0], np.float32))
    critic = copy.deepcopy(algo.critic)
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.5, 0.999))
    next_actions, next_log_prob = next_sample(algo, batch)
    x = torch.cat([torch.cat([torch.as_tensor(batch.obs), torch.as_tensor(batch.actions)], -1),
                   torch.cat([torch.as_tensor(batch.next_obs), next_actions], -1)])
    q1, next_q1 = joint_q(critic.q1, x).chunk(2)
    q2, next_q2 = joint_q(critic.q2, x).chunk(2)
    y = (torch.as_tensor(batch.rewards) + torch.as_tensor(batch.discounts)
         * (torch.min(next_q1, next_q2) - 0.2 * next_log_prob)).detach()
    w = torch.as_tensor(batch.weights)
    loss = (w * (q1 - y) ** 2).mean() + (w * (q2 - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    stats, td_errors = algo.update(batch)
    np.testing.assert_allclose(td_errors, torch.maximum((y - q1).abs(), (y - q2).abs()).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    assert stats["losses/critic_loss"] == pytest.approx(loss.item(), rel=1e-5)
    for ours, theirs in zip(algo.critic.parameters(), critic.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # separate forwards of (s, a) and (s', a') would have given other Q values
    q1_alone = joint_q(copy.deepcopy(algo.critic).q1, x[:6])
    assert not torch.allclose(q1_alone, joint_q(algo.critic.q1, x)[:6], atol=1e-3)


def test_the_running_statistics_are_those_of_the_joint_batch_and_the_actor_step_leaves_them():
    """The first BatchNorm sees the input [(s, a); (s', a')]: after the first update its running
    mean is momentum * their mean (from 0). The actor's step evaluates the critics in eval mode:
    with their running statistics, which it leaves as they were."""
    algo = make_algo(policy_frequency=1)
    first = algo.critic.q1.mlp[0]
    modes: list[tuple[bool, int]] = []
    first.register_forward_pre_hook(lambda module, inputs: modes.append((module.training, inputs[0].shape[0])))
    batch = make_batch(8)
    next_actions, _ = next_sample(algo, batch)
    joint = torch.cat([torch.cat([torch.as_tensor(batch.obs), torch.as_tensor(batch.actions)], -1),
                       torch.cat([torch.as_tensor(batch.next_obs), next_actions], -1)])
    stats, _ = algo.update(batch)
    assert "losses/actor_loss" in stats
    assert modes == [(True, 16), (False, 8)]  # the joint critic forward, then the actor loss's
    torch.testing.assert_close(first.running_mean, 0.01 * joint.mean(0))
    torch.testing.assert_close(first.running_var, 0.99 + 0.01 * joint.var(0, unbiased=True))
    assert first.num_batches_tracked.item() == 1


def test_the_actor_and_temperature_step_once_every_policy_frequency_updates():
    algo = make_algo()
    assert algo.config.policy_frequency == 3
    for iteration in range(1, 7):
        actor, critic, log_alpha = params(algo.actor), params(algo.critic), algo.log_alpha.item()
        stats, _ = algo.update(make_batch(seed=iteration))
        stepped = iteration % 3 == 0
        assert changed(critic, algo.critic)
        assert changed(actor, algo.actor) == stepped and (algo.log_alpha.item() != log_alpha) == stepped
        assert ("losses/actor_loss" in stats) == ("losses/alpha_loss" in stats) == stepped
        assert all(np.isfinite(value) for value in stats.values())
    assert algo.iteration == 6


def test_a_termination_drops_the_bootstrap_and_a_truncation_keeps_it_from_the_critic_itself():
    algo = make_algo(autotune=False, alpha=0.2)
    with torch.no_grad():  # Q(s, a) = 2 everywhere, for both critics (BatchNorm included)
        for critic in (algo.critic.q1, algo.critic.q2):
            for p in critic.parameters():
                p.zero_()
            critic.mlp[-1].bias.fill_(2.0)
    batch = make_batch(2, rewards=np.array([1.0, 1.0], np.float32), next_obs=np.zeros((2, 3), np.float32),
                       discounts=np.array([0.99, 0.0], np.float32))  # truncated (bootstraps), terminated
    _, next_log_prob = next_sample(algo, batch)
    _, td_errors = algo.update(batch)
    assert td_errors[1] == pytest.approx(1.0, abs=1e-6)
    assert td_errors[0] == pytest.approx(abs(1 + 0.99 * (2 - 0.2 * next_log_prob[0].item()) - 2), abs=1e-5)


@pytest.mark.parametrize(("field", "value"), [
    ("bn_momentum", 0.0), ("bn_momentum", 1.5), ("bn_momentum", float("nan")), ("adam_beta1", 1.0),
    ("adam_beta1", -0.1), ("policy_frequency", 0), ("critic_hidden", (0,)), ("critic_lr", 0.0), ("gamma", 2.0),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CrossQConfig(**{field: value})


def test_config_from_yaml_data_overrides_and_the_shipped_config():
    config = load_config("crossq_halfcheetah")
    section = config.algo_config
    assert config.algo == "crossq" and type(section) is CrossQConfig
    assert (section.policy_frequency, section.adam_beta1, section.bn_momentum, section.critic_lr) == (3, 0.5, 0.01, 1e-3)
    sac = load_config("sac_halfcheetah")
    for name in ("env", "agent", "eval", "stop", "off_policy", "hub", "learner"):
        assert getattr(config, name) == getattr(sac, name), name
    assert from_dict(CrossQConfig, {"critic_hidden": [2048, 2048]}).critic_hidden == (2048, 2048)
    for override, key in (("crossq.bn_momentum=0", "crossq: bn_momentum"), ("crossq.adam_beta1=1", "crossq: adam_beta1")):
        with pytest.raises(ConfigError, match=key) as error:
            load_config("crossq_halfcheetah", [override])
        assert "\n" not in str(error.value)
    for key in ("tau", "target_network_frequency", "compile"):  # SAC's target and capture settings
        with pytest.raises(ConfigError, match=f"unknown config key 'crossq.{key}'"):
            load_config("crossq_halfcheetah", [f"crossq.{key}=1"])


def test_state_dict_round_trip_resumes_exactly():
    algo = make_algo(seed=0, normalize_obs=True)
    for seed in range(4):
        algo.observe_inserted(make_batch(seed=seed + 20).obs * 3 + 1)
        algo.update(make_batch(seed=seed))
    buffer = io.BytesIO()
    torch.save(algo.state_dict(), buffer)
    buffer.seek(0)
    restored = make_algo(seed=1, normalize_obs=True)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.iteration == 4 and restored.alpha == algo.alpha
    assert torch.equal(restored.critic.q1.mlp[0].running_mean, algo.critic.q1.mlp[0].running_mean)
    for seed in (9, 10):  # the second one steps the actor
        stats_a, td_a = algo.update(make_batch(seed=seed))
        stats_b, td_b = restored.update(make_batch(seed=seed))
        assert stats_a == stats_b
        np.testing.assert_array_equal(td_a, td_b)
    for net in ("actor", "critic", "obs_normalizer"):
        for a, b in zip(getattr(algo, net).state_dict().values(), getattr(restored, net).state_dict().values()):
            assert torch.equal(a, b)


def test_agents_act_with_sacs_policies_on_the_trained_actor():
    spec = registry.algorithm("crossq")
    assert not spec.on_policy and spec.config_class is CrossQConfig
    config = CrossQConfig(**SMALL)
    numpy_policy = make_policy(config, OBS_SPACE, ACTION_SPACE, 2, 0, 1, 0)
    torch_policy = make_policy(config, OBS_SPACE, ACTION_SPACE, 2, 0, 1, 0, "torch")
    assert isinstance(numpy_policy, NumpySACPolicy) and isinstance(torch_policy, SACPolicy)
    algo = make_algo()
    for seed in range(3):
        algo.update(make_batch(seed=seed))
    obs = np.zeros((2, 3), np.float32)
    for policy in (numpy_policy, torch_policy):
        policy.load_params(algo.actor_params(), 3)
    np.testing.assert_allclose(numpy_policy.act(obs, ActMode.EVAL_DETERMINISTIC).actions,
                               torch_policy.act(obs, ActMode.EVAL_DETERMINISTIC).actions, rtol=1e-5, atol=1e-6)


def test_an_off_policy_loop_with_prioritized_replay_trains():
    from surreal_redis.envs import EnvConfig, make_vector_env
    from surreal_redis.replay import ReplayConfig
    from surreal_redis.replay.feeds import OffPolicyConfig
    from surreal_redis.testing.offpolicy_loop import OffPolicyLoopConfig, run_offpolicy

    config = CrossQConfig(**SMALL, device="cpu")
    envs = make_vector_env(EnvConfig(env_id="Pendulum-v1", max_episode_steps=40), 2, seed=0)
    algo = CrossQTrainer(config, envs.single_observation_space, envs.single_action_space)
    policy = NumpySACPolicy(config, envs.single_observation_space, envs.single_action_space, 2, seed=0)
    off_policy = OffPolicyConfig(batch_size=16, n_step=3, learning_starts=90, updates_per_step=0.5, max_train_s=None,
                                 replay=ReplayConfig(selector="prioritized", capacity=1000))
    result = run_offpolicy(algo, policy, envs, OffPolicyLoopConfig(total_steps=200, chunk_steps=25,
                                                                    off_policy=off_policy), config.gamma)
    envs.close()
    assert result.updates == algo.iteration == 75 and policy.version == result.updates
    assert np.isfinite(list(result.last_stats.values())).all()
