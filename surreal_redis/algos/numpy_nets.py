"""Forward passes of the networks in :mod:`surreal_redis.algos.networks` in plain numpy, for agents
that act without torch: on a handful of observations per call torch's per-operator overhead
dominates, and importing torch costs every agent process seconds of CPU and much memory.

These classes read the learner's ``state_dict`` names and compute the same function
(:mod:`tests.unit.test_numpy_nets` checks them against the torch modules); weights are copied at
load. Shapes follow the torch modules; matmuls run in float32 (the normalizer's statistics in
float64, as in :class:`~surreal_redis.algos.normalizer.RunningMeanStd`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from surreal_redis.algos.network_config import ACTIVATION_NAMES, NATURE_MIN_SIZE
from surreal_redis.codec import ParamDict, Tree
from surreal_redis.envs.spaces import ImageLayout, image_layout, is_frame_tuple, is_image_space

NORMALIZER_EPSILON = 1e-8  # RunningMeanStd.normalize's default


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0), "elu": _elu}
assert set(ACTIVATIONS) == set(ACTIVATION_NAMES)


class ParamsMismatch(ValueError):
    """Downloaded parameters do not fit the network this agent built (a missing name or a wrong
    shape); the message names the parameter."""


def take(params: ParamDict, name: str, shape: tuple[int, ...] | None = None, dtype: type = np.float32) -> np.ndarray:
    """A private, contiguous copy of ``params[name]`` as ``dtype``; raises :class:`ParamsMismatch`
    naming it when it is absent or (with ``shape``) shaped otherwise."""
    if name not in params:
        raise ParamsMismatch(f"parameter {name!r} is missing")
    value = np.asarray(params[name])
    if shape is not None and value.shape != shape:
        raise ParamsMismatch(f"parameter {name!r} has shape {value.shape}, expected {shape}")
    return np.array(value, dtype=dtype, order="C", copy=True)


class Linear:
    """``y = x @ W.T + b`` for ``x`` ``[B, in_dim]`` -> ``[B, out_dim]`` (torch's ``nn.Linear``)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight_t = np.zeros((in_dim, out_dim), np.float32)  # stored transposed: one matmul per call
        self.bias = np.zeros(out_dim, np.float32)

    def load(self, params: ParamDict, prefix: str) -> None:
        self.weight_t = np.ascontiguousarray(take(params, prefix + "weight", (self.out_dim, self.in_dim)).T)
        self.bias = take(params, prefix + "bias", (self.out_dim,))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight_t + self.bias


class MLP:
    """:func:`~surreal_redis.algos.networks.mlp`: Linear layers at indices 0, 2, 4, ... of the
    ``nn.Sequential`` with the activation between them, none after the output layer."""

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dim: int | None, activation: str) -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r} (known: {', '.join(ACTIVATIONS)})")
        sizes = [in_dim, *hidden] + ([out_dim] if out_dim is not None else [])
        self.layers = [Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        self.activation = ACTIVATIONS[activation]
        self.activated = len(hidden)  # the first len(hidden) layers are followed by the activation

    def load(self, params: ParamDict, prefix: str) -> None:
        for index, layer in enumerate(self.layers):
            layer.load(params, f"{prefix}{2 * index}.")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < self.activated:
                x = self.activation(x)
        return x


class Conv2d:
    """``nn.Conv2d`` (square kernel, stride, zero padding; no dilation or groups) on
    ``[B, C, H, W]`` float32, as an im2col matmul."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, padding: int = 0) -> None:
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel, self.stride, self.padding = kernel, stride, padding
        self.weight_t = np.zeros((in_channels * kernel * kernel, out_channels), np.float32)
        self.bias = np.zeros(out_channels, np.float32)

    def out_size(self, size: int) -> int:
        return (size + 2 * self.padding - self.kernel) // self.stride + 1

    def load(self, params: ParamDict, prefix: str) -> None:
        shape = (self.out_channels, self.in_channels, self.kernel, self.kernel)
        self.weight_t = np.ascontiguousarray(take(params, prefix + "weight", shape).reshape(self.out_channels, -1).T)
        self.bias = take(params, prefix + "bias", (self.out_channels,))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.padding:
            p = self.padding
            x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        k, s = self.kernel, self.stride
        windows = sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]  # [B, C, OH, OW, k, k]
        batch, _, out_h, out_w = windows.shape[:4]
        # rows (b, oh, ow), columns (c, kh, kw): the order of the weight's flattened [C, k, k]
        columns = windows.transpose(0, 2, 3, 1, 4, 5).reshape(batch * out_h * out_w, -1)
        out = columns @ self.weight_t + self.bias
        return out.reshape(batch, out_h, out_w, self.out_channels).transpose(0, 3, 1, 2)


class ConvStem:
    """:class:`~surreal_redis.algos.networks.NatureCNN` (8/4, 4/2, 3/1) for frames of at least
    36x36, else :class:`~surreal_redis.algos.networks.SmallCNN` (two padded 3x3/2), each followed
    by ReLU, then flatten -> Linear -> ReLU: uint8 ``[B, C, H, W]`` -> ``[B, features]``."""

    def __init__(self, layout: ImageLayout, features: int = 512) -> None:
        if min(layout.height, layout.width) >= NATURE_MIN_SIZE:
            self.convs = [Conv2d(layout.channels, 32, 8, 4), Conv2d(32, 64, 4, 2), Conv2d(64, 64, 3, 1)]
        else:
            self.convs = [Conv2d(layout.channels, 32, 3, 2, padding=1), Conv2d(32, 64, 3, 2, padding=1)]
        height, width = layout.height, layout.width
        for conv in self.convs:
            height, width = conv.out_size(height), conv.out_size(width)
        self.head = Linear(self.convs[-1].out_channels * height * width, features)
        self.out_dim = features

    def load(self, params: ParamDict, prefix: str) -> None:
        for index, conv in enumerate(self.convs):
            conv.load(params, f"{prefix}conv.{2 * index}.")
        self.head.load(params, prefix + "head.0.")

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        x = frames.astype(np.float32) / np.float32(255.0)
        for conv in self.convs:
            x = np.maximum(conv(x), 0)
        return np.maximum(self.head(x.reshape(x.shape[0], -1)), 0)


def channels_first(frames: np.ndarray | Sequence[np.ndarray], layout: ImageLayout) -> np.ndarray:
    """:func:`~surreal_redis.algos.networks.channels_first`: an image batch in ``layout.axes``
    order, or K such frame batches, as one ``[B, K*C, H, W]`` array."""
    if isinstance(frames, (tuple, list)):
        return np.concatenate([channels_first(frame, layout) for frame in frames], axis=1)
    frames = np.asarray(frames)
    if layout.axes == "hw":
        return frames[:, None]
    if layout.axes == "hwc":
        return frames.transpose(0, 3, 1, 2)
    return frames


class Encoder:
    """:class:`~surreal_redis.algos.networks.ObservationEncoder`: a CNN stem per image or frame
    stack leaf, vector leaves flattened (as float32), Dict keys in sorted order, concatenated
    -> ``[B, out_dim]``. Raises ValueError naming a leaf no network takes."""

    def __init__(self, space: gym.Space) -> None:
        leaves = dict(sorted(space.spaces.items())) if isinstance(space, gym.spaces.Dict) else {"": space}
        self.is_dict = isinstance(space, gym.spaces.Dict)
        self.keys = list(leaves)
        self.stems: dict[str, tuple[ConvStem, ImageLayout]] = {}
        self.out_dim = 0
        for key, leaf in leaves.items():
            layout = image_layout(leaf)
            if layout is not None:
                stem = ConvStem(layout)
                self.stems[key] = (stem, layout)
                self.out_dim += stem.out_dim
            elif isinstance(leaf, gym.spaces.Box):
                self.out_dim += int(np.prod(leaf.shape))
            else:
                where = f"observation leaf {key!r}" if key else "the observation"
                raise ValueError(f"no network for {where}: {leaf}")

    def load(self, params: ParamDict, prefix: str) -> None:
        for key, (stem, _) in self.stems.items():
            stem.load(params, f"{prefix}stems.{key or '_'}.")

    def __call__(self, obs: Tree) -> np.ndarray:
        parts = []
        for key in self.keys:
            value = obs[key] if self.is_dict else obs
            if key in self.stems:
                stem, layout = self.stems[key]
                parts.append(stem(channels_first(value, layout)))
            else:
                value = np.asarray(value)
                parts.append(value.reshape(value.shape[0], -1).astype(np.float32, copy=False))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)


class Normalizer:
    """:class:`~surreal_redis.algos.normalizer.ObservationNormalizer` applied with the learner's
    statistics (agents never update them): every non-image Box leaf becomes
    ``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)`` as float32; images pass through."""

    def __init__(self, space: gym.Space, clip: float) -> None:
        self.clip = clip
        self.is_dict = isinstance(space, gym.spaces.Dict)
        leaves = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {"": space}
        self.shapes = {key: tuple(leaf.shape) for key, leaf in leaves.items()
                       if isinstance(leaf, gym.spaces.Box) and not is_image_space(leaf) and not is_frame_tuple(leaf)}
        # before the first load: mean 0, var 1 (the torch buffers' initial values)
        self.stats = {key: (np.zeros(shape), np.ones(shape)) for key, shape in self.shapes.items()}

    def load(self, params: ParamDict, prefix: str) -> None:
        self.stats = {key: (take(params, f"{prefix}stats.{key or '_'}.mean", shape, np.float64),
                            take(params, f"{prefix}stats.{key or '_'}.var", shape, np.float64))
                      for key, shape in self.shapes.items()}

    def _normalize(self, key: str, x: np.ndarray) -> np.ndarray:
        mean, var = self.stats[key]
        # as the torch path: observations become float32 tensors first, then float64 here
        z = (np.asarray(x, np.float32).astype(np.float64) - mean) / np.sqrt(var + NORMALIZER_EPSILON)
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def __call__(self, obs: Tree) -> Tree:
        if not self.is_dict:
            return self._normalize("", obs) if "" in self.stats else obs
        assert isinstance(obs, Mapping)
        return {key: self._normalize(key, value) if key in self.stats else value for key, value in obs.items()}
