"""``surreal-redis launch``: one experiment on this machine. :mod:`.supervisor` prepares the run
and supervises it, :mod:`.children` starts and restarts its processes (the learner's
:mod:`.preload`\\ ed ahead), :mod:`.final_eval` ends it with the final eval and the summary. The
run's folder is :mod:`surreal_redis.run_folder`'s.

:class:`Launcher` is imported when first asked for: ``launch`` starts the learner's process ahead
before it loads the rest of the launcher (a third of a second)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surreal_redis.launcher.supervisor import Launcher, LaunchError

__all__ = ["LaunchError", "Launcher"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from surreal_redis.launcher import supervisor

        return getattr(supervisor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
