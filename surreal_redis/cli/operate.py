"""Operating a run: ``status``, ``stop``, ``gc`` and ``acl``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from surreal_redis.cli.common import (
    _fail_cleanly,
    _load,
    _require_url,
    config_option,
    override_option,
    url_option,
)
from surreal_redis.connection import connect, resolve_url
from surreal_redis.run_folder import DEFAULT_RUNS_DIR
from surreal_redis.runtime import StopFlag


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


@click.command()
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


@click.command()
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


@click.command()
@run_name_option
@url_option
@runs_dir_option
@config_option
@override_option
@click.option("--drop", is_flag=True, help="Delete every key of the run instead.")
@_fail_cleanly
def gc(run_name: str | None, redis_url: str | None, runs_dir: Path, config_path: str | None,
       overrides: tuple[str, ...], drop: bool) -> None:
    """Apply retention and collect unreferenced observations and obs keys nothing can reach (junk
    names, orphans) now, sweeping every obs key of the run (or --drop the run)."""
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
    # full_sweep: every obs key of the run is checked, so junk and orphans go now, not a page a run
    stats = HubJanitor(client, config.hub.retention, run_name, config.redis.num_shards, config.hub.receiver,
                       full_sweep=True).run_once()
    click.echo(json.dumps(stats._asdict()))


@click.command()
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
    from surreal_redis.connection import CLUSTER_SCHEMES
    from surreal_redis.embedded import RedisVersionError

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
