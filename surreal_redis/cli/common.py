"""What the ``surreal-redis`` commands share: options, clean failures, config loading, Redis
clients, and how a learner, agent or eval process starts and ends."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import redis

from surreal_redis.configtools import ConfigError
from surreal_redis.connection import RedisClient, connect, resolve_url
from surreal_redis.runtime import ONE_BLAS_THREAD, StopFlag

log = logging.getLogger(__name__)

config_option = click.option("--config", "config_path", default=None,
                             help="YAML config (path, or the name of a shipped config such as ppo_cartpole).")
run_option = click.option("--run", "run_name", default=None,
                          help="Take the config a launcher stored in Redis for this run (instead of --config).")
override_option = click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
                               help="Override a config value, e.g. -o ppo.learning_rate=1e-3 (repeatable).")
def resume_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--resume [latest|best|N]`` and ``--resume-from DIR``."""
    command = click.option("--resume-from", type=click.Path(file_okay=False, path_type=Path), default=None,
                           help="Experiment folder holding the checkpoint (default: this experiment's).")(command)
    return click.option("--resume", default=None, is_flag=False, flag_value="latest",
                        help="Continue from a checkpoint: latest (the default when given alone), best or an "
                             "iteration.")(command)


url_option = click.option("--redis-url", default=None, help="redis://, rediss://, unix:// or redis+cluster:// URL [env: SURREAL_REDIS_URL].")


def _fail_cleanly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the errors a user can fix into a one-line message and exit code 1."""
    from functools import wraps

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # imported here: they pull in torch and gymnasium, which `--help` does not need
        from surreal_redis.checkpoint import CheckpointError
        from surreal_redis.envs import EnvError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, CheckpointError, EnvError) as exc:
            raise click.ClickException(str(exc)) from None
        except redis.ConnectionError as exc:
            raise click.ClickException(f"cannot reach Redis: {exc}") from None
        except (ValueError, RuntimeError) as exc:
            if isinstance(exc, click.ClickException):
                raise
            log.debug("command failed", exc_info=True)
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    return wrapper


def _load(config_path: str | None, overrides: tuple[str, ...], redis_url: str | None = None,
          run_name: str | None = None):
    """The experiment config from a file, or from Redis (``--run``), with overrides applied."""
    from surreal_redis.config import load_config

    if run_name is None:
        config = load_config(config_path, overrides)
    else:
        from surreal_redis.config import ExperimentConfig
        from surreal_redis.configtools import apply_overrides, from_dict, parse_yaml
        from surreal_redis.hub.run.control import RunControl

        url = _require_url(redis_url)
        stored = RunControl(connect(url), run_name).stored_config()
        if stored is None:
            raise ConfigError(f"no config stored in Redis for run {run_name!r} at {url} (start it with launch, or pass --config)")
        config = from_dict(ExperimentConfig, apply_overrides(parse_yaml(stored), list(overrides)))
    if redis_url:
        config = config.with_overrides([f"redis.url={redis_url}"])
    return config


def _exit_process(code: int) -> NoReturn:
    """End a learner, agent or eval process that returned ``code`` without the interpreter's
    teardown, whose garbage collection with torch and MLflow loaded takes seconds that the launcher
    and a user wait for. By then every write has returned and no thread is left working."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _require_url(redis_url: str | None, config: Any = None) -> str:
    """``redis_url``, else ``config``'s ``redis.url``, else ``$SURREAL_REDIS_URL`` (UsageError if none)."""
    url = resolve_url(redis_url or (config and config.redis.url))
    if not url:
        where = ("--redis-url, set SURREAL_REDIS_URL or redis.url in the config" if config
                 else "--redis-url or set SURREAL_REDIS_URL")
        raise click.UsageError(f"no Redis URL: pass {where}")
    return url


def _one_blas_thread() -> None:
    """An agent or eval started by hand gets what ``launch`` gives its own (before numpy loads)."""
    for name, value in ONE_BLAS_THREAD.items():
        os.environ.setdefault(name, value)


def _single_threaded_torch() -> None:
    """Agents and evals run tiny batches: one thread each beats many processes fighting over
    every core. A process whose policy acts with numpy has not imported torch and does not now."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _waiting_client(config, stop: StopFlag, who: str) -> RedisClient:
    """The client of a learner, agent or eval: a Redis that does not answer yet (down, restarting,
    its pod not ready) is waited for with capped backoff, up to ``redis.startup_wait_s``, so a
    process the launcher restarts during an outage does not spend one of its restarts on it. A
    refused login is not an outage (an error at once); a stop signal while waiting exits 130."""
    from surreal_redis.outage import OUTAGE_ERRORS, OutageGuard
    from surreal_redis.runtime import INTERRUPTED_EXIT

    url = _require_url(None, config)
    client = connect(url, config.redis.settings())
    guard = OutageGuard(f"{who} start", stop)
    deadline = time.monotonic() + config.redis.startup_wait_s
    while True:
        try:
            client.ping()
        except redis.exceptions.AuthenticationError as exc:  # a ConnectionError, but no outage
            raise click.ClickException(f"Redis at {url} refused the login: {exc}") from None
        except OUTAGE_ERRORS as exc:
            if time.monotonic() >= deadline:
                raise click.ClickException(f"cannot reach Redis at {url} (waited {config.redis.startup_wait_s:g} s, "
                                           f"redis.startup_wait_s): {exc}") from None
            guard.failed(exc)
            if stop.is_set():
                log.info("%s: stopped while waiting for Redis at %s", who, url)
                _exit_process(INTERRUPTED_EXIT)
            continue
        guard.succeeded()
        return client
