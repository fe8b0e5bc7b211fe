"""Run as a script by test_capture.py (its own process: torch._dynamo stays out of the test
process): argv[2] SAC updates (argv[3] ``sac``), DDPG updates (``ddpg``) or PPO updates (``ppo``)
eager and captured (torch.compile, the backend in argv[1]) from the same seed and data, on the
device argv[4] (default cpu; on a GPU: ``inductor 20 sac cuda``); prints one JSON line with the
largest weight and stat differences."""

from __future__ import annotations

import json
import logging
import sys

import gymnasium as gym
import numpy as np
import torch

from surreal_redis.algos.ddpg.config import DDPGConfig
from surreal_redis.algos.ddpg.trainer import DDPGTrainer
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.algos.sac.trainer import SACTrainer
from surreal_redis.chunks import TransitionBatch

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACE = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def batch(rng: np.random.Generator, size: int = 32) -> TransitionBatch:
    return TransitionBatch(obs=rng.uniform(-1, 1, (size, 3)).astype(np.float32),
                           actions=rng.uniform([-2, 0], [2, 1], (size, 2)).astype(np.float32),
                           rewards=rng.normal(size=size).astype(np.float32),
                           next_obs=rng.uniform(-1, 1, (size, 3)).astype(np.float32),
                           discounts=np.full(size, 0.99, np.float32),
                           weights=rng.uniform(0.5, 1, size).astype(np.float32), indices=np.arange(size))


def updated(algo, updates: int):
    """``algo`` after ``updates`` updates on seeded batches: (algo, their results, how far its actor moved)."""
    initial = [p.detach().clone() for p in algo.actor.parameters()]
    rng = np.random.default_rng(0)
    results = [algo.update(batch(rng)) for _ in range(updates)]
    moved = max(float((a - b.detach()).abs().max()) for a, b in zip(initial, algo.actor.parameters()))
    return algo, results, moved


def run(compile_: bool, backend: str, updates: int, device: str, **overrides):
    torch.manual_seed(3)
    config = SACConfig(actor_hidden=(16,), critic_hidden=(16,), compile=compile_, device=device, **overrides)
    return updated(SACTrainer(config, OBS_SPACE, ACTION_SPACE, seed=5, compile_backend=backend), updates)


def ppo_report(backend: str, updates: int, device: str) -> dict:
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_ppo import VARIANTS, setup  # noqa: PLC0415 - the PPO tests' envs and configs

    from surreal_redis.algos.ppo.trainer import PPOTrainer

    report = {}
    for name in ("discrete", "continuous_adapt"):
        runs = []
        for compile_ in (False, True):
            eager, _, collector = setup(name, update_epochs=2, num_minibatches=3, anneal_clip=True,
                                        total_updates=10)
            config = type(VARIANTS[name][0])(**{**eager.config.__dict__, "compile": compile_, "device": device})
            torch.manual_seed(0)
            algo = PPOTrainer(config, collector.envs.single_observation_space,
                              collector.envs.single_action_space, seed=0, compile_backend=backend)
            algo.load_state_dict(eager.state_dict())
            initial = [p.detach().clone() for p in algo.net.parameters()]
            chunks = collector.collect(12)
            stats = [algo.update(chunks) for _ in range(updates)]
            moved = max(float((a - b.detach()).abs().max()) for a, b in zip(initial, algo.net.parameters()))
            runs.append((algo, stats, moved))
        (eager, eager_stats, moved), (captured, captured_stats, _) = runs
        report[name] = {
            "weights": max(float((a - b).abs().max()) for a, b in zip(eager.net.state_dict().values(),
                                                                   captured.net.state_dict().values())),
            "stats": max(abs(a[k] - b[k]) for a, b in zip(eager_stats, captured_stats) for k in a),
            "same_keys": all(a.keys() == b.keys() for a, b in zip(eager_stats, captured_stats)),
            "active": captured._capture.active, "moved": moved}
    return report


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    backend, updates = sys.argv[1], int(sys.argv[2])
    algo, device = (sys.argv[3:] + ["sac", "cpu"][len(sys.argv[3:]):])[:2]
    report = {"ppo": ppo_report, "ddpg": ddpg_report}.get(algo, sac_report)(backend, updates, device)
    from torch._dynamo.utils import counters  # loaded by the captured runs

    report["graphs"] = counters["stats"]["unique_graphs"]
    print(json.dumps(report))


def sac_report(backend: str, updates: int, device: str) -> dict:
    report = {}
    for name, overrides in (("autotune", {}), ("fixed_alpha", {"autotune": False, "policy_frequency": 1})):
        eager, eager_results, moved = run(False, backend, updates, device, **overrides)
        captured, captured_results, _ = run(True, backend, updates, device, **overrides)
        weights = max(float((a - b).abs().max()) for a, b in zip(
            [*eager.state_dict()["actor"].values(), *eager.state_dict()["critic"].values(),
             *eager.state_dict()["critic_target"].values(), eager.log_alpha.detach()],
            [*captured.state_dict()["actor"].values(), *captured.state_dict()["critic"].values(),
             *captured.state_dict()["critic_target"].values(), captured.log_alpha.detach()]))
        stats = max(abs(a[0][k] - b[0][k]) for a, b in zip(eager_results, captured_results) for k in a[0])
        same_keys = all(a[0].keys() == b[0].keys() for a, b in zip(eager_results, captured_results))
        td = max(float(np.abs(a[1] - b[1]).max()) for a, b in zip(eager_results, captured_results))
        report[name] = {"weights": weights, "stats": stats, "td": td, "same_keys": same_keys,
                        "active": captured._capture.active, "moved": moved}
    return report


def ddpg_run(compile_: bool, backend: str, updates: int, device: str, **overrides):
    torch.manual_seed(3)
    config = DDPGConfig(actor_hidden=(16,), critic_hidden=(16,), compile=compile_, device=device, **overrides)
    return updated(DDPGTrainer(config, OBS_SPACE, ACTION_SPACE, compile_backend=backend), updates)


def ddpg_report(backend: str, updates: int, device: str) -> dict:
    report = {}
    for name, overrides in (("delayed_soft", {}),
                            ("clipped_hard", {"policy_frequency": 1, "target_update": "hard", "hard_update_every": 2,
                                              "actor_max_grad_norm": 0.1, "critic_max_grad_norm": 0.1,
                                              "critic_l2": 0.01})):
        (eager, eager_results, moved), (captured, captured_results, _) = (
            ddpg_run(compile_, backend, updates, device, **overrides) for compile_ in (False, True))
        states = [[value for key in ("actor", "critic", "actor_target", "critic_target")
                   for value in algo.state_dict()[key].values()] for algo in (eager, captured)]
        report[name] = {
            "weights": max(float((a - b).abs().max()) for a, b in zip(*states)),
            "stats": max(abs(a[0][k] - b[0][k]) for a, b in zip(eager_results, captured_results) for k in a[0]),
            "td": max(float(np.abs(a[1] - b[1]).max()) for a, b in zip(eager_results, captured_results)),
            "same_keys": all(a[0].keys() == b[0].keys() for a, b in zip(eager_results, captured_results)),
            "active": captured._capture.active, "moved": moved}
    return report


if __name__ == "__main__":
    main()
