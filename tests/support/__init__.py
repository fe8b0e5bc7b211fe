"""Labs only the tests use: :mod:`.netns` (network namespaces joined by a bridge, for partition
tests). ``tests/`` is on ``sys.path`` when pytest runs (``tests/conftest.py``), so tests import
``support.<module>``."""
