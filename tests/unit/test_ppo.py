"""PPO: GAE and losses against hand-computed numbers, learner/agent consistency, checkpoints."""

from __future__ import annotations

import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.algos.base import ActMode
from surreal_redis.algos.networks import obs_to_tensor
from surreal_redis.algos.ppo.losses import (
    adapt_kl_coef,
    clipped_surrogate_loss,
    compute_gae,
    explained_variance,
    kl_penalty_loss,
    value_loss,
)
from surreal_redis.algos.ppo.trainer import PPOConfig, PPOPolicy, PPOTrainer
from surreal_redis.chunks import Chunk
from surreal_redis.envs import EnvConfig, make_vector_env
from surreal_redis.testing.local_loop import ChunkCollector


class DictEnv(gym.Env):
    """Dict observations (a vector and a 36x36 image), 3 actions, episodes of 3 to 6 steps that
    end terminated when their length is odd and truncated when it is even."""

    observation_space = gym.spaces.Dict({
        "pos": gym.spaces.Box(-10.0, 10.0, (3,), np.float32),
        "image": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
    })
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._len = 0, int(self.np_random.integers(3, 7))
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        done = self._t >= self._len
        return self._obs(), float(action == 1), done and self._len % 2 == 1, done and self._len % 2 == 0, {}

    def _obs(self):
        return {"pos": (self.np_random.normal(size=3) * 3 + self._t).astype(np.float32),
                "image": self.np_random.integers(0, 255, (1, 36, 36), dtype=np.uint8)}


def dict_envs(num_envs: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([DictEnv] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def cartpole_envs(num_envs: int) -> gym.vector.VectorEnv:
    return make_vector_env(EnvConfig(env_id="CartPole-v1", max_episode_steps=10), num_envs, seed=0)


def pendulum_envs(num_envs: int) -> gym.vector.VectorEnv:
    return make_vector_env(EnvConfig(env_id="Pendulum-v1", max_episode_steps=10), num_envs, seed=0)


SMALL = dict(hidden_sizes=(16, 16), device="cpu")
VARIANTS = {
    "discrete": (PPOConfig(**SMALL), cartpole_envs),
    "continuous_adapt": (PPOConfig(mode="adapt", normalize_obs=True, normalize_reward=True, **SMALL), pendulum_envs),
    "dict_obs": (PPOConfig(normalize_obs=True, **SMALL), dict_envs),
    "lstm": (PPOConfig(use_lstm=True, lstm_hidden=8, normalize_obs=True, **SMALL), dict_envs),
}


def setup(name: str, num_envs: int = 3, seed: int = 0, **overrides):
    config, make_envs = VARIANTS[name]
    config = PPOConfig(**{**config.__dict__, **overrides})
    envs = make_envs(num_envs)
    torch.manual_seed(seed)
    algo = PPOTrainer(config, envs.single_observation_space, envs.single_action_space, seed=seed)
    policy = PPOPolicy(config, envs.single_observation_space, envs.single_action_space, num_envs, seed=seed)
    policy.load_params(algo.actor_params(), 0)
    return algo, policy, ChunkCollector(envs, policy, seed=seed)


# ---------------------------------------------------------------- GAE

GAMMA, LAMBDA = 0.9, 0.8  # gamma * lambda = 0.72
REWARDS, VALUES, NEXT_VALUES = [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [1.0, 2.0, 4.0]
# deltas without episode ends: 1 + .9*1 - .5 = 1.4; 2 + .9*2 - 1 = 2.8; 3 + .9*4 - 1.5 = 5.1


@pytest.mark.parametrize("terminated, truncated, expected", [
    # A2 = 5.1 (chunk end: bootstrap from V(obs[T]) = 4); A1 = 2.8 + .72*5.1; A0 = 1.4 + .72*A1
    ([0, 0, 0], [0, 0, 0], [6.05984, 6.472, 5.1]),
    # terminated at 1: delta1 = 2 - 1 = 1 and the trace stops there: A0 = 1.4 + .72*1
    ([0, 1, 0], [0, 0, 0], [2.12, 1.0, 5.1]),
    # truncated at 1: bootstrap delta1 = 2.8 from V(final obs) = 2, trace stops: A0 = 1.4 + .72*2.8
    ([0, 0, 0], [0, 1, 0], [3.416, 2.8, 5.1]),
])
def test_gae_hand_computed(terminated, truncated, expected):
    advantages, returns = compute_gae(torch.tensor(REWARDS), torch.tensor(VALUES), torch.tensor(NEXT_VALUES),
                                      torch.tensor(terminated, dtype=torch.bool),
                                      torch.tensor(truncated, dtype=torch.bool), GAMMA, LAMBDA)
    torch.testing.assert_close(advantages, torch.tensor(expected))
    torch.testing.assert_close(returns, torch.tensor(expected) + torch.tensor(VALUES))


def test_gae_time_major_batch_matches_columns():
    rng = np.random.default_rng(0)
    r, v, nv = (torch.tensor(rng.normal(size=(5, 3)), dtype=torch.float32) for _ in range(3))
    term, trunc = torch.tensor(rng.random((5, 3)) < 0.2), torch.tensor(rng.random((5, 3)) < 0.2)
    adv, _ = compute_gae(r, v, nv, term, trunc, 0.99, 0.95)
    for b in range(3):
        column, _ = compute_gae(r[:, b], v[:, b], nv[:, b], term[:, b], trunc[:, b], 0.99, 0.95)
        torch.testing.assert_close(adv[:, b], column)


@pytest.mark.parametrize("ended", ["terminated", "truncated"])
def test_learner_bootstraps_from_final_obs_and_chunk_end(ended):
    space = gym.spaces.Box(-5, 5, (4,), np.float32)
    algo = PPOTrainer(PPOConfig(gamma=GAMMA, gae_lambda=LAMBDA, **SMALL), space, gym.spaces.Discrete(2))
    obs = np.arange(16, dtype=np.float32).reshape(4, 4) / 10  # obs[2] is the reset obs of a new episode
    final = np.full(4, -1.0, dtype=np.float32)  # the true last obs of the episode that ended at t=1
    flags = {"terminated": np.zeros(3, bool), "truncated": np.zeros(3, bool)}
    flags[ended][1] = True
    chunk = Chunk(0, 0, obs, np.array([0, 1, 0]), np.array(REWARDS, np.float32), flags["terminated"],
                  flags["truncated"], {1: final}, np.zeros(3, np.int64), {"logp": np.zeros(3, np.float32)})
    rollout = algo._rollout([chunk])
    with torch.no_grad():
        v = algo.net.value(algo.net.features(torch.as_tensor(np.concatenate([obs, final[None]]))))
    next_values = torch.stack([v[1], v[4], v[3]])  # V(obs1), V(final), V(obs[T])
    expected, _ = compute_gae(torch.tensor(REWARDS), v[:3], next_values, torch.tensor(flags["terminated"]),
                              torch.tensor(flags["truncated"]), GAMMA, LAMBDA)
    torch.testing.assert_close(rollout.advantages[:, 0], expected)
    if ended == "truncated":  # the bootstrap really is V(final), not V(obs[2])
        assert not torch.isclose(v[4], v[2])


# ---------------------------------------------------------------- losses

def test_losses_hand_computed():
    logratio = torch.log(torch.tensor([0.5, 1.0, 1.5]))
    adv = torch.tensor([1.0, -1.0, 2.0])
    # -A*r = [-.5, 1, -3]; -A*clip(r, .8, 1.2) = [-.8, 1, -2.4]; max = [-.5, 1, -2.4]
    assert clipped_surrogate_loss(logratio, adv, 0.2).item() == pytest.approx(-1.9 / 3)
    # -mean(r*A) + beta*mean(KL) = -(.5 - 1 + 3)/3 + .5*.2
    kl = torch.tensor([0.1, 0.2, 0.3])
    assert kl_penalty_loss(logratio, adv, kl, 0.5).item() == pytest.approx(-2.5 / 3 + 0.1)
    values, returns, old = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 0.0]), torch.tensor([0.8, 2.5])
    assert value_loss(values, returns, old, None).item() == pytest.approx(0.5 * (0.25 + 4.0) / 2)
    # clipped values: .8 + .2 = 1.0, 2.5 - .2 = 2.3 -> squared errors .25, 5.29; max with [.25, 4]
    assert value_loss(values, returns, old, 0.2).item() == pytest.approx(0.5 * (0.25 + 5.29) / 2)


def test_adapt_kl_coef_rule_and_bounds():
    assert adapt_kl_coef(1.0, 0.001, 0.01) == 0.5  # < target / 1.5
    assert adapt_kl_coef(1.0, 0.02, 0.01) == 2.0  # > target * 1.5
    assert adapt_kl_coef(1.0, 0.012, 0.01) == 1.0
    assert adapt_kl_coef(80.0, 1.0, 0.01, bounds=(0.1, 100.0)) == 100.0
    assert adapt_kl_coef(0.15, 0.0, 0.01, bounds=(0.1, 100.0)) == 0.1


def test_explained_variance():
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(torch.full((4,), 2.5), returns) == pytest.approx(0.0)
    assert math.isnan(explained_variance(returns, torch.ones(4)))


# ---------------------------------------------------------------- learner <-> agent

@pytest.mark.parametrize("name", list(VARIANTS))
def test_learner_reproduces_agent_log_probs_and_values(name):
    """The learner's recomputation (z-filter, CNN, LSTM re-run with resets) matches the agent."""
    algo, policy, collector = setup(name, update_epochs=1, num_minibatches=1)
    algo.update(collector.collect(12))  # non-trivial normalizer statistics, LSTM state carried over
    policy.load_params(algo.actor_params(), 1)
    chunks = collector.collect(12)
    assert any(c.final_obs for c in chunks)
    if name == "lstm":
        assert all(np.abs(c.extras["initial_state"]["lstm_h"]).sum() > 0 for c in chunks)
    rollout = algo._rollout(chunks)
    agent_values = torch.as_tensor(np.stack([c.extras["value"] for c in chunks], axis=1))
    torch.testing.assert_close(rollout.values, agent_values, atol=1e-5, rtol=1e-5)
    kl_coef = algo.kl_coef
    stats = algo.update(chunks)  # one epoch of one minibatch: ratio 1 exactly on-policy
    assert stats["approx_kl"] < 1e-6 and stats["clip_fraction"] == 0.0
    assert abs(stats["policy_loss"]) < 1e-5  # -mean(normalized advantages)
    if name == "continuous_adapt":  # KL below target / 1.5: the coefficient is halved for the next update
        assert stats["kl"] < 1e-6 and stats["kl_coef"] == kl_coef and algo.kl_coef == kl_coef / 2


@pytest.mark.parametrize("name", list(VARIANTS))
def test_actor_params_give_the_learners_distribution(name):
    algo, policy, collector = setup(name)
    algo.update(collector.collect(8))
    params = algo.actor_params()
    assert all(isinstance(v, np.ndarray) for v in params.values())
    assert any("obs_normalizer" in k for k in params) == algo.config.normalize_obs
    policy.load_params(params, 7)
    assert policy.version == 7
    obs = collector.obs
    output = policy.act(obs, ActMode.TRAINING)
    with torch.no_grad():
        x = algo.net.features(obs_to_tensor(obs, "cpu"))
        state = None
        if algo.net.lstm is not None:
            state = tuple(torch.as_tensor(output.extras["initial_state"][k]) for k in ("lstm_h", "lstm_c"))
        z, _ = algo.net.core(x, state, torch.zeros(1, x.shape[0], dtype=torch.bool))
        dist = algo.net.distribution(algo.net.policy_head(z))
        raw = output.extras["raw_action"] if algo.net.continuous else output.actions
        logp = dist.log_prob(torch.as_tensor(raw))
    np.testing.assert_allclose(output.extras["logp"], logp.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(output.extras["value"], algo.net.value(z).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_state_dict_round_trip(name):
    algo, policy, collector = setup(name, seed=1)
    algo.update(collector.collect(8))
    buffer = io.BytesIO()
    torch.save(algo.state_dict(), buffer)
    buffer.seek(0)
    restored, *_ = setup(name, seed=2)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.iteration == algo.iteration == 1 and restored.kl_coef == algo.kl_coef
    for key, value in algo.actor_params().items():
        np.testing.assert_array_equal(restored.actor_params()[key], value)
    chunks = collector.collect(8)
    assert restored.update(chunks) == algo.update(chunks)  # optimizer, shuffling RNG, scalers restored
    for key, value in algo.actor_params().items():
        np.testing.assert_array_equal(restored.actor_params()[key], value)


# ---------------------------------------------------------------- agent policy

def test_box_actions_clipped_for_the_env_but_not_in_the_log_prob():
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 0.5], np.float32))
    config = PPOConfig(init_log_std=1.0, **SMALL)
    policy = PPOPolicy(config, space, action_space, num_envs=64, seed=0)
    obs = np.zeros((64, 2), np.float32)
    out = policy.act(obs, ActMode.TRAINING)
    raw = out.extras["raw_action"]
    assert out.actions.shape == raw.shape == (64, 2) and out.actions.dtype == np.float32
    assert (out.actions >= action_space.low).all() and (out.actions <= action_space.high).all()
    assert ((raw < action_space.low) | (raw > action_space.high)).any()
    np.testing.assert_array_equal(out.actions, np.clip(raw, action_space.low, action_space.high))
    with torch.no_grad():
        dist = policy.net.distribution(policy.net.policy_head(torch.as_tensor(obs)))
        np.testing.assert_allclose(out.extras["logp"], dist.log_prob(torch.as_tensor(raw)).numpy(), rtol=1e-6)
        mean = policy.net.policy_head(torch.as_tensor(obs)).numpy()
    deterministic = policy.act(obs, ActMode.EVAL_DETERMINISTIC)
    assert deterministic.extras == {}
    np.testing.assert_array_equal(deterministic.actions, np.clip(mean, action_space.low, action_space.high))
    assert policy.act(obs, ActMode.EVAL_STOCHASTIC).extras == {}


def test_discrete_actions_with_offset_and_modes():
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(4, start=1)
    config = PPOConfig(update_epochs=1, num_minibatches=1, **SMALL)
    algo = PPOTrainer(config, space, action_space)
    policy = PPOPolicy(config, space, action_space, num_envs=200, seed=0)
    policy.load_params(algo.actor_params(), 0)
    obs = np.random.default_rng(0).uniform(-1, 1, (200, 3)).astype(np.float32)
    out = policy.act(obs)
    assert out.actions.dtype == np.int64 and out.actions.shape == (200,)
    assert set(np.unique(out.actions)) == {1, 2, 3, 4}
    assert set(out.extras) == {"logp", "value"} and out.extras["logp"].shape == out.extras["value"].shape == (200,)
    with torch.no_grad():
        logits = policy.net.policy_head(torch.as_tensor(obs))
    np.testing.assert_array_equal(policy.act(obs, ActMode.EVAL_DETERMINISTIC).actions, logits.argmax(-1).numpy() + 1)
    # the learner maps actions back to indices: its log-probs equal the agent's
    chunks = [Chunk(0, i, obs[[i, i]], out.actions[i:i + 1], np.ones(1, np.float32), np.zeros(1, bool),
                    np.zeros(1, bool), {}, np.zeros(1, np.int64), {k: v[i:i + 1] for k, v in out.extras.items()})
              for i in range(200)]
    assert algo.update(chunks)["approx_kl"] < 1e-6


def test_lstm_state_is_per_env_and_reset_at_episode_start():
    config = PPOConfig(use_lstm=True, lstm_hidden=8, **SMALL)
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    policy = PPOPolicy(config, space, gym.spaces.Discrete(2), num_envs=2, seed=0)
    assert {k: v.shape for k, v in policy.initial_state(2).items()} == {"lstm_h": (2, 8), "lstm_c": (2, 8)}
    obs = np.ones((2, 3), np.float32)
    first = policy.act(obs).extras["initial_state"]
    assert all(np.abs(v).sum() == 0 for v in first.values())
    policy.on_episode_start(1)
    state = policy.act(obs).extras["initial_state"]
    assert np.abs(state["lstm_h"][0]).sum() > 0 and np.abs(state["lstm_c"][0]).sum() > 0
    assert np.abs(state["lstm_h"][1]).sum() == 0 and np.abs(state["lstm_c"][1]).sum() == 0


# ---------------------------------------------------------------- update options and errors

def test_target_kl_stops_early_and_lr_anneals():
    algo, _, collector = setup("discrete", target_kl=1e-12, anneal_lr=True, total_updates=4, learning_rate=1e-3)
    chunks = collector.collect(16)
    first, second = algo.update(chunks), algo.update(chunks)
    assert first["epochs"] == 1.0
    assert (first["learning_rate"], second["learning_rate"]) == pytest.approx((1e-3, 0.75e-3))
    assert algo.optimizer.param_groups[0]["lr"] == pytest.approx(0.75e-3)


def test_clip_range_anneals_over_the_budget():
    algo, _, collector = setup("discrete", anneal_clip=True, total_updates=2, learning_rate=1e-2, update_epochs=8)
    chunks = collector.collect(16)
    first, second = algo.update(chunks), algo.update(chunks)
    assert (first["clip_coef"], second["clip_coef"]) == pytest.approx((0.2, 0.1))
    assert first["learning_rate"] == second["learning_rate"] == 1e-2  # anneal_lr is separate
    third = algo.update(chunks)  # the budget is spent: clip range 0, every changed ratio is clipped
    assert third["clip_coef"] == 0.0 and third["clip_fraction"] == pytest.approx(1.0)


def test_annealing_without_a_schedule_is_refused_at_the_first_update(caplog):
    """total_updates 0 is the run's budget, which only the learner knows (AlgorithmSpec.for_run);
    a trainer built directly needs a schedule. Past the schedule's end an update says so."""
    algo, _, collector = setup("discrete", anneal_lr=True)
    with pytest.raises(ValueError, match="total_updates >= 1"):
        algo.update(collector.collect(4))
    algo, _, collector = setup("discrete", anneal_lr=True, total_updates=1)
    assert algo.schedule_done() == ""
    algo.update(collector.collect(4))
    assert "annealing schedule ended: 1 updates (total_updates 1), learning rate 0" in algo.schedule_done()
    with caplog.at_level("WARNING"):
        assert algo.update(collector.collect(4))["learning_rate"] == 0.0
    assert "past the annealing schedule" in caplog.text


def test_missing_extras_are_rejected():
    algo, _, collector = setup("continuous_adapt")
    chunk = collector.collect(4)[0]
    extras = {k: v for k, v in chunk.extras.items() if k != "raw_action"}
    with pytest.raises(ValueError, match="raw_action"):
        algo.update([chunk._replace(extras=extras)])
    algo, _, collector = setup("lstm")
    chunk = collector.collect(4)[0]
    extras = {k: v for k, v in chunk.extras.items() if k != "initial_state"}
    with pytest.raises(ValueError, match="initial_state"):
        algo.update([chunk._replace(extras=extras)])


def test_chunks_of_different_lengths_update_together():
    algo, _, collector = setup("lstm", num_minibatches=2)
    chunks = collector.collect(6) + collector.collect(3)
    stats = algo.update(chunks)
    assert stats["num_steps"] == 3 * 6 + 3 * 3 and all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="trust"), "mode"),
    (dict(total_updates=-1), "total_updates"),
    (dict(activation="gelu"), "activation"),
    (dict(kl_coef_init=1000.0), "kl_coef"),
    (dict(num_minibatches=0), "num_minibatches"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kwargs)


def test_pendulum_updates_end_to_end_and_lower_the_losses():
    # without value clipping, which holds V within clip_coef of its start-of-update value
    algo, policy, collector = setup("continuous_adapt", num_envs=4, mode="clip", clip_vloss=False,
                                    learning_rate=3e-3)
    chunks = collector.collect(32)
    assert any(c.truncated.any() for c in chunks)
    stats = [algo.update(chunks) for _ in range(4)]
    assert all(math.isfinite(v) for s in stats for v in s.values())
    # the surrogate starts at -mean(normalized advantages) = 0 on-policy and improves from there
    assert stats[0]["policy_loss"] < 0
    assert stats[-1]["value_loss"] < 0.8 * stats[0]["value_loss"]
    policy.load_params(algo.actor_params(), algo.iteration)
    actions = policy.act(collector.obs).actions
    assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 2.0)


def sb3_scaled_rewards(steps, gamma: float, clip: float, epsilon: float = 1e-8) -> list[float]:
    """Reference: SB3 VecNormalize's reward path over ``(stream, reward, done)`` in step order:
    ``ret = ret * gamma + r``; the return statistics take ``ret`` in; ``r / sqrt(var + eps)``,
    clipped; ``ret = 0`` after an episode end. (SB3's RunningMeanStd starts from a pseudo-count
    of 1e-4 at var 1; here the variance is that of the returns seen, from none.)"""
    returns: dict = {}
    seen, out = [], []
    for stream, reward, done in steps:
        ret = returns.get(stream, 0.0) * gamma + reward
        seen.append(ret)
        out.append(float(np.clip(reward / np.sqrt(np.var(seen) + epsilon), -clip, clip)))
        returns[stream] = 0.0 if done else ret
    return out


def recorded_rewards(monkeypatch) -> list[torch.Tensor]:
    """The ``[T, B]`` rewards each ``compute_gae`` call of the learner gets (what the loss trains on)."""
    import surreal_redis.algos.ppo.trainer as ppo_module

    calls: list[torch.Tensor] = []

    def recording(rewards, *args, **kwargs):
        calls.append(rewards.clone())
        return compute_gae(rewards, *args, **kwargs)

    monkeypatch.setattr(ppo_module, "compute_gae", recording)
    return calls


def hundredfold(chunks: list[Chunk], rng: np.random.Generator) -> list[Chunk]:
    """The chunks with rewards ~100 (HalfCheetah-like returns of hundreds over an episode)."""
    return [c._replace(rewards=rng.normal(100.0, 30.0, c.num_steps).astype(np.float32)) for c in chunks]


def test_first_update_trains_on_scaled_rewards():
    """normalize_reward: the batch's own returns are in the statistics that scale it, so already
    the first update's value targets are O(1) (the scaler used to start after update 1: ~500 here)."""
    rng = np.random.default_rng(0)
    algo, _, collector = setup("continuous_adapt", num_envs=4, update_epochs=1)
    unscaled, *_ = setup("continuous_adapt", num_envs=4, update_epochs=1, normalize_reward=False)
    warmed, *_ = setup("continuous_adapt", num_envs=4, update_epochs=1)
    chunks = hundredfold(collector.collect(32), rng)  # 10-step episodes: returns up to ~950
    stats = algo.update(chunks)
    assert 0.0 < stats["return_mean"] < 5.0
    assert unscaled.update(chunks)["return_mean"] > 300.0
    # update_normalizer (a warm-up without training) takes the rewards in as update does
    warmed.update_normalizer(chunks)
    for key, value in algo.reward_scaler.state_dict().items():
        assert warmed.reward_scaler.state_dict()[key] == value


def test_reward_scaling_matches_sb3_step_by_step(monkeypatch):
    """The rewards an update trains on are SB3 VecNormalize's, computed step by step over the
    chunks in arrival order: each (agent, env) stream's return continues across its chunks, over
    interleaved streams, chunk lengths and updates, and restarts after each episode end."""
    rng = np.random.default_rng(1)
    algo, _, collector = setup("continuous_adapt", num_envs=3, update_epochs=1, num_minibatches=1)
    calls = recorded_rewards(monkeypatch)

    def streams(chunks: list[Chunk]) -> list[Chunk]:  # env 2 relabelled as another agent's env 0
        return [c._replace(agent_id=1, env_index=0) if c.env_index == 2 else c for c in chunks]

    # 10-step episodes: batch 1 = steps 0-7 then 8-11 of each env (an end at step 9), batch 2 = 12-21
    batches = [hundredfold(streams(collector.collect(8) + collector.collect(4)), rng),
               hundredfold(streams(collector.collect(10)), rng)]
    steps, trained = [], []
    for chunks in batches:
        assert any((c.terminated | c.truncated).any() for c in chunks)
        del calls[:]
        algo.update(chunks)
        # the learner groups chunks by length (first-seen order) into [T, B] rollouts
        lengths = list(dict.fromkeys(c.num_steps for c in chunks))
        by_chunk = {id(c): call[:, b] for call, n in zip(calls, lengths)
                    for b, c in enumerate(c for c in chunks if c.num_steps == n)}
        for c in chunks:
            steps += [((c.agent_id, c.env_index), float(r), bool(d))
                      for r, d in zip(c.rewards, c.terminated | c.truncated)]
            trained += by_chunk[id(c)].tolist()
    cfg = algo.config
    expected = sb3_scaled_rewards(steps, cfg.gamma, cfg.reward_clip)
    assert max(expected) == cfg.reward_clip and 0.0 < min(expected) < 1.0  # clipped at first, then ~0.3
    np.testing.assert_allclose(trained, expected, rtol=1e-5)


@pytest.mark.parametrize("name", ["dict_obs", "continuous_adapt"])
def test_values_in_feature_slices_match_the_agents(name, monkeypatch):
    """The no-grad encoder pass over a rollout runs in slices (memory); slicing changes no value."""
    import surreal_redis.algos.ppo.trainer as ppo_module

    algo, policy, collector = setup(name, update_epochs=1, num_minibatches=1)
    chunks = collector.collect(12)
    whole = algo._rollout(chunks)
    monkeypatch.setattr(ppo_module, "PASS_OBS_BYTES", 1)  # one row per pass
    sliced = algo._rollout(chunks)
    torch.testing.assert_close(sliced.values, whole.values)
    torch.testing.assert_close(sliced.advantages, whole.advantages)


@pytest.mark.parametrize("name", ["dict_obs", "continuous_adapt", "lstm"])
def test_minibatches_in_passes_make_the_same_update(name, monkeypatch):
    """A minibatch over the pass budget goes through the network in passes whose weighted
    gradients add up to the whole minibatch's: the same parameters and loss terms after an update."""
    import surreal_redis.algos.ppo.trainer as ppo_module

    results = []
    for budget in (ppo_module.PASS_OBS_BYTES, 1):  # one pass per minibatch, then one row (sequence) per pass
        monkeypatch.setattr(ppo_module, "PASS_OBS_BYTES", budget)
        torch.manual_seed(0)
        algo, _, collector = setup(name, update_epochs=2, num_minibatches=2)
        stats = algo.update(collector.collect(12))
        results.append((stats, algo.net.state_dict()))
    (whole_stats, whole_net), (passes_stats, passes_net) = results
    assert whole_stats.keys() == passes_stats.keys()
    for key in whole_stats:
        assert passes_stats[key] == pytest.approx(whole_stats[key], rel=1e-4, abs=1e-6), key
    for key in whole_net:
        torch.testing.assert_close(passes_net[key], whole_net[key], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["discrete", "continuous_adapt"])
def test_minibatch_steps_read_nothing_to_the_host(name, monkeypatch):
    """A minibatch step returns its loss terms as tensors, read once when the update ends: no
    ``.item()`` (a host sync on a GPU) inside the step, and the stats are the same floats."""
    algo, _, collector = setup(name, update_epochs=2, num_minibatches=2)
    chunks = collector.collect(12)
    reads: list[str] = []
    inside = [False]
    step = algo._minibatch_step

    def counted_step(*args, **kwargs):
        inside[0] = True
        try:
            return step(*args, **kwargs)
        finally:
            inside[0] = False

    def counting(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if inside[0]:
                reads.append(name)
            return original(self, *args, **kwargs)
        return read

    for method in ("item", "tolist", "__float__", "__bool__", "numpy"):
        monkeypatch.setattr(torch.Tensor, method, counting(method))
    monkeypatch.setattr(algo, "_minibatch_step", counted_step)
    stats = algo.update(chunks)
    assert reads == []
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        assert isinstance(stats[key], float) and math.isfinite(stats[key]), key


def test_a_nan_loss_term_raises_when_the_update_reads_its_stats():
    """Without torch's per-step distribution checks, a NaN network still fails loudly: at the
    update's one read of its loss terms, naming them."""
    from surreal_redis.algos.ppo.losses import mean_loss_terms

    terms = [{"policy_loss": torch.tensor(1.0, dtype=torch.float64), "entropy": torch.tensor(2.0)}] * 2
    assert mean_loss_terms(terms) == {"policy_loss": 1.0, "entropy": 2.0}
    with pytest.raises(FloatingPointError, match="policy_loss is NaN"):
        mean_loss_terms([*terms, {"policy_loss": torch.tensor(math.nan), "entropy": torch.tensor(2.0)}])
