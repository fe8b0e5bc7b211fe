"""``surreal-redis rollout CHECKPOINT``: evaluate a checkpoint locally (no Redis), optionally
recording each episode as an animated GIF when the env can render ``rgb_array`` frames."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

from surreal_redis.checkpoint import CheckpointConfig, CheckpointError
from surreal_redis.config import ExperimentConfig, load_config
from surreal_redis.configtools import ConfigError
from surreal_redis.envs import make_env
from surreal_redis.evaluator import EVAL_MODES, checkpoint_policy, play_episode
from surreal_redis.run_folder import RunFolder

log = logging.getLogger(__name__)

class RolloutResult(NamedTuple):
    """The checkpoint file played (absolute), its learner update count, and each episode's return."""

    checkpoint: Path
    iteration: int
    returns: list[float]


def locate(checkpoint: Path, config_path: str | None, overrides: tuple[str, ...]) -> tuple[Path, ExperimentConfig]:
    """The checkpoint file and its config: an experiment folder means its latest checkpoint and
    its ``config.yaml``; a file's config is ``--config`` or the ``config.yaml`` two folders up."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        folder = RunFolder(checkpoint)
        path = folder.checkpoints(CheckpointConfig()).resolve("latest")
    elif checkpoint.is_file():
        folder, path = RunFolder.holding(checkpoint), checkpoint
    else:
        raise CheckpointError(f"checkpoint {checkpoint} does not exist")
    if config_path is None:
        candidate = folder.config_file
        if not candidate.exists():
            raise ConfigError(f"no {candidate.name} in {folder.path}: pass --config")
        config_path = str(candidate)
    return path, load_config(config_path, overrides)


def run_rollout(checkpoint: Path, config_path: str | None, overrides: tuple[str, ...], episodes: int,
                mode: str, video_dir: Path | None = None) -> RolloutResult:
    """Play ``episodes`` episodes with the checkpoint's policy (blocks until they are done)."""
    path, config = locate(checkpoint, config_path, overrides)
    path = path.resolve()
    render = {"render_mode": "rgb_array"} if video_dir is not None else {}
    if render:
        config = config.with_overrides([f"env.kwargs={dict(config.env.kwargs, **render)}"])
    env = make_env(config.env, seed=config.experiment.seed + 30_000, mode="eval")
    policy, iteration, state = checkpoint_policy(config, path, env)
    log.info("loaded checkpoint %s (update %d, %d env steps)", path, iteration, int(state.get("env_steps", 0)))
    returns = []
    for episode in range(episodes):
        frames: list = []
        record = (lambda frames=frames: frames.append(env.render())) if video_dir else None
        total, length = play_episode(env, policy, EVAL_MODES[mode], seed=config.experiment.seed + 30_000 + episode,
                                     on_frame=record)
        returns.append(total)
        log.info("episode %d: return %.2f, %d steps", episode, total, length)
        if video_dir is not None:
            _write_gif(video_dir / f"episode-{episode:03d}.gif", frames, env.metadata.get("render_fps", 30))
    env.close()
    return RolloutResult(path, iteration, returns)


def _write_gif(path: Path, frames: list, fps: int) -> None:
    try:
        from PIL import Image
    except ImportError:
        raise RuntimeError("video needs Pillow: pip install pillow") from None
    if not frames or frames[0] is None:
        raise RuntimeError("the env rendered no rgb_array frames; it cannot record video")
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / max(1, fps)), loop=0)
    log.info("video written to %s", path)
