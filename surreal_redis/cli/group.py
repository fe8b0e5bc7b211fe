"""The ``surreal-redis`` click group: every command (:mod:`surreal_redis.cli` is the console
script's light entry in front of it)."""

from __future__ import annotations

import click

from surreal_redis.cli.operate import acl, gc, status, stop
from surreal_redis.cli.processes import agent, eval_cmd, launch, learner
from surreal_redis.cli.tools import default_config, plot, redis_cmd, rollout
from surreal_redis.runtime import setup_logging


@click.group()
@click.version_option(package_name="surreal-redis")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.pass_context
def main(ctx: click.Context, log_level: str) -> None:
    """surreal-redis: distributed RL with Redis as the whole data plane."""
    setup_logging(log_level)
    ctx.ensure_object(dict)["log_level"] = log_level.upper()  # beside what the entry passed (``preloaded``)


for _command in (launch, agent, learner, eval_cmd, status, stop, gc, acl, redis_cmd, default_config, rollout, plot):
    main.add_command(_command)
