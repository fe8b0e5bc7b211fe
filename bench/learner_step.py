"""One on-policy learner update, timed on this machine's learner device:
``python bench/learner_step.py [--configs ppo_cartpole,ppo_halfcheetah] [--steps 0,8192] [--minibatch 0,1024]
[--repeats 5] [--device auto] [--json PATH]``.

The input of the many-core model in ``docs/benchmarks.md``: how long one epoch of an update takes
on the learner's device, at the shipped batch and at larger ones. Per config (an on-policy one:
PPO or APPO), its network and settings from the shipped YAML, chunks collected by its own policy
on its own env (:class:`~surreal_redis.testing.local_loop.ChunkCollector`, T =
``hub.sender.flush_steps``), then per batch of ``--steps`` env steps (0: the config's
``learner.steps_per_update``) and minibatch size (``--minibatch``; 0: the config's,
steps_per_update / num_minibatches): ``--repeats`` timed updates of ``update_epochs`` epochs after
one untimed warm-up, on the same chunks (the weights move, the shapes do not). Reported per case:
the median update's seconds, ms per epoch and per minibatch step, and samples through gradient
steps per second (steps x epochs / seconds). The learner's torch threads are the config's
(``learner.torch_threads``), as in a launch. CUDA work is synchronized before each clock read.

Progress goes to stderr; the last line of stdout is one JSON object; ``--json PATH`` also writes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import statistics
import time
from pathlib import Path

import torch

from surreal_redis.algos.learning import make_trainer
from surreal_redis.algos.policies import make_policy
from surreal_redis.algos.ppo.trainer import PPOTrainer
from surreal_redis.chunks import Chunk
from surreal_redis.config import load_config
from surreal_redis.envs import make_vector_env
from surreal_redis.testing.local_loop import ChunkCollector

log = logging.getLogger("bench.learner_step")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_config(name: str, steps_options: list[int], minibatch_options: list[int], repeats: int,
                device: str) -> list[dict]:
    """The cases of one shipped config; see the module docstring."""
    config = load_config(name)
    torch.set_num_threads(config.learner.torch_threads)
    section = dataclasses.replace(config.algorithm.for_run(config), device=device)  # its annealing schedule too
    chunk_steps = config.hub.sender.flush_steps
    envs = make_vector_env(config.env, seed=config.experiment.seed)
    policy = make_policy(section, envs.single_observation_space, envs.single_action_space, envs.num_envs,
                         agent_id=0, num_agents=1, seed=config.experiment.seed, inference="torch")
    cases = []
    for steps in steps_options:
        steps = steps or config.learner.steps_per_update
        chunks_needed = math.ceil(steps / chunk_steps)
        algo = make_trainer(section, envs.single_observation_space, envs.single_action_space, config.experiment.seed)
        if not isinstance(algo, PPOTrainer):
            raise SystemExit(f"{name}: {config.algo}'s trainer is not a PPO-family one; this bench times those")
        policy.load_params(algo.actor_params(), 0)
        collector = ChunkCollector(envs, policy, seed=config.experiment.seed)
        chunks: list[Chunk] = []
        while len(chunks) < chunks_needed:
            chunks += collector.collect(chunk_steps)
        chunks = chunks[:chunks_needed]
        batch = chunks_needed * chunk_steps
        for minibatch in minibatch_options:
            minibatch = minibatch or config.learner.steps_per_update // config.algo_config.num_minibatches
            if minibatch > batch:
                log.info("%s: minibatch %d is larger than the batch of %d steps; skipped", name, minibatch, batch)
                continue
            if batch % minibatch:
                raise SystemExit(f"{name}: minibatch {minibatch} does not divide the batch of {batch} steps")
            algo.config = dataclasses.replace(algo.config, num_minibatches=batch // minibatch)
            epochs = algo.config.update_epochs
            seconds = []
            for attempt in range(repeats + 1):
                _synchronize(algo.device)
                started = time.perf_counter()
                algo.update(chunks)
                _synchronize(algo.device)
                if attempt:  # the first is a warm-up (allocations, kernel selection)
                    seconds.append(time.perf_counter() - started)
            update_s = statistics.median(seconds)
            case = {"config": name, "device": str(algo.device), "torch_threads": torch.get_num_threads(),
                    "steps": batch, "minibatch": minibatch, "minibatches": batch // minibatch, "epochs": epochs,
                    "update_s": round(update_s, 4), "epoch_ms": round(1000 * update_s / epochs, 2),
                    "minibatch_step_ms": round(1000 * update_s / (epochs * (batch // minibatch)), 3),
                    "samples_per_s": round(batch * epochs / update_s)}
            log.info("%s", case)
            cases.append(case)
    envs.close()
    return cases


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="ppo_cartpole,ppo_halfcheetah")
    parser.add_argument("--steps", default="0,8192", help="env steps per update, comma-separated (0: the config's)")
    parser.add_argument("--minibatch", default="0,1024",
                        help="rows per minibatch, comma-separated (0: the config's minibatch size)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, ...")
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args(argv)
    try:
        steps = [int(s) for s in options.steps.split(",") if s]
        minibatches = [int(s) for s in options.minibatch.split(",") if s]
    except ValueError:
        parser.error(f"--steps and --minibatch take comma-separated integers, got {options.steps!r}, {options.minibatch!r}")
    if not steps or not minibatches or min(steps + minibatches) < 0 or options.repeats < 1:
        parser.error("--steps and --minibatch need counts >= 0 and --repeats >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, object] = {"cores": os.cpu_count(), "torch": torch.__version__,
                                 "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                                 "cases": []}
    for name in options.configs.split(","):
        result["cases"] += time_config(name, steps, minibatches, options.repeats, options.device)  # type: ignore[operator]
    print(json.dumps(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
