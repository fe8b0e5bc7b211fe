"""The ``surreal-redis`` command line (click, :mod:`.group`). Every command that talks to Redis
takes ``--redis-url`` (or ``$SURREAL_REDIS_URL``); a user's error exits non-zero with a message
naming it.

:func:`run` is the console script. For ``launch`` it starts the learner's process ahead
(:mod:`surreal_redis.launcher.preload`) before it imports click and the commands (a third of a
second on 2 cores), so that torch loads meanwhile. ``main``, the click group, is imported when
first asked for."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surreal_redis.cli.group import main

__all__ = ["main", "run"]

GROUP_OPTIONS_WITH_VALUE = ("--log-level",)  # the group's options that take a value (``.group``)


def command_of(args: list[str]) -> str | None:
    """The command ``args`` (``surreal-redis ARGS``) run, as far as reading the group's options
    tells: None for ``--help`` or ``--version`` anywhere, or no command."""
    if "--help" in args or "--version" in args:
        return None
    words = iter(args)
    for word in words:
        if word in GROUP_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def run(args: list[str] | None = None) -> None:
    """``surreal-redis ARGS`` (default ``sys.argv[1:]``); exits with the command's code."""
    args = sys.argv[1:] if args is None else args
    obj: dict[str, Any] = {}
    if command_of(args) == "launch":
        from surreal_redis.launcher.preload import Preloaded  # light: no redis, no click

        obj["preloaded"] = Preloaded.start("learner")  # torch imports while the rest loads
    from surreal_redis.cli.group import main as group

    group.main(args=args, prog_name="surreal-redis", obj=obj)


def __getattr__(name: str) -> Any:
    if name == "main":
        from surreal_redis.cli.group import main as group

        return group
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
