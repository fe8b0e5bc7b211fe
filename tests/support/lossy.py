"""Pipelines that fail the way a network does, patched onto one client: a reply lost after the
server acted, or a request that never reached it."""

from __future__ import annotations

from collections.abc import Callable

import redis


def lossy_pipelines(monkeypatch, client: redis.Redis, losses: int = 1, reached: bool = True,
                    after: Callable[[], None] | None = None, before: Callable[[], None] | None = None) -> list:
    """The first ``losses`` pipelines ``client`` makes raise ConnectionError from ``execute``:
    after the server ran them (``reached``), or without sending them. ``before`` runs ahead of
    each execute, ``after`` between a lossy execute and its error (say, another client's call
    that lands before the re-send). Returns the list of executes, one entry per call."""
    original = client.pipeline
    executes: list = []

    def pipeline(*args, **kwargs):
        pipe = original(*args, **kwargs)
        execute = pipe.execute

        def lossy_execute(*exec_args, **exec_kwargs):
            executes.append(exec_args)
            if before is not None:
                before()
            if len(executes) > losses:
                return execute(*exec_args, **exec_kwargs)
            if reached:
                execute(*exec_args, **exec_kwargs)
                if after is not None:
                    after()
            else:
                pipe.reset()
            raise redis.ConnectionError("pipeline reply lost (simulated)")
        pipe.execute = lossy_execute
        return pipe
    monkeypatch.setattr(client, "pipeline", pipeline)
    return executes
