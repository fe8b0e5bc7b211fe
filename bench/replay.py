"""Replay benchmark: ``python bench/replay.py [--quick]``.

Measures, for cartpole-sized (4 x float32) and Atari-sized (4 stacked 84x84 uint8 frames)
transitions: insert throughput (transitions/s, batches of 64), ``sample(256)`` throughput
(batches/s), ``update_priorities`` throughput and storage bytes per transition, for UniformReplay,
PrioritizedReplay (with its default kernels, and with the numpy kernels as ``prioritized_numpy``
when numba is installed; the one-time kernel load or compile is timed apart, as
``prioritized_first_use_s``) and, when stable-baselines3 is installed (the ``bench`` extra), SB3's
ReplayBuffer in the same run (null otherwise). SB3 gets each batch of 64 as one ``add`` with
``n_envs=64`` and stacked ``[64, 4, 84, 84]`` observations; its ``sample`` includes its conversion
to torch CPU tensors, which is part of its API.

Rates are per second of this process's CPU time (``time.process_time``): every measured call runs
on one thread (SB3 too: torch gets one thread), and on a machine shared with other work CPU time
is much steadier than wall-clock time, which counts the time other processes held the core.

The Atari stream is one env's frame stack: consecutive observations share 3 of 4 frames, as in a
real game, and every frame is distinct. Progress goes to stderr; the last line of stdout is one
JSON object with the numbers and ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from surreal_redis.replay.prioritized import PrioritizedReplay, PrioritizedReplayConfig
from surreal_redis.replay.segment_tree import NUMBA_INSTALLED
from surreal_redis.replay.uniform import UniformReplay, UniformReplayConfig
from surreal_redis.runtime import setup_logging

logger = logging.getLogger("bench.replay")

CLOCK = time.process_time  # see the module docstring
CHUNK = 64  # transitions per insert call
BATCH = 256  # transitions per sample call
K = 4  # stacked frames


def make_stream(kind: str, num: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``num`` transitions of one env: for Atari, ``frames`` [num + K, 84, 84]; else ``states`` [num + 1, 4]."""
    stream = {"actions": rng.integers(0, 6, size=num), "rewards": rng.normal(size=num).astype(np.float32)}
    if kind == "atari":
        base = rng.integers(0, 256, size=(256, 84, 84), dtype=np.uint8)
        frames = base[np.arange(num + K) % 256]
        frames[:, 0, :8] = np.arange(num + K, dtype=np.uint64)[:, None].view(np.uint8).reshape(-1, 8)  # distinct
        stream["frames"] = frames
    else:
        stream["states"] = rng.normal(size=(num + 1, 4)).astype(np.float32)
    return stream


def our_chunk(kind: str, stream: dict[str, np.ndarray], start: int) -> tuple:
    """Arguments of ``replay.insert`` for transitions ``[start, start + CHUNK)``."""
    end = start + CHUNK
    if kind == "atari":
        frames = stream["frames"]
        obs = tuple(frames[start + k : end + k] for k in range(K))
        next_obs = tuple(frames[start + k + 1 : end + k + 1] for k in range(K))
    else:
        obs, next_obs = stream["states"][start:end], stream["states"][start + 1 : end + 1]
    return (obs, stream["actions"][start:end], stream["rewards"][start:end], next_obs,
            np.full(CHUNK, 0.99, np.float32))


def sb3_chunk(kind: str, stream: dict[str, np.ndarray], start: int) -> tuple:
    """Arguments of SB3's ``ReplayBuffer.add`` (n_envs=CHUNK) for the same transitions."""
    obs, actions, rewards, next_obs, _ = our_chunk(kind, stream, start)
    if kind == "atari":
        obs, next_obs = np.stack(obs, axis=1), np.stack(next_obs, axis=1)
    return obs, next_obs, actions[:, None], rewards, np.zeros(CHUNK, bool), [{}] * CHUNK


def timed(fn: Callable[[], Any], repeats: int, rounds: int = 5) -> float:
    """Calls per second of ``fn``: the best of ``rounds`` rounds of ``repeats`` calls, so other
    processes on a shared machine disturb the result less (as ``timeit`` recommends)."""
    best = float("inf")
    for _ in range(rounds):
        start = CLOCK()
        for _ in range(repeats):
            fn()
        best = min(best, CLOCK() - start)
    return repeats / best


def fill_rate(insert: Callable[..., Any], make_args: Callable[[int], tuple], num: int) -> float:
    """Insert ``num`` transitions in chunks; transitions per second, counting only insert calls."""
    spent = 0.0
    for start in range(0, num - CHUNK + 1, CHUNK):
        args = make_args(start)
        t0 = CLOCK()
        insert(*args)
        spent += CLOCK() - t0
    return (num // CHUNK) * CHUNK / spent


def bench_ours(kind: str, replay: UniformReplay, stream: dict[str, np.ndarray], num: int,
               sample_repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    result = {"insert_per_s": fill_rate(replay.insert, lambda s: our_chunk(kind, stream, s), num),
              "sample256_per_s": timed(lambda: replay.sample(BATCH, rng), sample_repeats),
              "bytes_per_transition": replay.nbytes / len(replay)}
    if isinstance(replay, PrioritizedReplay):
        indices = replay.sample(BATCH, rng).indices
        td = rng.normal(size=BATCH)
        result["update_priorities256_per_s"] = timed(lambda: replay.update_priorities(indices, td), sample_repeats)
    return result


def first_use_s() -> float:
    """Seconds the first insert, sample and priority update of a PrioritizedReplay take (numba
    import and kernel compile or cache load), so that the rates above leave them out."""
    start = time.perf_counter()
    replay = PrioritizedReplay(PrioritizedReplayConfig(capacity=CHUNK))
    obs = np.zeros((CHUNK, 4), np.float32)
    replay.insert(obs, np.zeros(CHUNK, np.int64), np.zeros(CHUNK, np.float32), obs, np.ones(CHUNK, np.float32))
    replay.update_priorities(replay.sample(BATCH, np.random.default_rng(0)).indices, np.ones(BATCH))
    return time.perf_counter() - start


def bench_sb3(kind: str, stream: dict[str, np.ndarray], num: int, sample_repeats: int) -> dict[str, float] | None:
    if importlib.util.find_spec("stable_baselines3") is None:
        return None
    import torch
    from stable_baselines3.common.buffers import ReplayBuffer

    torch.set_num_threads(1)

    if kind == "atari":
        obs_space = gym.spaces.Box(0, 255, (K, 84, 84), np.uint8)
    else:
        obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    buffer = ReplayBuffer(num, obs_space, gym.spaces.Discrete(6), device="cpu", n_envs=CHUNK)
    insert_rate = fill_rate(buffer.add, lambda s: sb3_chunk(kind, stream, s), num)
    stored = [buffer.observations, buffer.next_observations, buffer.actions, buffer.rewards, buffer.dones,
              buffer.timeouts]
    return {"insert_per_s": insert_rate,
            "sample256_per_s": timed(lambda: buffer.sample(BATCH), sample_repeats),
            "bytes_per_transition": sum(a.nbytes for a in stored) / (buffer.buffer_size * CHUNK)}


def ratio(a: dict[str, float] | None, b: dict[str, float] | None, key: str) -> float | None:
    return None if a is None or b is None else a[key] / b[key]


def run(quick: bool) -> dict[str, Any]:
    sizes = {"cartpole": 20_000 if quick else 200_000, "atari": 4_000 if quick else 20_000}
    sample_repeats = 100 if quick else 500
    results: dict[str, Any] = {"prioritized_first_use_s": first_use_s()}
    ratios: dict[str, float | None] = {}
    for kind, num in sizes.items():
        stream = make_stream(kind, num, np.random.default_rng(0))
        logger.info("%s: %d transitions, sample(%d) x %d", kind, num, BATCH, sample_repeats)
        uniform = bench_ours(kind, UniformReplay(UniformReplayConfig(capacity=num)), stream, num, sample_repeats)
        prioritized = bench_ours(kind, PrioritizedReplay(PrioritizedReplayConfig(capacity=num)), stream, num,
                                 sample_repeats)
        prioritized_numpy = None
        if NUMBA_INSTALLED:
            prioritized_numpy = bench_ours(kind, PrioritizedReplay(PrioritizedReplayConfig(capacity=num, kernels="numpy")),
                                           stream, num, sample_repeats)
        sb3 = bench_sb3(kind, stream, num, sample_repeats)
        results[kind] = {"capacity": num, "uniform": uniform, "prioritized": prioritized,
                         "prioritized_numpy": prioritized_numpy, "sb3": sb3}
        for name, value in results[kind].items():
            logger.info("%s %s: %s", kind, name, value)
        ratios[f"{kind}_prioritized_vs_uniform_sample"] = ratio(prioritized, uniform, "sample256_per_s")
        ratios[f"{kind}_prioritized_vs_uniform_insert"] = ratio(prioritized, uniform, "insert_per_s")
        for key in ("sample256_per_s", "update_priorities256_per_s", "insert_per_s"):
            ratios[f"{kind}_prioritized_compiled_vs_numpy_{key.split('_per_s')[0]}"] = ratio(
                prioritized, prioritized_numpy, key)
        ratios[f"{kind}_uniform_vs_sb3_sample"] = ratio(uniform, sb3, "sample256_per_s")
        ratios[f"{kind}_uniform_vs_sb3_insert"] = ratio(uniform, sb3, "insert_per_s")
        ratios[f"{kind}_sb3_vs_uniform_bytes"] = ratio(sb3, uniform, "bytes_per_transition")
    results["ratios"] = ratios
    results["target_prioritized_sample_ge_half_uniform"] = all(
        ratios[f"{kind}_prioritized_vs_uniform_sample"] >= 0.5 for kind in sizes)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a few seconds")
    args = parser.parse_args()
    setup_logging("INFO")
    print(json.dumps(run(args.quick)))


if __name__ == "__main__":
    main()
