"""Hub benchmark: ``python bench/hub.py [--quick] [--params-only] [--kinds atari,...]``.

Progress goes to stderr through logging; the last line of stdout is one JSON object with the
results (see :func:`harness.hub_bench.run_hub_bench`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from harness.bench_data import KINDS
from harness.hub_bench import BenchSizes, run_hub_bench

from surreal_redis.runtime import setup_logging


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument("--params-only", action="store_true", help="only the parameter poll and fetch, seconds")
    parser.add_argument("--kinds", help="comma-separated observation kinds to ingest (default: all of "
                        + ", ".join(KINDS) + ")")
    args = parser.parse_args()
    setup_logging("INFO")
    sizes = BenchSizes.quick() if args.quick else BenchSizes()
    if args.kinds is not None:
        wanted = [k for k in args.kinds.split(",") if k]
        unknown = sorted(set(wanted) - set(sizes.kinds))
        if unknown or not wanted:
            parser.error(f"--kinds {args.kinds!r}: unknown or empty (known: {', '.join(sizes.kinds)})")
        sizes = dataclasses.replace(sizes, kinds={k: sizes.kinds[k] for k in wanted})
    if args.params_only:
        sizes = dataclasses.replace(sizes, kinds={})
    print(json.dumps(run_hub_bench(args.quick, sizes)))


if __name__ == "__main__":
    main()
