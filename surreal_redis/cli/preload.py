"""``python -m surreal_redis.cli.preload ROLE``: the process ``launch`` starts ahead of the rest
of a run (:mod:`surreal_redis.launcher.preload`, the launcher's side): it imports ROLE's modules,
then waits for its command line on stdin and runs it as ``surreal-redis`` would."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys

from surreal_redis.cli import main as cli_main

PRELOADS = {"learner": "surreal_redis.learner.loop"}
"""role -> the module whose import makes its start quick."""


def main(argv: list[str]) -> int:
    """The preloaded process: import ``argv[0]``'s modules, wait for the command (module docstring)."""
    if len(argv) != 1 or argv[0] not in PRELOADS:
        print(f"usage: python -m {__name__} {{{','.join(PRELOADS)}}}", file=sys.stderr)
        return 2
    importlib.import_module(PRELOADS[argv[0]])
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    told = json.loads(line)
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(told["log"], "ab"))  # noqa: SIM115 -- both fds point at it from now
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        null = files.enter_context(open(os.devnull, "rb"))
        os.dup2(null.fileno(), 0)
    os.chdir(told["cwd"])
    cli_main(args=told["argv"], prog_name="surreal-redis")  # exits with the command's code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
