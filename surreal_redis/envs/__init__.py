"""Environments: :func:`make_env` and :func:`make_vector_env` for gymnasium ids, Atari games,
MuJoCo, dm_control, robosuite and families a user registers (:func:`register_family`), plus the
wrappers agents rely on. See docs/environments.md."""

from surreal_redis.envs.atari import ATARI_GAMES, atari_env_id
from surreal_redis.envs.config import (
    AtariConfig,
    EnvConfig,
    EnvError,
    EnvModeOverrides,
    MakeEnv,
    Mode,
    PixelConfig,
    RobosuiteConfig,
    UnknownFamily,
    env_family,
    family_names,
    register_family,
)
from surreal_redis.envs.families import SUPPORTED, ResolvedEnvId, resolve_env_id
from surreal_redis.envs.make import EpisodeResult, VectorStep, make_env, make_vector_env, step_vector_env
from surreal_redis.envs.spaces import ImageLayout, image_layout, is_frame_tuple, is_image_space
from surreal_redis.envs.wrappers import ActionRepeat, Float32Observations, FrameTupleStack, check_spaces

__all__ = [
    "ATARI_GAMES", "SUPPORTED", "ActionRepeat", "AtariConfig", "EnvConfig", "EnvError", "EnvModeOverrides",
    "EpisodeResult", "Float32Observations", "FrameTupleStack", "ImageLayout", "MakeEnv", "Mode", "PixelConfig",
    "ResolvedEnvId", "RobosuiteConfig", "UnknownFamily", "VectorStep", "atari_env_id", "check_spaces",
    "env_family", "family_names", "image_layout", "is_frame_tuple", "is_image_space", "make_env",
    "make_vector_env", "register_family", "resolve_env_id", "step_vector_env",
]
