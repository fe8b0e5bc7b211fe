"""Which observation leaves are images, and how their axes are laid out.

An image is a uint8 Box of rank 2 ``(H, W)`` (grayscale) or rank 3, either channels-last
``(H, W, C)`` (gymnasium's renders, ALE RGB, robosuite cameras) or channels-first ``(C, H, W)``.
The channel axis of a rank-3 image is the smaller of its first and last axes (channels-last on a
tie): ``(84, 84, 3)`` and ``(84, 84, 12)`` are channels-last, ``(3, 64, 64)`` and ``(4, 84, 84)``
channels-first. A frame stack is a Tuple of K identical image Boxes
(:class:`~surreal_redis.envs.wrappers.FrameTupleStack`). Every other Box is a vector.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, TypeGuard

import gymnasium as gym
import numpy as np

Axes = Literal["hw", "hwc", "chw"]


class ImageLayout(NamedTuple):
    """Channels, height and width of an image leaf (a frame stack counts K x C channels), and the
    axis order of one frame."""

    channels: int
    height: int
    width: int
    axes: Axes


def image_layout(space: gym.Space) -> ImageLayout | None:
    """The layout of a uint8 image Box or frame Tuple, None for anything else."""
    if is_frame_tuple(space):
        first = image_layout(space.spaces[0])
        assert first is not None
        return first._replace(channels=first.channels * len(space.spaces))
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8):
        return None
    shape = tuple(int(n) for n in space.shape)
    if len(shape) == 2:
        return ImageLayout(1, shape[0], shape[1], "hw")
    if len(shape) == 3:
        if shape[2] <= shape[0]:
            return ImageLayout(shape[2], shape[0], shape[1], "hwc")
        return ImageLayout(shape[0], shape[1], shape[2], "chw")
    return None


def is_image_space(space: gym.Space) -> bool:  # a uint8 Box (H, W), (H, W, C) or (C, H, W)
    return isinstance(space, gym.spaces.Box) and image_layout(space) is not None


def is_frame_tuple(space: gym.Space) -> TypeGuard[gym.spaces.Tuple]:
    """A frame stack kept as separate frames: a Tuple of K >= 1 identical image Boxes."""
    return (isinstance(space, gym.spaces.Tuple) and len(space.spaces) > 0
            and all(is_image_space(s) and s == space.spaces[0] for s in space.spaces))


def bounded_box(space: gym.Space, algorithm: str) -> gym.spaces.Box:
    """``space`` if it is a 1-d Box with finite bounds (DDPG and SAC act in one), else a ValueError
    naming ``algorithm`` and the space."""
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1
            and np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ValueError(f"{algorithm} needs a 1-d Box action space with finite bounds, got {space}")
    return space
