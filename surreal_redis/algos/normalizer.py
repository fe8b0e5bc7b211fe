"""Running statistics that whiten observations ("z-filter") and scale rewards.

Every statistic is a registered *buffer*, in ``state_dict()``: the observation normalizer travels
to agents with the actor weights (the learner updates it; agents only apply it), and both are
checkpointed with the networks. Means and variances are merged batch by batch with the parallel
algorithm of Chan, Golub & LeVeque (1979), as SB3's ``RunningMeanStd`` and SURREAL's ``ZFilter``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from surreal_redis.algos.networks import is_frame_tuple, is_image_space
from surreal_redis.algos.recurrences import linear_recurrence, running_moments
from surreal_redis.trees import Tree


class RunningMeanStd(nn.Module):
    """Mean and variance of samples of shape ``shape``, updated from batches ``[B, *shape]``.

    Statistics are float64 buffers ``mean``, ``var`` (population variance, ``ddof=0``) and
    ``count``. Before the first update ``mean = 0`` and ``var = 1`` (normalizing is the identity).
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor | np.ndarray) -> None:
        """Merge the statistics of ``batch`` (``[B, *shape]``, B >= 1; a tensor or a numpy array)
        into the running ones."""
        batch = torch.as_tensor(batch).to(self.mean.device, torch.float64)
        batch_count = batch.shape[0]
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, unbiased=False)
        # Chan et al. (1979): combine (mean, M2, n) of two sets; also exact when count == 0.
        total = self.count + batch_count
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * batch_count + delta.square() * self.count * batch_count / total
        self.mean.add_(delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor, clip: float, epsilon: float = 1e-8) -> torch.Tensor:
        """``clamp((x - mean) / sqrt(var + epsilon), -clip, clip)`` as float32, same shape as x."""
        z = (x.to(torch.float64) - self.mean) / torch.sqrt(self.var + epsilon)
        return z.clamp(-clip, clip).to(torch.float32)


class ObservationNormalizer(nn.Module):
    """Z-filter for a Box or Dict observation space: one :class:`RunningMeanStd` per non-image leaf,
    whitened and clipped to ``[-clip, clip]`` (CleanRL's continuous PPO clips at 10, SURREAL at 5);
    image and frame-tuple leaves pass through (the CNN scales them by 1/255).
    """

    def __init__(self, space: gym.Space, clip: float = 10.0) -> None:
        super().__init__()
        self.clip = clip
        self.is_dict = isinstance(space, gym.spaces.Dict)
        leaves = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {"": space}
        # ModuleDict keys cannot be empty: a plain Box uses the name "_".
        self.stats = nn.ModuleDict({
            key or "_": RunningMeanStd(tuple(leaf.shape))
            for key, leaf in leaves.items()
            if isinstance(leaf, gym.spaces.Box) and not is_image_space(leaf) and not is_frame_tuple(leaf)
        })

    def forward(self, obs: Tree) -> Tree:
        """An observation batch (tensor ``[B, ...]``, frame tuple, or dict of those), normalized."""
        if not self.is_dict:
            return self._leaf("_").normalize(obs, self.clip) if "_" in self.stats else obs
        return {key: self._leaf(key).normalize(value, self.clip) if key in self.stats else value
                for key, value in obs.items()}

    @torch.no_grad()
    def update(self, obs: Tree) -> None:
        """Add a batch of raw observations (leaves ``[B, ...]``, tensors or numpy arrays; image
        leaves are not read) to the statistics."""
        for key in self.stats:
            self._leaf(key).update(obs[key] if self.is_dict else obs)

    def _leaf(self, key: str) -> RunningMeanStd:
        return cast(RunningMeanStd, self.stats[key])


class RewardScaler(nn.Module):
    """Scales rewards by ``1 / sqrt(Var[G] + epsilon)`` (the mean is not subtracted), G the running
    discounted return ``G = gamma * G + r`` of each env stream, reset at episode ends, as SB3's
    ``VecNormalize`` and gymnasium's ``NormalizeReward``. The per-stream accumulators are the
    module's extra state, so a resumed learner continues every stream's G (a state without them
    restarts each stream at G = 0, as at an episode start).
    """

    def __init__(self, gamma: float, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.return_stats = RunningMeanStd(())
        self._returns: dict[Hashable, float] = {}

    def forward(self, rewards: torch.Tensor) -> torch.Tensor:
        """Rewards scaled with the current statistics and clipped (float32, same shape); changes
        nothing."""
        std = torch.sqrt(self.return_stats.var + self.epsilon)
        return (rewards.to(torch.float64) / std).clamp(-self.clip, self.clip).to(torch.float32)

    @torch.no_grad()
    def scale(self, rewards: torch.Tensor, dones: torch.Tensor, stream: Hashable) -> torch.Tensor:
        """Continue stream ``stream``'s return over ``rewards`` ``[T]`` (``dones`` ``[T]`` bool: the
        episode ended at that step), step by step as SB3's ``VecNormalize.step_wait``: G takes
        ``rewards[t]`` in, the statistics take G in, and ``rewards[t]`` is divided by their std and
        clipped. Returns the T scaled rewards, float32 on the device of ``rewards``."""
        stats = self.return_stats
        count, mean, var = stats.count.item(), stats.mean.item(), stats.var.item()
        m2 = var * count  # sum of squared deviations; var = 1 before any sample counts for nothing
        ret = self._returns.get(stream, 0.0)
        scaled = []
        for reward, done in zip(rewards.tolist(), dones.tolist()):
            ret = self.gamma * ret + reward
            # Welford's one-sample step: the same statistics as RunningMeanStd.update([ret])
            count += 1.0
            delta = ret - mean
            mean += delta / count
            m2 += delta * (ret - mean)
            var = m2 / count
            scaled.append(min(max(reward / math.sqrt(var + self.epsilon), -self.clip), self.clip))
            if done:
                ret = 0.0
        self._returns[stream] = ret
        if scaled:
            stats.count.fill_(count)
            stats.mean.fill_(mean)
            stats.var.fill_(var)
        return torch.tensor(scaled, dtype=torch.float32, device=rewards.device)

    @torch.no_grad()
    def update(self, rewards: torch.Tensor, dones: torch.Tensor, stream: Hashable) -> None:
        """:meth:`scale` without its result."""
        self.scale(rewards, dones, stream)

    @torch.no_grad()
    def scale_chunks(self, rewards: Sequence[np.ndarray], dones: Sequence[np.ndarray],
                     streams: Sequence[Hashable]) -> list[np.ndarray]:
        """:meth:`scale` of each ``(rewards[i] [T_i], dones[i] [T_i], streams[i])`` in list order,
        as whole-array passes (:mod:`~surreal_redis.algos.recurrences`): the same results up to
        float64 rounding. A stream may appear several times, its chunks continuing one another.
        Returns the scaled rewards, float32 ``[T_i]`` numpy arrays."""
        if not len(rewards) == len(dones) == len(streams):
            raise ValueError(f"scale_chunks needs as many dones and streams as rewards, got "
                             f"{len(rewards)}, {len(dones)}, {len(streams)}")
        lengths = np.array([len(r) for r in rewards], dtype=np.int64)
        if lengths.sum() == 0:
            return [np.zeros(0, np.float32) for _ in rewards]
        flat_rewards = np.concatenate(rewards).astype(np.float64)
        flat_dones = np.concatenate(dones).astype(bool)
        # each stream's steps in a row, its chunks in list order: G runs along that order
        by_stream: dict[Hashable, list[int]] = {}
        for i, stream in enumerate(streams):
            by_stream.setdefault(stream, []).append(i)
        chunk_order = np.array([i for ids in by_stream.values() for i in ids])
        starts, moved = np.cumsum(lengths) - lengths, lengths[chunk_order]
        # step k of chunk c moves from starts[c] + k to its place in the stream order
        order = np.arange(len(flat_rewards)) + np.repeat(starts[chunk_order] - (np.cumsum(moved) - moved), moved)
        stream_r, stream_d = flat_rewards[order], flat_dones[order]
        decay = np.empty_like(stream_r)
        decay[0], decay[1:] = 0.0, self.gamma * (~stream_d[:-1])
        first, ends = 0, {}
        for stream, ids in by_stream.items():  # a stream's first step continues its carried G
            steps = int(lengths[ids].sum())
            if steps:
                decay[first] = 0.0
                stream_r[first] += self.gamma * self._returns.get(stream, 0.0)
                first += steps
                ends[stream] = first - 1
        stream_g = linear_recurrence(decay, stream_r)
        for stream, end in ends.items():
            self._returns[stream] = 0.0 if stream_d[end] else float(stream_g[end])
        returns = np.empty_like(stream_g)
        returns[order] = stream_g
        stats = self.return_stats
        counts, means, variances = running_moments(returns, stats.count.item(), stats.mean.item(), stats.var.item())
        stats.count.fill_(counts[-1])
        stats.mean.fill_(means[-1])
        stats.var.fill_(variances[-1])
        scaled = np.clip(flat_rewards / np.sqrt(variances + self.epsilon), -self.clip, self.clip).astype(np.float32)
        return np.split(scaled, np.cumsum(lengths)[:-1])

    def get_extra_state(self) -> dict[Hashable, float]:
        return dict(self._returns)

    def set_extra_state(self, state: dict[Hashable, float]) -> None:
        self._returns = dict(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # a state without the accumulators restarts every stream at G = 0 (the dict is
        # load_state_dict's own copy)
        state_dict.setdefault(prefix + "_extra_state", {})
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
