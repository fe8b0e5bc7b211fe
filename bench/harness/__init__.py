"""What the benchmarks share, outside the package: synthetic experience (:mod:`.bench_data`), the
hub benchmark (:mod:`.hub_bench`), a throwaway local Redis Cluster (:mod:`.cluster`, also used by
the tests) and the scale benchmark (:mod:`.scale`).

The bench scripts run as ``python bench/<name>.py`` from the repository root, so ``bench/`` is on
``sys.path`` as the script's own folder and they import ``harness.<module>``; the tests put
``bench/`` on ``sys.path`` in ``tests/conftest.py``.
"""
