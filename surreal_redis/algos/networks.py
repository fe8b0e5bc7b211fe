"""Network building blocks shared by PPO and DDPG: MLP torsos, a Nature-CNN pixel stem, and an
observation encoder for Box (flat or image) and Dict observation spaces."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def layer_init(layer: nn.Module, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights, constant bias (CleanRL / baselines convention)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int | None = None, activation: str = "tanh",
        out_std: float = 1.0) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` with orthogonal init; no activation after the output."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r} (known: {', '.join(ACTIVATIONS)})")
    layers: list[nn.Module] = []
    last = in_dim
    for size in hidden:
        layers += [layer_init(nn.Linear(last, size)), ACTIVATIONS[activation]()]
        last = size
    if out_dim is not None:
        layers.append(layer_init(nn.Linear(last, out_dim), std=out_std))
    return nn.Sequential(*layers)


class NatureCNN(nn.Module):
    """The DQN Nature CNN for ``[B, C, 84, 84]``-ish uint8 frames (scaled by 1/255) -> 512."""

    def __init__(self, in_channels: int, height: int, width: int, features: int = 512) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, in_channels, height, width)).shape[1]
        self.head = nn.Sequential(layer_init(nn.Linear(flat, features)), nn.ReLU())
        self.out_dim = features

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(frames.float() / 255.0))


def is_image_space(space: gym.Space) -> bool:
    """uint8 Box of rank 3 (C,H,W) or (stack,H,W): treated as pixels."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def is_frame_tuple(space: gym.Space) -> bool:
    """A frame stack kept as separate frames: Tuple of identical uint8 Box (H,W) or (H,W,C)."""
    return (isinstance(space, gym.spaces.Tuple) and len(space.spaces) > 0
            and all(isinstance(s, gym.spaces.Box) and s.dtype == np.uint8 and s.shape == space.spaces[0].shape
                    and len(s.shape) in (2, 3) for s in space.spaces))


def stack_frames(frames: tuple | list) -> torch.Tensor | np.ndarray:
    """K frames ``[B,H,W]`` (or ``[B,H,W,C]``) -> ``[B, K*C, H, W]`` channels-first."""
    lib = torch if isinstance(frames[0], torch.Tensor) else np
    stacked = lib.stack(list(frames), 1)  # [B,K,H,W] or [B,K,H,W,C]
    if stacked.ndim == 5:
        b, k, h, w, c = stacked.shape
        stacked = stacked.permute(0, 1, 4, 2, 3) if lib is torch else stacked.transpose(0, 1, 4, 2, 3)
        stacked = stacked.reshape(b, k * c, h, w)
    return stacked


class ObservationEncoder(nn.Module):
    """Maps an observation batch (tensor, or dict of tensors for Dict spaces) to ``[B, out_dim]``.

    Image leaves (uint8 ``(C,H,W)`` Box, or a Tuple of K frames, see :func:`stack_frames`) go
    through a :class:`NatureCNN`; other leaves are flattened and concatenated
    (normalize them first, e.g. with the z-filter). Dict keys are taken in sorted order.
    """

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        leaves = dict(sorted(space.spaces.items())) if isinstance(space, gym.spaces.Dict) else {"": space}
        self.keys = list(leaves)
        self.is_dict = isinstance(space, gym.spaces.Dict)
        self.stems = nn.ModuleDict()
        self.out_dim = 0
        for key, leaf in leaves.items():
            if is_frame_tuple(leaf):
                first = leaf.spaces[0].shape
                channels = len(leaf.spaces) * (first[2] if len(first) == 3 else 1)
                stem = NatureCNN(channels, first[0], first[1])
                self.stems[key or "_"] = stem
                self.out_dim += stem.out_dim
                continue
            if not isinstance(leaf, gym.spaces.Box):
                raise ValueError(f"unsupported observation space {leaf} for key {key!r} "
                                 "(supported: Box, Tuple of uint8 frames, Dict of those)")
            if is_image_space(leaf):
                stem = NatureCNN(*leaf.shape)
                self.stems[key or "_"] = stem
                self.out_dim += stem.out_dim
            else:
                self.out_dim += int(np.prod(leaf.shape))

    def forward(self, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for key in self.keys:
            value = obs[key] if self.is_dict else obs
            name = key or "_"
            if name in self.stems:
                if isinstance(value, (tuple, list)):
                    value = stack_frames(value)
                parts.append(self.stems[name](value))
            else:
                parts.append(value.float().reshape(value.shape[0], -1))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
