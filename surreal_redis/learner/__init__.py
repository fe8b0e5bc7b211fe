"""The learner process (``surreal-redis learner``): hub -> feed -> gradient updates -> parameters.

:mod:`.loop` holds :class:`~.loop.Learner` and delegates each policy to an object of its own
module: :mod:`.parts` (trainer, feed, chunk check), :mod:`.grants` (production grants and top-ups),
:mod:`.republish` (a version agents reject), :mod:`.progress` (episode scores, stop rules),
:mod:`.metrics` (MLflow metrics, the status report), :mod:`.prefetch` (the reader thread) and
:mod:`.chunk_check` (what a chunk must carry to be trained on). Nothing is imported here, so
``launch`` and ``status`` read :func:`~.metrics.use_summary` without loading torch.
"""
