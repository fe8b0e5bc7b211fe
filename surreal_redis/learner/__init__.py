"""The learner process (``surreal-redis learner``): hub -> feed -> gradient updates -> parameters.

:mod:`.loop` holds :class:`Learner` and delegates each policy to an object of its own module:
:mod:`.parts` (trainer, feed, chunk check), :mod:`.grants` (production grants and top-ups),
:mod:`.republish` (a version agents reject), :mod:`.progress` (episode scores, stop rules),
:mod:`.metrics` (MLflow metrics, the status report), :mod:`.prefetch` (the reader thread) and
:mod:`.chunk_check` (what a chunk must carry to be trained on).

The names below load their module on first use (PEP 562): ``launch`` and ``status`` import
:func:`use_summary` without torch, which :class:`Learner` needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surreal_redis.learner.chunk_check import ChunkCheck
    from surreal_redis.learner.loop import Learner
    from surreal_redis.learner.metrics import LearnerMetrics, LearnerProgress, use_summary
    from surreal_redis.learner.parts import FeedSettings, LearnerParts, make_feed
    from surreal_redis.learner.prefetch import Prefetcher, PrefetchQueue

_HOMES = {"Learner": "loop", "LearnerParts": "parts", "FeedSettings": "parts", "make_feed": "parts",
          "LearnerMetrics": "metrics", "LearnerProgress": "metrics", "use_summary": "metrics",
          "Prefetcher": "prefetch", "PrefetchQueue": "prefetch", "ChunkCheck": "chunk_check"}

__all__ = ["ChunkCheck", "FeedSettings", "Learner", "LearnerMetrics", "LearnerParts", "LearnerProgress",
           "PrefetchQueue", "Prefetcher", "make_feed", "use_summary"]


def __getattr__(name: str) -> Any:
    """``from surreal_redis.learner import Learner``: the name from its module, imported now."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
