"""Running statistics, the observation z-filter and the reward scaler."""

from __future__ import annotations

import io
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.algos.normalizer import ObservationNormalizer, RewardScaler, RunningMeanStd


def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3, 2)) for n in (1, 7, 50, 2)]
    rms = RunningMeanStd((3, 2))
    for batch in batches:
        rms.update(torch.as_tensor(batch))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), everything.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(rms.var.numpy(), everything.var(axis=0), rtol=1e-10)
    assert rms.count.item() == len(everything)


def test_normalize_is_identity_before_updates_and_clips_after():
    rms = RunningMeanStd((2,))
    x = torch.tensor([[0.5, -3.0]])
    torch.testing.assert_close(rms.normalize(x, clip=10.0), x)
    rms.update(torch.tensor([[0.0, 0.0], [2.0, 2.0]]))  # mean 1, var 1
    out = rms.normalize(torch.tensor([[3.0, 100.0]]), clip=5.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[2.0, 5.0]]), atol=1e-6, rtol=0)


def test_observation_normalizer_dict_leaves_and_images_untouched():
    space = gym.spaces.Dict({
        "pos": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        "image": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
        "frames": gym.spaces.Tuple([gym.spaces.Box(0, 255, (8, 8), np.uint8)] * 2),
    })
    norm = ObservationNormalizer(space, clip=10.0)
    assert set(norm.stats) == {"pos"}
    # the statistics are buffers: they travel in state_dict
    assert {"stats.pos.mean", "stats.pos.var", "stats.pos.count"} <= set(norm.state_dict())
    pos = torch.tensor([[1.0, 2.0, 3.0], [3.0, 6.0, 9.0]])
    image = torch.randint(0, 255, (2, 1, 36, 36), dtype=torch.uint8)
    frames = (torch.zeros(2, 8, 8, dtype=torch.uint8), torch.ones(2, 8, 8, dtype=torch.uint8))
    norm.update({"pos": pos, "image": image, "frames": frames})
    out = norm({"pos": pos, "image": image, "frames": frames})
    assert out["image"] is image and out["frames"] is frames
    torch.testing.assert_close(out["pos"], torch.tensor([[-1.0] * 3, [1.0] * 3]), atol=1e-5, rtol=0)


def test_observation_normalizer_box_and_state_dict_round_trip():
    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    norm = ObservationNormalizer(space)
    norm.update(torch.randn(20, 4) * 5 + 2)
    copy = ObservationNormalizer(space)
    copy.load_state_dict(norm.state_dict())
    x = torch.randn(6, 4)
    torch.testing.assert_close(copy(x), norm(x))


def discounted_returns(rewards: list[float], dones: list[bool], gamma: float, start: float = 0.0) -> list[float]:
    out, ret = [], start
    for reward, done in zip(rewards, dones):
        ret = gamma * ret + reward
        out.append(ret)
        if done:
            ret = 0.0
    return out


def test_reward_scaler_tracks_discounted_returns_per_stream():
    gamma = 0.9
    scaler = RewardScaler(gamma, clip=100.0)
    # stream a: two chunks, an episode end in the first one; stream b interleaved
    a1, a1_done = [1.0, 2.0, 3.0], [False, True, False]
    a2, a2_done = [1.0, 1.0], [False, False]
    b1, b1_done = [5.0, -1.0], [False, False]
    scaler.update(torch.tensor(a1), torch.tensor(a1_done), stream="a")
    scaler.update(torch.tensor(b1), torch.tensor(b1_done), stream="b")
    scaler.update(torch.tensor(a2), torch.tensor(a2_done), stream="a")
    ra1 = discounted_returns(a1, a1_done, gamma)  # [1, 2.9, 3]
    ra2 = discounted_returns(a2, a2_done, gamma, start=ra1[-1])  # continues from 3
    rb1 = discounted_returns(b1, b1_done, gamma)
    assert ra1 == pytest.approx([1.0, 2.9, 3.0]) and ra2 == pytest.approx([3.7, 4.33])
    expected = np.array(ra1 + rb1 + ra2)
    assert scaler.return_stats.var.item() == pytest.approx(expected.var())
    std = np.sqrt(expected.var() + 1e-8)
    torch.testing.assert_close(scaler(torch.tensor([2.0, -4.0])), torch.tensor([2.0 / std, -4.0 / std], dtype=torch.float32))


def test_reward_scaler_scales_each_reward_with_its_own_return_in_the_statistics():
    """``scale`` is SB3 VecNormalize's step: G takes r in, the statistics take G in, then r is
    divided by their std: each reward's own return (and all before it) is in the std that scales it."""
    gamma, clip = 0.9, 3.0
    scaler = RewardScaler(gamma, clip=clip)
    a1, a1_done = [1.0, 2.0, 3.0], [False, True, False]
    b1, b1_done = [5.0, -1.0], [False, False]
    a2, a2_done = [1.0, 1.0], [False, False]
    out = [scaler.scale(torch.tensor(r), torch.tensor(d), stream=s)
           for r, d, s in ((a1, a1_done, "a"), (b1, b1_done, "b"), (a2, a2_done, "a"))]
    assert all(o.dtype == torch.float32 for o in out)
    ra1 = discounted_returns(a1, a1_done, gamma)
    returns = ra1 + discounted_returns(b1, b1_done, gamma) + discounted_returns(a2, a2_done, gamma, start=ra1[-1])
    rewards = a1 + b1 + a2
    # the first reward sees one return (variance 0): 1 / sqrt(1e-8), clipped
    expected = [np.clip(r / np.sqrt(np.var(returns[:k + 1]) + 1e-8), -clip, clip) for k, r in enumerate(rewards)]
    assert expected[0] == clip
    np.testing.assert_allclose(torch.cat(out).numpy(), expected, rtol=1e-6)
    assert scaler.return_stats.var.item() == pytest.approx(np.var(returns))
    assert scaler.return_stats.count.item() == len(returns)


def test_reward_scaler_clips_and_round_trips():
    scaler = RewardScaler(0.99, clip=1.0)
    scaler.update(torch.tensor([0.1, -0.1, 0.2, 0.0]), torch.zeros(4, dtype=torch.bool), stream=(0, 1))
    assert scaler(torch.tensor([1e6])).item() == 1.0
    buffer = io.BytesIO()
    torch.save(scaler.state_dict(), buffer)
    buffer.seek(0)
    copy = RewardScaler(0.99, clip=1.0)
    copy.load_state_dict(torch.load(buffer, weights_only=True))
    x = torch.tensor([0.01, -0.02])
    torch.testing.assert_close(copy(x), scaler(x))
    # the stream's running return travels too: the next chunk of the stream is scaled the same
    more, no_end = torch.tensor([0.3, -0.2, 0.1]), torch.zeros(3, dtype=torch.bool)
    torch.testing.assert_close(copy.scale(more, no_end, stream=(0, 1)), scaler.scale(more, no_end, stream=(0, 1)))
    torch.testing.assert_close(copy.return_stats.var, scaler.return_stats.var)
    # a state saved without the running returns (older checkpoints) loads: streams restart at G = 0
    old = {k: v for k, v in scaler.state_dict().items() if k != "_extra_state"}
    fresh = RewardScaler(0.99, clip=1.0)
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh.return_stats.var, scaler.return_stats.var)
    restart = RewardScaler(0.99, clip=1.0)
    restart.return_stats.load_state_dict(scaler.return_stats.state_dict())
    torch.testing.assert_close(fresh.scale(more, no_end, stream=(0, 1)), restart.scale(more, no_end, stream=(0, 1)))


@pytest.mark.parametrize("algo", ["ddpg", "sac"])
def test_off_policy_z_filter_takes_each_inserted_transition_once(algo):
    """DDPG's and SAC's z-filter learns the data inserted, as OpenAI baselines' DDPG (``obs_rms``
    in ``store_transition``). Taken from sampled batches, early data counted as often as the
    replay draws it: with a mean drifting 0 -> 20, the filter said 5.25 against the data's 10."""
    from surreal_redis.algos.ddpg.policy import DDPGConfig
    from surreal_redis.algos.ddpg.trainer import DDPGTrainer
    from surreal_redis.algos.sac.config import SACConfig
    from surreal_redis.algos.sac.trainer import SACTrainer
    from surreal_redis.chunks import Chunk
    from surreal_redis.replay import ReplayConfig
    from surreal_redis.replay.feeds import OffPolicyConfig, OffPolicyFeed

    obs_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    small = dict(actor_hidden=(8,), critic_hidden=(8,), normalize_obs=True)
    torch.manual_seed(0)
    trainer = (DDPGTrainer(DDPGConfig(**small), obs_space, action_space, device="cpu") if algo == "ddpg"
               else SACTrainer(SACConfig(**small), obs_space, action_space, device="cpu"))
    feed = OffPolicyFeed(OffPolicyConfig(batch_size=16, learning_starts=100, updates_per_step=0.25, max_train_s=None,
                                         replay=ReplayConfig(capacity=10_000)), gamma=0.99)
    rng, steps, chunks = np.random.default_rng(0), 50, 40
    drift = np.linspace(0.0, 20.0, steps * chunks + 1, dtype=np.float32)  # the mean, step by step
    obs = np.stack([drift, -drift], axis=1) + rng.normal(0, 1, (len(drift), 2)).astype(np.float32)
    stop = threading.Event()
    for i in range(chunks):
        feed.ingest(Chunk(agent_id=0, env_index=0, obs=obs[i * steps:(i + 1) * steps + 1],
                          actions=rng.uniform(-1, 1, (steps, 1)).astype(np.float32),
                          rewards=np.zeros(steps, np.float32), terminated=np.zeros(steps, bool),
                          truncated=np.zeros(steps, bool), final_obs={},
                          policy_version=np.zeros(steps, np.int64), extras={}))
        list(feed.train(trainer, stop))
    stats = trainer.obs_normalizer.stats["_"]
    inserted = obs[:steps * chunks].astype(np.float64)
    assert trainer.iteration > 400
    np.testing.assert_allclose(stats.mean.numpy(), inserted.mean(axis=0), rtol=1e-9)  # about (10, -10)
    np.testing.assert_allclose(stats.var.numpy(), inserted.var(axis=0), rtol=1e-9)
    assert stats.count.item() == len(inserted)
