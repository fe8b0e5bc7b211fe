"""Scale benchmark: ``python bench/scale.py [--quick] [--json PATH] [--agents 8,64,256,1024] [--envs pong,halfcheetah]``.

N simulated agents (threads in ``--workers`` processes, each with its own connection, sender and
parameter client) replay recorded Pong frames or HalfCheetah vectors through the project's sender
at a real agent's rate, poll and download parameters; a learner-side reader moves, reads and acks,
a publisher publishes the real network's parameters. Per N: env steps/s offered, produced and
acked; p50/p99 of insert, poll, claim and download latency; Redis CPU per 1k transitions and per
GB of parameters; memory per connection; the same with read replicas and a 3-primary cluster; and
the parameter broadcast at 1024 Pong agents with its options: ``hub.params_client.min_version_lag: 2``
(agents download every other version), ``hub.publisher.dtype: float16`` (half the bytes), read
replicas, and the combinations (see :mod:`harness.scale`); and how far the Pong
network's outputs move with float16 weights, fresh and (without ``--quick``) trained.

Progress goes to stderr through logging; the last line of stdout is one JSON object with the
results; ``--json PATH`` writes them there too, with the figure beside it (``PATH`` with ``.png``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

from harness.scale import (
    PROFILES,
    BenchPlan,
    markdown_tables,
    run_scale_bench,
    scale_figure,
)

from surreal_redis import plots
from surreal_redis.runtime import setup_logging

log = logging.getLogger("bench.scale")


def _counts(parser: argparse.ArgumentParser, name: str, text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        parser.error(f"--{name} must be comma-separated integers, got {text!r}")
    if any(n < 1 for n in counts):
        parser.error(f"--{name} needs counts >= 1, got {text!r}")
    return counts


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, BenchPlan]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run: 8 agents, short phases")
    parser.add_argument("--json", type=Path, help="write the results here and the figure beside it (.png)")
    parser.add_argument("--envs", help=f"comma-separated, of {', '.join(PROFILES)}")
    parser.add_argument("--agents", help="N on one primary, comma-separated (default 8,64,256,1024)")
    parser.add_argument("--replica-agents", help="N with 2 read replicas (default 256,1024; '' for none)")
    parser.add_argument("--cluster-agents", help="N on a 3-primary cluster (default 1024; '' for none)")
    parser.add_argument("--lockstep-agents", help="Pong N producing on grants, with claims (default 256; '' for none)")
    parser.add_argument("--broadcast-agents", type=int, help="Pong N of the parameter-broadcast options (0: none)")
    parser.add_argument("--workers", type=int, help="agent processes (default 4)")
    parser.add_argument("--publish-every-s", type=float, help="seconds between publishes (default: per env, 1.0)")
    parser.add_argument("--seconds", type=float, help="phase B seconds (phase A is 3/5 of it, phase P half)")
    args = parser.parse_args(argv)
    plan = BenchPlan.quick() if args.quick else BenchPlan()
    changes: dict = {}
    if args.envs is not None:
        envs = tuple(e for e in args.envs.split(",") if e)
        unknown = [e for e in envs if e not in PROFILES]
        if unknown or not envs:
            parser.error(f"unknown envs {unknown} (known: {', '.join(PROFILES)})")
        changes["envs"] = envs
    for name in ("agents", "replica_agents", "cluster_agents", "lockstep_agents"):
        text = getattr(args, name)
        if text is not None:
            changes[name] = _counts(parser, name.replace("_", "-"), text)
    if args.broadcast_agents is not None:
        if args.broadcast_agents < 0:
            parser.error(f"--broadcast-agents must be >= 0, got {args.broadcast_agents}")
        changes["broadcast_agents"] = args.broadcast_agents or None
    if args.workers is not None:
        if args.workers < 1:
            parser.error(f"--workers must be >= 1, got {args.workers}")
        changes["workers"] = args.workers
    if args.publish_every_s is not None:
        if args.publish_every_s <= 0:
            parser.error(f"--publish-every-s must be > 0, got {args.publish_every_s}")
        changes["publish_every_s"] = args.publish_every_s
    if args.seconds is not None:
        if args.seconds <= 0:
            parser.error(f"--seconds must be > 0, got {args.seconds}")
        changes["loaded_s"], changes["quiet_s"], changes["params_s"] = args.seconds, 0.6 * args.seconds, 0.5 * args.seconds
    return args, dataclasses.replace(plan, **changes)


def main(argv: list[str] | None = None) -> None:
    args, plan = parse_args(argv)
    setup_logging("INFO")
    result = run_scale_bench(plan, quick=args.quick)
    log.info("results:\n%s", markdown_tables(result))
    for key in ("fp16_check", "fp16_check_trained"):
        if key in result:
            log.info("%s: %s", key, json.dumps(result[key]))
    text = json.dumps(result, default=float)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
        log.info("results: %s; figure: %s", args.json, plots.save_beside(scale_figure(result), args.json))
    print(text)


if __name__ == "__main__":
    main()
