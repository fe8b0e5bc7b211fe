"""Env-family benchmark: ``python bench/envs.py [--quick] [--families atari,mujoco,...]``.

Per family, on one core (one process, one torch thread), with N envs in one vector env and
random actions (the policy's cost is measured apart, it is not the hub's):

- ``plain_sps``: env steps/s of a bare ``step_vector_env`` loop;
- ``hub_sps``: the same loop with every step going to an ``ExperienceSender`` on a real
  redis-server (embedded, unix socket), as an agent does; ``hub_overhead`` = 1 - hub/plain
  (target <= 10% on Atari and MuJoCo); plain and hub rounds alternate and medians are taken;
  the ``*_cpu`` twins count this process's CPU time instead of wall time, which other load on
  shared cores hardly moves (waits on Redis round trips are then not counted);
- ``policy_sps``: hub loop with the family's PPO policy acting on CPU (CNN for pixels);
- ``redis_bytes_per_transition``: Redis memory growth (streams + observation blobs) per env step,
  against ``naive_bytes_per_transition`` (obs + next obs + action + reward + flags stored raw per
  transition, as a replay without dedup would), and the ratio;
- ``frames_per_s_per_core`` (Atari: emulator frames = agent steps x frame skip) against
  Sample Factory's ~4k frames/s per core (arXiv 2006.11751, Table 1: 135,893 FPS on 36 cores).

Progress goes to stderr; the last line of stdout is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from surreal_redis.agent import with_final_rows
from surreal_redis.algos.ppo.policy import PPOConfig, PPOPolicy
from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis
from surreal_redis.envs import AtariConfig, EnvConfig, PixelConfig, make_vector_env, step_vector_env
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.runtime import setup_logging
from surreal_redis.trees import tree_leaves

log = logging.getLogger("bench.envs")

SAMPLE_FACTORY_FRAMES_PER_CORE = 135_893 / 36

FAMILIES: dict[str, tuple[str, EnvConfig, int, PPOConfig]] = {
    # name: (module that must be installed, env config, frames per agent step, policy config)
    "atari": ("ale_py", EnvConfig(env_id="pong", frame_stack=4, num_envs=8,
                                  atari=AtariConfig(repeat_action_probability=0.0)), 4, PPOConfig(hidden_sizes=())),
    "mujoco": ("mujoco", EnvConfig(env_id="HalfCheetah-v5", num_envs=8), 1, PPOConfig(normalize_obs=True)),
    "dmc": ("dm_control", EnvConfig(env_id="dm_control/cheetah-run-v0", num_envs=8), 1, PPOConfig(normalize_obs=True)),
    "dmc_pixels": ("dm_control", EnvConfig(env_id="dm_control/cheetah-run-v0", num_envs=4, frame_stack=3,
                                           pixels=PixelConfig(enabled=True, size=84)), 1, PPOConfig(hidden_sizes=())),
    "robosuite": ("robosuite", EnvConfig(env_id="robosuite/Lift", num_envs=4), 1, PPOConfig(normalize_obs=True)),
}


def _loop(envs, steps: int, act: Callable, sender: ExperienceSender | None, obs) -> tuple[float, float, object]:
    """``steps`` vector steps; returns env steps per second of wall time and of this process's CPU
    time (other work on shared cores slows the first, hardly the second), and the last obs."""
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        actions, extras, version = act(obs)
        step = step_vector_env(envs, actions)
        if sender is not None:
            sender.add(obs, actions, step.rewards, step.terminated, step.truncated,
                       with_final_rows(step.obs, step.final_obs), extras, version)
        obs = step.obs
    done = steps * envs.num_envs
    return done / (time.perf_counter() - start), done / max(time.process_time() - cpu_start, 1e-9), obs


def _naive_bytes(obs, actions: np.ndarray) -> int:
    """One transition stored raw: obs and next obs (every frame of a stack), action, reward, flags."""
    per_env_obs = sum(leaf[0].nbytes for leaf in tree_leaves(obs))
    return 2 * per_env_obs + actions[0].nbytes + 4 + 2


def bench_family(name: str, config: EnvConfig, frames_per_step: int, policy_config: PPOConfig, steps: int,
                 rounds: int, server: EmbeddedRedis) -> dict[str, float]:
    envs = make_vector_env(config, seed=0)
    client = connect(server.url)
    client.flushall()
    sender = ExperienceSender(client, SenderConfig(), f"bench-{name.replace('_', '-')}", 0, 1)
    space = envs.action_space
    space.seed(0)

    def random_act(obs):
        return space.sample(), {}, 0

    obs, _ = envs.reset(seed=0)
    _, _, obs = _loop(envs, max(1, steps // 10), random_act, sender, obs)  # warm up (JIT, caches, first blobs)
    memory_before = client.info("memory")["used_memory"]
    sent_before = sender.stats().steps
    plain, hub, plain_cpu, hub_cpu = [], [], [], []
    for _ in range(rounds):
        sps, cpu_sps, obs = _loop(envs, steps, random_act, None, obs)
        plain.append(sps)
        plain_cpu.append(cpu_sps)
        sps, cpu_sps, obs = _loop(envs, steps, random_act, sender, obs)
        hub.append(sps)
        hub_cpu.append(cpu_sps)
    sender.flush(obs)
    transitions = sender.stats().steps - sent_before
    redis_bytes = (client.info("memory")["used_memory"] - memory_before) / max(1, transitions)
    policy = PPOPolicy(policy_config, envs.single_observation_space, envs.single_action_space,
                       num_envs=envs.num_envs, seed=0)

    def policy_act(obs):
        out = policy.act(obs)
        return out.actions, out.extras, 0

    # its chunks carry the policy's extras: a sender of their own (a second agent)
    policy_sender = ExperienceSender(client, SenderConfig(), f"bench-{name.replace('_', '-')}", 1, 1)
    policy_sps, _, obs = _loop(envs, max(1, steps // 2), policy_act, policy_sender, obs)
    policy_sender.flush(obs)
    naive = _naive_bytes(obs, np.asarray(space.sample()))
    plain_sps, hub_sps = statistics.median(plain), statistics.median(hub)
    envs.close()
    client.close()
    result = {
        "num_envs": envs.num_envs,
        "plain_sps": round(plain_sps, 1),
        "hub_sps": round(hub_sps, 1),
        "hub_overhead": round(1.0 - hub_sps / plain_sps, 4),
        "plain_sps_cpu": round(statistics.median(plain_cpu), 1),
        "hub_sps_cpu": round(statistics.median(hub_cpu), 1),
        "hub_overhead_cpu": round(1.0 - statistics.median(hub_cpu) / statistics.median(plain_cpu), 4),
        "policy_sps": round(policy_sps, 1),
        "redis_bytes_per_transition": round(redis_bytes, 1),
        "naive_bytes_per_transition": naive,
        "naive_over_redis": round(naive / max(redis_bytes, 1.0), 2),
        "frames_per_s_per_core": round(hub_sps * frames_per_step, 1),
        "frames_vs_sample_factory": round(hub_sps * frames_per_step / SAMPLE_FACTORY_FRAMES_PER_CORE, 3),
    }
    log.info("%s: %s", name, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute in all)")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    args = parser.parse_args()
    setup_logging("INFO")
    torch.set_num_threads(1)
    names = [n for n in args.families.split(",") if n]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    steps, rounds = (100, 3) if args.quick else (400, 5)
    results: dict[str, object] = {"sample_factory_frames_per_core": round(SAMPLE_FACTORY_FRAMES_PER_CORE)}
    server = EmbeddedRedis(maxmemory="2gb").start()
    try:
        for name in names:
            module, config, frames, policy_config = FAMILIES[name]
            if importlib.util.find_spec(module) is None:
                log.info("%s: skipped (%s is not installed)", name, module)
                results[name] = "not installed"
                continue
            family_steps = steps // 4 if name in ("dmc_pixels", "robosuite") else steps
            results[name] = bench_family(name, config, frames, policy_config, family_steps, rounds, server)
    finally:
        server.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
