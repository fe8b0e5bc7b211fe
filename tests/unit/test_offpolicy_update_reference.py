"""SAC's and DDPG's updates against a plain reference written out here (two critics called one by
one, Adam's default loop, Polyak averaging as ``mul_`` / ``add_``, stats read with ``.item()``):
the same weights after several updates from the same seed and data, within float rounding. Plus
what the faster update changed on purpose: actor steps leave the critics' gradients alone, and
the target averager is ``lerp_`` per tensor."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.algos.actor_critic import ActorCriticTrainer
from surreal_redis.algos.ddpg.policy import DDPGConfig
from surreal_redis.algos.ddpg.trainer import DDPGTrainer
from surreal_redis.algos.networks import TargetAverager, mlp, soft_update
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.algos.sac.trainer import SACTrainer
from surreal_redis.chunks import TransitionBatch

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
ACTION_SPACE = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
HIDDEN = {"actor_hidden": (16, 16), "critic_hidden": (16, 16)}
UPDATES = 8


def batches(count: int = UPDATES, size: int = 32) -> list[TransitionBatch]:
    rng = np.random.default_rng(3)
    return [TransitionBatch(
        obs=rng.uniform(-1, 1, (size, 5)).astype(np.float32),
        actions=rng.uniform([-2, 0], [2, 1], (size, 2)).astype(np.float32),
        rewards=rng.normal(size=size).astype(np.float32),
        next_obs=rng.uniform(-1, 1, (size, 5)).astype(np.float32),
        discounts=rng.choice([0.0, 0.99], size).astype(np.float32),
        weights=rng.uniform(0.5, 1.5, size).astype(np.float32),
        indices=np.arange(size)) for _ in range(count)]


def tensors(batch: TransitionBatch) -> list[torch.Tensor]:
    return [torch.as_tensor(x) for x in (batch.obs, batch.next_obs, batch.actions, batch.rewards,
                                         batch.discounts, batch.weights)]


def polyak(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, p in zip(target.parameters(), online.parameters()):
            t.mul_(1 - tau).add_(tau * p)


def assert_same_modules(ours: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, a), b in zip(ours.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6, msg=name)


class ReferenceSAC:
    """The SAC update as the module docstring of ``sac/trainer.py`` writes it, one critic at a time."""

    def __init__(self, algo: SACTrainer, seed: int) -> None:
        self.config = algo.config
        self.actor, self.critic = copy.deepcopy(algo.actor), copy.deepcopy(algo.critic)
        self.critic_target = copy.deepcopy(algo.critic_target)
        self.log_alpha = algo.log_alpha.detach().clone().requires_grad_(True)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=self.config.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=self.config.critic_lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=self.config.alpha_lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.target_entropy = algo.target_entropy
        self.iteration = 0

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        obs, next_obs, actions, rewards, discounts, weights = tensors(batch)
        c, gen = self.config, self.generator
        alpha = self.log_alpha.exp().item() if c.autotune else c.alpha
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(next_obs, generator=gen)
            next_q = torch.min(self.critic_target.q1(next_obs, next_actions),
                               self.critic_target.q2(next_obs, next_actions))
            target_q = rewards + discounts * (next_q - alpha * next_log_prob)
        q1, q2 = self.critic.q1(obs, actions), self.critic.q2(obs, actions)
        critic_loss = (weights * (target_q - q1) ** 2).mean() + (weights * (target_q - q2) ** 2).mean()
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()
        self.iteration += 1
        stats = {"losses/critic_loss": critic_loss.item()}
        if self.iteration % c.policy_frequency == 0:
            for _ in range(c.policy_frequency):
                pi, log_prob = self.actor.sample(obs, generator=gen)
                actor_loss = (alpha * log_prob - torch.min(self.critic.q1(obs, pi), self.critic.q2(obs, pi))).mean()
                self.actor_opt.zero_grad()
                actor_loss.backward()
                self.actor_opt.step()
                stats["losses/actor_loss"] = actor_loss.item()
                if not c.autotune:
                    continue
                with torch.no_grad():
                    _, log_prob = self.actor.sample(obs, generator=gen)
                alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).mean()
                self.alpha_opt.zero_grad()
                alpha_loss.backward()
                self.alpha_opt.step()
                alpha = self.log_alpha.exp().item()
        if self.iteration % c.target_network_frequency == 0:
            polyak(self.critic_target, self.critic, c.tau)
        stats["losses/alpha"] = alpha
        return stats


class ReferenceDDPG:
    """The DDPG update as the module docstring of ``ddpg/trainer.py`` writes it."""

    def __init__(self, algo: DDPGTrainer) -> None:
        self.config = c = algo.config
        self.actor, self.critic = copy.deepcopy(algo.actor), copy.deepcopy(algo.critic)
        self.actor_target, self.critic_target = copy.deepcopy(algo.actor_target), copy.deepcopy(algo.critic_target)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr, weight_decay=c.critic_l2)
        self.iteration = 0

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        obs, next_obs, actions, rewards, discounts, weights = tensors(batch)
        c = self.config
        with torch.no_grad():
            target_q = rewards + discounts * self.critic_target(next_obs, self.actor_target(next_obs))
        critic_loss = (weights * (target_q - self.critic(obs, actions)) ** 2).mean()
        self.critic_opt.zero_grad()
        critic_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), c.critic_max_grad_norm or float("inf"))
        self.critic_opt.step()
        self.iteration += 1
        stats = {"losses/critic_loss": critic_loss.item(), "losses/critic_grad_norm": norm.item()}
        if self.iteration % c.policy_frequency == 0:
            actor_loss = -self.critic(obs, self.actor(obs)).mean()
            self.actor_opt.zero_grad()
            actor_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.actor.parameters(), c.actor_max_grad_norm or float("inf"))
            self.actor_opt.step()
            stats["losses/actor_loss"] = actor_loss.item()
            polyak(self.actor_target, self.actor, c.tau)
            polyak(self.critic_target, self.critic, c.tau)
        return stats


def assert_takes_the_reference_steps(algo, reference, modules: tuple[str, ...]) -> None:
    """``algo`` and ``reference`` update on the same :func:`batches`: the same stats at each
    update and the same weights of ``modules`` after them."""
    for batch in batches():
        stats, _ = algo.update(batch)
        for name, value in reference.update(batch).items():
            assert stats[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for module in modules:
        assert_same_modules(getattr(algo, module), getattr(reference, module))


@pytest.mark.parametrize("overrides", [{}, {"policy_frequency": 1, "target_network_frequency": 2},
                                       {"policy_frequency": 3}, {"autotune": False, "alpha": 0.1}])
def test_sac_update_takes_the_reference_steps(overrides):
    torch.manual_seed(0)
    algo = SACTrainer(SACConfig(**HIDDEN, **overrides, critic_lr=1e-3), OBS_SPACE, ACTION_SPACE, device="cpu", seed=7)
    reference = ReferenceSAC(algo, seed=7)
    assert_takes_the_reference_steps(algo, reference, ("actor", "critic", "critic_target"))
    torch.testing.assert_close(algo.log_alpha.detach(), reference.log_alpha.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"policy_frequency": 1, "critic_max_grad_norm": 0.5,
                                            "actor_max_grad_norm": 0.1, "critic_l2": 0.01}])
def test_ddpg_update_takes_the_reference_steps(overrides):
    torch.manual_seed(0)
    algo = DDPGTrainer(DDPGConfig(**HIDDEN, **overrides), OBS_SPACE, ACTION_SPACE, device="cpu")
    reference = ReferenceDDPG(algo)
    assert_takes_the_reference_steps(algo, reference, ("actor", "critic", "actor_target", "critic_target"))


@pytest.mark.parametrize("make", [
    lambda: SACTrainer(SACConfig(**HIDDEN, policy_frequency=1), OBS_SPACE, ACTION_SPACE, device="cpu"),
    lambda: DDPGTrainer(DDPGConfig(**HIDDEN, policy_frequency=1), OBS_SPACE, ACTION_SPACE, device="cpu"),
])
def test_actor_steps_leave_the_critic_gradients_of_the_critic_loss(make):
    """The actor loss backpropagates through the critic to the actions only: after an update with
    an actor step, the critic holds its own loss's gradients, and its parameters still train."""
    algo: ActorCriticTrainer = make()
    batch = batches(1)[0]
    grads = []
    hook = algo.critic_optimizer.register_step_pre_hook(
        lambda *_: grads.append([p.grad.clone() for p in algo.critic.parameters()]))
    algo.update(batch)
    hook.remove()
    assert all(p.requires_grad for p in algo.critic.parameters())
    for before_actor, after_actor in zip(grads[0], [p.grad for p in algo.critic.parameters()]):
        torch.testing.assert_close(after_actor, before_actor, rtol=0, atol=0)


def test_target_averager_is_soft_update_over_every_pair():
    torch.manual_seed(0)
    online = [mlp(4, (8,), 2), mlp(3, (5,), 1)]
    targets = [copy.deepcopy(m) for m in online]
    expected = [copy.deepcopy(m) for m in online]
    for m in online:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p))
    TargetAverager(*zip(targets, online))(0.1)
    for target, reference, source in zip(targets, expected, online):
        soft_update(reference, source, 0.1)
        for a, b in zip(target.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="differ in their parameters"):
        TargetAverager((mlp(4, (8,), 2), mlp(4, (8, 8), 2)))


def test_read_stats_reads_tensors_and_keeps_floats_in_order():
    stats = {"a": torch.tensor(1.5), "b": 2.0, "c": torch.tensor([3.0], dtype=torch.float64)}
    assert ActorCriticTrainer._read_stats(stats) == {"a": 1.5, "b": 2.0, "c": 3.0}
    assert list(ActorCriticTrainer._read_stats(stats)) == ["a", "b", "c"]
    assert ActorCriticTrainer._read_stats({"x": 1}) == {"x": 1.0}
