"""One learner update of each algorithm, timed on this machine's learner device against
stable-baselines3's same update: ``python bench/learner_step.py [--algos ppo,appo,sac,ddpg,crossq]
[--configs NAME,...] [--steps 0] [--minibatch 0] [--batch 0] [--repeats 7] [--device auto]
[--no-reference] [--phases] [--loop SECONDS] [--loop-rounds N] [--json PATH]``.

Per config (``--configs``, else the shipped ones of each of ``--algos``: ppo_cartpole and
ppo_halfcheetah, appo_halfcheetah, sac_halfcheetah, ddpg_halfcheetah, crossq_halfcheetah), its
network and settings
from the shipped YAML, and the learner's torch threads (``learner.torch_threads``), as in a launch:

- On-policy (PPO, APPO): chunks collected by its own policy on its own env
  (:class:`~surreal_redis.testing.local_loop.ChunkCollector`, T = ``hub.sender.flush_steps``),
  then per batch of ``--steps`` env steps (0: the config's ``learner.steps_per_update``) and
  minibatch size (``--minibatch``; 0: the config's, steps_per_update / num_minibatches):
  ``--repeats`` timed updates of ``update_epochs`` epochs on the same chunks (the weights move,
  the shapes do not). Reported: the median update's seconds, ms per epoch and per minibatch step
  (all of the update's work / minibatch steps), samples through gradient steps per second.
- Off-policy (SAC, DDPG, CrossQ): per batch size (``--batch``; 0: the config's ``off_policy.batch_size``),
  ``--repeats`` timed blocks of 20 updates, each on one of 8 batches of random transitions of the
  env's observation and action shapes (no env is stepped: the cost depends on shapes only; the
  batch is ready, the replay's sampling is timed by ``bench/replay.py``). Reported: the median
  block's ms per update.

With the reference (unless ``--no-reference``; needs the ``bench`` extra), each timed repeat of
ours is followed by one of stable-baselines3's same update on the same sizes, threads and device
(see ``bench/sb3_reference.py`` for what each is and what it includes), and the case adds theirs
(``sb3_*``) and ``ratio`` = ours / theirs (below 1: ours is faster). CrossQ has none
(stable-baselines3 has no CrossQ; sb3-contrib's is not installed): it is timed alone. One untimed warm-up of each
side first (allocations, kernel selection); CUDA work is synchronized before each clock read.

``--phases`` (on-policy): after the plain repeats, ``--repeats`` more updates with each phase
timed by :class:`update_phases.PhaseClock`, which wraps the trainer's methods on that instance
only (its behaviour unchanged; on CUDA it synchronizes around each phase, so these repeats run
apart from the plain ones). The case adds ``phase_s`` (seconds per update) and ``phase_share``
(of the update) of ``reward_scale`` (the reward scaler), ``decode`` (chunks stacked into
tensors), ``no_grad_pass`` (the no-grad pass over the batch: values, bootstraps, APPO's
log-probs), ``targets`` (GAE, V-trace), ``gradient`` (the minibatch steps: forward, backward,
clipping, optimizer), ``z_filter`` and ``other`` (the rest: merging, shuffling, stats); and
``non_gradient_share`` = 1 - gradient's share, ``no_grad_pass_share``. Issue 29's target:
non-gradient work <= 15% of the update at the config's batch and at 8192 steps
(``--steps 0,8192``).

``--loop SECONDS`` (0: off): the loop efficiency. Per config (a shipped name), ``--loop-rounds``
(default 1) launches of it as shipped (its agents, eval and tracking; ``stop.target_return``
off, so each runs ``SECONDS`` or to its ``max_env_steps``; :func:`solve.run_launch`), and in the
same run the bare update of this bench at the config's own sizes (no reference; ``--steps``,
``--minibatch``, ``--batch`` must stay 0), timed before each launch and after the last
(``bare_update_s``: this machine's speed drifts within minutes). Each launch's learner rate over
its steady window, from its log's metrics lines (from the first after an update, past start-up
and ``learning_starts``, to the last), against the mean of the bare timings on either side:
``result["loop"]`` per config has ``launches`` (per launch: ``launch_updates_per_s``,
``learner_busy``, ``launch_update_s``, ``loop_efficiency``) and their medians at its top level
(target >= 0.9 for SAC, DDPG, PPO), ``bare_updates_per_s`` (1 / the median bare seconds per
update). ``learner_busy`` is seconds inside updates / wall seconds over the window, from the same
lines (1% resolution); ``launch_update_s`` = busy / updates per second, one update's seconds in
the launch as the learner's busy clock counts them (the feed's part included: the replay's
sampling).
loop_efficiency = learner_busy x bare seconds / launch_update_s: time outside the updates apart
from updates slowed down. The ratio measures the learner's work around its updates (receiving
and decoding chunks, replay inserts and sampling, publishing parameters, checkpoints, metrics),
the cores it shares with the agents and the eval (the bare update has the machine), and its
waits: on-policy, the launch's rate includes the learner waiting for the agents to produce each
batch (``learner_busy`` shows how much); off-policy, waiting on the replay's rate limit
(``updates_per_step``) when the agents are slower than the learner.

Progress goes to stderr; the last line of stdout is one JSON object; ``--json PATH`` also writes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from surreal_redis.algos.learning import make_trainer
from surreal_redis.algos.networks import resolve_device
from surreal_redis.algos.policies import make_policy
from surreal_redis.algos.ppo.trainer import PPOTrainer
from surreal_redis.chunks import Chunk, TransitionBatch
from surreal_redis.config import load_config
from surreal_redis.envs import make_vector_env
from surreal_redis.testing.local_loop import ChunkCollector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve import STAMP, launch_name, log_time, run_launch  # noqa: E402  (bench/ is not a package)
from update_phases import synchronize, time_phases  # noqa: E402

log = logging.getLogger("bench.learner_step")

DEFAULT_CONFIGS = {"ppo": ["ppo_cartpole", "ppo_halfcheetah"], "appo": ["appo_halfcheetah"],
                   "sac": ["sac_halfcheetah"], "ddpg": ["ddpg_halfcheetah"], "crossq": ["crossq_halfcheetah"]}
BLOCK_UPDATES = 24
"""Off-policy updates per timed block (a multiple of 2 and 3: SAC's and DDPG's actor steps come
every second update, CrossQ's every third, so each block holds as many)."""
RANDOM_BATCHES = 8


def time_interleaved(ours: Callable[[], None], theirs: Callable[[], None] | None, repeats: int,
                     device: torch.device) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` calls of ``ours`` and of ``theirs``, alternating (so that the load of
    a shared machine falls on both alike), after one untimed warm-up call of each."""
    sides = [ours] if theirs is None else [ours, theirs]
    seconds: list[list[float]] = [[], []]
    for attempt in range(repeats + 1):
        for side, call in enumerate(sides):
            synchronize(device)
            started = time.perf_counter()
            call()
            synchronize(device)
            if attempt:
                seconds[side].append(time.perf_counter() - started)
    return seconds[0], seconds[1]


def _spaces(config) -> tuple[gym.Space, gym.Space, object]:
    envs = make_vector_env(config.env, seed=config.experiment.seed)
    return envs.single_observation_space, envs.single_action_space, envs


def random_batches(obs_space: gym.Space, action_space: gym.Space, batch: int, seed: int) -> list[TransitionBatch]:
    """:data:`RANDOM_BATCHES` transition batches of ``batch`` random rows (Box observations only)."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise SystemExit(f"random batches need a Box observation space, got {obs_space}")
    rng = np.random.default_rng(seed)

    def one() -> TransitionBatch:
        def obs() -> np.ndarray:
            return rng.uniform(-1, 1, (batch, *obs_space.shape)).astype(np.float32)
        return TransitionBatch(obs=obs(), next_obs=obs(),
                               actions=rng.uniform(action_space.low, action_space.high,
                                                   (batch, *action_space.shape)).astype(np.float32),
                               rewards=rng.normal(size=batch).astype(np.float32),
                               discounts=np.full(batch, 0.99, np.float32), weights=np.ones(batch, np.float32),
                               indices=np.arange(batch))
    return [one() for _ in range(RANDOM_BATCHES)]


def _block(update: Callable[[TransitionBatch], object], batches: list[TransitionBatch]) -> None:
    for i in range(BLOCK_UPDATES):
        update(batches[i % len(batches)])


def time_off_policy(name: str, config, batch_options: list[int], repeats: int, device: str,
                    reference: bool) -> list[dict]:
    """The cases of one shipped off-policy config; see the module docstring."""
    import sb3_reference

    section = dataclasses.replace(config.algo_config, device=device)
    obs_space, action_space, envs = _spaces(config)
    envs.close()
    cases = []
    for batch in batch_options:
        batch = batch or config.off_policy.batch_size
        algo = make_trainer(section, obs_space, action_space, config.experiment.seed)
        batches = random_batches(obs_space, action_space, batch, config.experiment.seed)

        theirs = None
        maker = {"sac": sb3_reference.sac_update, "ddpg": sb3_reference.ddpg_update}.get(config.algo)
        if reference and maker is None:
            log.info("%s: no stable-baselines3 reference for %s; ours alone", name, config.algo)
        elif reference:
            one = maker(section, obs_space, action_space, batch, str(algo.device), config.experiment.seed)
            theirs = functools.partial(_block, one, batches)
        torch.set_num_threads(config.learner.torch_threads)  # the reference's maker may have set its own
        mine, sb3 = time_interleaved(functools.partial(_block, algo.update, batches), theirs, repeats, algo.device)
        case = {"config": name, "algo": config.algo, "device": str(algo.device),
                "torch_threads": torch.get_num_threads(), "batch": batch, "updates_per_block": BLOCK_UPDATES,
                "update_ms": round(1000 * statistics.median(mine) / BLOCK_UPDATES, 3)}
        if sb3:
            case["sb3_update_ms"] = round(1000 * statistics.median(sb3) / BLOCK_UPDATES, 3)
            case["ratio"] = round(case["update_ms"] / case["sb3_update_ms"], 3)
        log.info("%s", case)
        cases.append(case)
    return cases


def time_on_policy(name: str, config, steps_options: list[int], minibatch_options: list[int], repeats: int,
                   device: str, reference: bool, phases: bool = False) -> list[dict]:
    """The cases of one shipped PPO or APPO config; see the module docstring."""
    import sb3_reference

    section = dataclasses.replace(config.algorithm.for_run(config), device=device)  # its annealing schedule too
    chunk_steps = config.hub.sender.flush_steps
    obs_space, action_space, envs = _spaces(config)
    policy = make_policy(section, obs_space, action_space, envs.num_envs,
                         agent_id=0, num_agents=1, seed=config.experiment.seed, inference="torch")
    cases = []
    for steps in steps_options:
        steps = steps or config.learner.steps_per_update
        chunks_needed = math.ceil(steps / chunk_steps)
        algo = make_trainer(section, obs_space, action_space, config.experiment.seed)
        if not isinstance(algo, PPOTrainer):
            raise SystemExit(f"{name}: {config.algo}'s trainer is not a PPO-family one")
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
            theirs = (sb3_reference.ppo_update(section, obs_space, action_space, batch, minibatch,
                                               str(algo.device), config.experiment.seed) if reference else None)
            torch.set_num_threads(config.learner.torch_threads)
            mine, sb3 = time_interleaved(functools.partial(algo.update, chunks), theirs, repeats, algo.device)
            update_s = statistics.median(mine)
            steps_per_update = epochs * (batch // minibatch)
            case = {"config": name, "algo": config.algo, "device": str(algo.device),
                    "torch_threads": torch.get_num_threads(), "steps": batch, "minibatch": minibatch,
                    "minibatches": batch // minibatch, "epochs": epochs, "update_s": round(update_s, 4),
                    "epoch_ms": round(1000 * update_s / epochs, 2),
                    "minibatch_step_ms": round(1000 * update_s / steps_per_update, 3),
                    "samples_per_s": round(batch * epochs / update_s)}
            if sb3:
                case["sb3_minibatch_step_ms"] = round(1000 * statistics.median(sb3) / steps_per_update, 3)
                case["ratio"] = round(case["minibatch_step_ms"] / case["sb3_minibatch_step_ms"], 3)
            if phases:
                case.update(time_phases(algo, chunks, repeats))
            log.info("%s", case)
            cases.append(case)
    envs.close()
    return cases


METRICS_LINE = re.compile(STAMP + r"surreal_redis\.learner\.metrics: update (?P<updates>\d+) \|.*"
                          r"learner busy (?P<busy>[\d.]+|-)%?", re.MULTILINE)
"""The learner's metrics line (:meth:`surreal_redis.learner.metrics.LearnerMetrics._log_line`)."""


class LoopRate(NamedTuple):
    """A launch's learner over its steady window: from the first metrics line after an update to
    the last line (so start-up and ``learning_starts`` stay out)."""

    updates_per_s: float | None  # None: fewer than two such lines
    learner_busy: float | None  # seconds inside updates / wall seconds, the lines' windows weighted by length
    window_s: float
    updates: int


def steady_rate(learner_log: str) -> LoopRate:
    """:class:`LoopRate` from the metrics lines of a learner's log."""
    points = [(log_time(m), int(m["updates"]), None if m["busy"] == "-" else float(m["busy"]) / 100)
              for m in METRICS_LINE.finditer(learner_log)]
    points = [point for point in points if point[1] > 0]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return LoopRate(None, None, 0.0, 0)
    (t0, u0, _), (t1, u1, _) = points[0], points[-1]
    windows = [(t - before, busy) for (before, _, _), (t, _, busy) in zip(points, points[1:])]
    known = [(dt, b) for dt, b in windows if b is not None]
    busy = sum(dt * b for dt, b in known) / (t1 - t0) if len(known) == len(windows) else None
    return LoopRate((u1 - u0) / (t1 - t0), busy, t1 - t0, u1 - u0)


def loop_efficiency(launch_updates_per_s: float | None, bare_update_s: float) -> float | None:
    """A launch's updates per second over the bare update's rate (``1 / bare_update_s``)."""
    return None if launch_updates_per_s is None else launch_updates_per_s * bare_update_s


def launch_update_s(rate: LoopRate) -> float | None:
    """Seconds per update inside the launch: busy seconds per update over the steady window."""
    if rate.updates_per_s is None or rate.learner_busy is None:
        return None
    return round(rate.learner_busy / rate.updates_per_s, 5)


LOOP_OVERRIDES = ("stop.target_return=null",)
"""A loop launch runs its ``--loop`` seconds (or to the config's ``max_env_steps``) on any return."""


def time_loop(name: str, config, seconds: float, repeats: int, device: str, phases: bool,
              rounds: int = 1) -> tuple[dict, list[dict]]:
    """``rounds`` launches of shipped config ``name`` for ``seconds`` each, its bare update at the
    config's sizes (without the reference) timed before each and after the last; the loop case
    and the last bare one."""
    config_file = f"{name}.yaml"
    agents = config.agent.num_agents

    def bare_update() -> tuple[dict, float]:
        if not config.algorithm.on_policy:
            [case] = time_off_policy(name, config, [0], repeats, device, False)
            return case, case["update_ms"] / 1000
        [case] = time_on_policy(name, config, [0], [0], repeats, device, False, phases)
        return case, case["update_s"]

    bare, bare_s = bare_update()
    bares, launches = [bare_s], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="learner-loop-") as workdir:
            _, steps, _ = run_launch(config_file, agents, seconds, Path(workdir), LOOP_OVERRIDES)
            if steps is None:
                raise SystemExit(f"{name}: the launch failed (its log above)")
            learner_log = Path(workdir, launch_name(config_file, agents, LOOP_OVERRIDES), "logs", "learner.log")
            rate = steady_rate(learner_log.read_text(errors="replace"))
        bare, bare_s = bare_update()
        bares.append(bare_s)
        efficiency = loop_efficiency(rate.updates_per_s, (bares[-2] + bares[-1]) / 2)  # this machine drifts
        launches.append({"steady_window_s": round(rate.window_s, 1), "steady_updates": rate.updates,
                         "launch_updates_per_s": None if rate.updates_per_s is None else round(rate.updates_per_s, 3),
                         "learner_busy": None if rate.learner_busy is None else round(rate.learner_busy, 3),
                         "launch_update_s": launch_update_s(rate),
                         "loop_efficiency": None if efficiency is None else round(efficiency, 3)})
        log.info("loop: %s launch %d of %d: %s", name, len(launches), rounds, launches[-1])

    def median(field: str) -> float | None:
        known = [launch[field] for launch in launches if launch[field] is not None]
        return statistics.median(known) if known else None
    case = {"config": name, "algo": config.algo, "agents": agents, "launch_s": seconds, "rounds": rounds,
            **{field: median(field) for field in ("launch_updates_per_s", "learner_busy", "launch_update_s",
                                                  "loop_efficiency")},
            "bare_updates_per_s": round(1 / statistics.median(bares), 3),
            "bare_update_s": [round(b, 5) for b in bares], "launches": launches}
    log.info("loop: %s", case)
    return case, [bare]


def _counts(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        counts = [int(s) for s in text.split(",") if s]
    except ValueError:
        parser.error(f"{flag} takes comma-separated integers, got {text!r}")
    if not counts or min(counts) < 0:
        parser.error(f"{flag} needs counts >= 0, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", default=",".join(DEFAULT_CONFIGS), help=f"comma-separated: {', '.join(DEFAULT_CONFIGS)}")
    parser.add_argument("--configs", default="", help="shipped configs, comma-separated (default: per algorithm)")
    parser.add_argument("--steps", default="0", help="on-policy env steps per update, comma-separated (0: the config's)")
    parser.add_argument("--minibatch", default="0",
                        help="on-policy rows per minibatch, comma-separated (0: the config's minibatch size)")
    parser.add_argument("--batch", default="0", help="off-policy batch sizes, comma-separated (0: the config's)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, ...")
    parser.add_argument("--no-reference", action="store_true", help="time ours only (no stable-baselines3)")
    parser.add_argument("--phases", action="store_true", help="on-policy: also the update's time by phase")
    parser.add_argument("--loop", type=float, default=0.0, metavar="SECONDS",
                        help="launch each config for SECONDS, then its bare update: the loop efficiency (0: off)")
    parser.add_argument("--loop-rounds", type=int, default=1, metavar="N",
                        help="with --loop: N launches, the bare update timed between them; medians")
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args(argv)
    steps = _counts(options.steps, "--steps", parser)
    minibatches = _counts(options.minibatch, "--minibatch", parser)
    batches = _counts(options.batch, "--batch", parser)
    algos = [a for a in options.algos.split(",") if a]
    unknown = sorted(set(algos) - set(DEFAULT_CONFIGS))
    if unknown or not algos:
        parser.error(f"--algos takes {', '.join(DEFAULT_CONFIGS)}, got {options.algos!r}")
    if options.repeats < 1:
        parser.error(f"--repeats needs >= 1, got {options.repeats}")
    if options.loop < 0:
        parser.error(f"--loop needs seconds > 0 (0: off), got {options.loop}")
    if options.loop_rounds < 1:
        parser.error(f"--loop-rounds needs >= 1, got {options.loop_rounds}")
    if options.loop and max(steps + minibatches + batches) > 0:
        parser.error("--loop times each config's own sizes: leave --steps, --minibatch and --batch at 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, object] = {"cores": os.cpu_count(), "torch": torch.__version__,
                                 "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                                 "cases": [], **({"loop": []} if options.loop else {})}
    names = [n for n in options.configs.split(",") if n] or [n for a in algos for n in DEFAULT_CONFIGS[a]]
    for name in names:
        config = load_config(name)
        if config.algo not in algos:
            log.info("%s: a %s config, not in --algos %s; skipped", name, config.algo, options.algos)
            continue
        torch.set_num_threads(config.learner.torch_threads)
        device = str(resolve_device(options.device))
        if options.loop:
            loop_case, cases = time_loop(name, config, options.loop, options.repeats, device, options.phases,
                                         options.loop_rounds)
            result["loop"].append(loop_case)  # type: ignore[attr-defined]
        elif not config.algorithm.on_policy:
            cases = time_off_policy(name, config, batches, options.repeats, device, not options.no_reference)
        else:
            cases = time_on_policy(name, config, steps, minibatches, options.repeats, device, not options.no_reference,
                                   options.phases)
        result["cases"] += cases  # type: ignore[operator]
    print(json.dumps(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
