"""Environments: :func:`make_env` and :func:`make_vector_env` for gymnasium ids, Atari games
(``atari`` extra), MuJoCo (``mujoco``), dm_control through shimmy (``dmc``) and robosuite
(``robosuite``), plus the wrappers agents rely on.

- :mod:`~surreal_redis.envs.config`: :class:`EnvConfig` and the family settings.
- :mod:`~surreal_redis.envs.spaces`: which observation leaves are images, in which axis order.
- :mod:`~surreal_redis.envs.wrappers`: frame stacks kept as separate frames, action repeat,
  float32 observations, the space check.
- :mod:`~surreal_redis.envs.atari`: Atari preprocessing as CleanRL and SB3 do it.
- :mod:`~surreal_redis.envs.robosuite_adapter`: robosuite behind the gymnasium API.
- :mod:`~surreal_redis.envs.make`: building and stepping (vector) envs.
"""

from surreal_redis.envs.atari import ATARI_GAMES, atari_env_id
from surreal_redis.envs.config import (
    AtariConfig,
    EnvConfig,
    EnvError,
    EnvModeOverrides,
    Mode,
    PixelConfig,
    RobosuiteConfig,
)
from surreal_redis.envs.make import (
    SUPPORTED,
    EpisodeResult,
    ResolvedEnvId,
    VectorStep,
    make_env,
    make_vector_env,
    resolve_env_id,
    step_vector_env,
)
from surreal_redis.envs.spaces import ImageLayout, image_layout, is_frame_tuple, is_image_space
from surreal_redis.envs.wrappers import ActionRepeat, Float32Observations, FrameTupleStack, check_spaces

__all__ = [
    "ATARI_GAMES", "SUPPORTED", "ActionRepeat", "AtariConfig", "EnvConfig", "EnvError", "EnvModeOverrides",
    "EpisodeResult", "Float32Observations", "FrameTupleStack", "ImageLayout", "Mode", "PixelConfig",
    "ResolvedEnvId", "RobosuiteConfig", "VectorStep", "atari_env_id", "check_spaces", "image_layout",
    "is_frame_tuple", "is_image_space", "make_env", "make_vector_env", "resolve_env_id", "step_vector_env",
]
