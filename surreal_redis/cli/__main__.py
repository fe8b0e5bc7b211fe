"""``python -m surreal_redis.cli``: the same command line as ``surreal-redis``."""

from surreal_redis.cli import run

run()
