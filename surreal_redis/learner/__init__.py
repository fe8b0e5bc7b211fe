"""The learner process (``surreal-redis learner``): hub -> feed -> gradient updates -> parameters.

- ``loop``: :class:`Learner`, the loop; it delegates each policy to one of the objects below.
- ``parts``: :class:`LearnerParts` (trainer, feed, chunk check), :func:`make_feed`.
- ``grants``: lockstep/overlap production grants and top-ups (:class:`GrantKeeper`).
- ``republish``: re-publishing a version agents reject (:class:`RejectionWatch`).
- ``progress``: episode scores and the stop rules (:class:`Scores`, :class:`StopRules`).
- ``metrics``: MLflow metrics and the status report (:class:`LearnerMetrics`, :func:`use_summary`).
- ``prefetch``: the reader thread and its queue (:class:`Prefetcher`, :class:`PrefetchQueue`).
- ``chunk_check``: what a chunk must carry to be trained on (:class:`ChunkCheck`).

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
