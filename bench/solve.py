"""Time to solve, end to end: ``surreal-redis launch`` of the shipped configs against
stable-baselines3 (default settings) on the same machine, in the same run.

    python bench/solve.py [--budget-s 900] [--only ppo|ddpg] [--skip-sb3]

- PPO CartPole-v1 (2 and 4 agents): wall seconds from ``launch`` until the learner stops because
  the mean of the last 100 training-episode returns reached 475; SB3 PPO: until its
  ``ep_info_buffer`` (the last 100 training episodes) has a mean >= 475.
- DDPG Pendulum-v1: ours stops when a complete eval (20 deterministic episodes) averages >= -200;
  SB3 DDPG (no action noise by default, so its training episodes are deterministic too): when
  the mean of its last 20 training episodes is >= -200.

Our wall time includes everything a user waits for: process start-up, the embedded Redis and
MLflow. A case that misses the target within the budget reports null. The last line of output is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.solve")

STOPPED = re.compile(r"learner stopped \((?P<reason>.*)\): (?P<updates>\d+) updates, (?P<steps>\d+) env steps")


def run_launch(config: str, agents: int, budget_s: float, workdir: Path) -> tuple[float | None, int | None]:
    """Wall seconds and env steps to the target, or (None, steps) when it was not reached."""
    name = f"{Path(config).stem}_{agents}a"
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", str(ROOT / "configs" / config),
            "--agents", str(agents), "-o", f"experiment.root={workdir}", "-o", f"experiment.name={name}",
            "-o", f"stop.max_seconds={budget_s}"]
    started = time.monotonic()
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=budget_s + 300)
    wall = time.monotonic() - started
    learner_log = (workdir / name / "logs" / "learner.log").read_text(errors="replace")
    match = STOPPED.search(learner_log)
    if done.returncode != 0 or match is None:
        log.error("%s with %d agents failed (exit %d):\n%s", config, agents, done.returncode, done.stderr[-3000:])
        return None, None
    steps = int(match.group("steps"))
    reached = "target_return" in match.group("reason")
    log.info("%s, %d agents: %s after %.0fs, %d env steps", config, agents,
             "solved" if reached else f"NOT solved ({match.group('reason')})", wall, steps)
    return (wall if reached else None), steps


def run_sb3(algo: str, budget_s: float) -> tuple[float | None, int | None]:
    try:
        import gymnasium as gym
        import torch
        from stable_baselines3 import DDPG, PPO
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError:
        log.warning("stable-baselines3 is not installed (pip install -e '.[bench]'): skipping SB3 %s", algo)
        return None, None
    import numpy as np

    torch.set_num_threads(1)  # same as our learner (learner.torch_threads)
    target, window, env_id = (475.0, 100, "CartPole-v1") if algo == "ppo" else (-200.0, 20, "Pendulum-v1")

    class StopAtTarget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.solved_at: float | None = None
            self.started = time.monotonic()

        def _on_step(self) -> bool:
            episodes = [info["r"] for info in list(self.model.ep_info_buffer)[-window:]]
            if len(episodes) >= window and float(np.mean(episodes)) >= target:
                self.solved_at = time.monotonic() - self.started
                return False
            return time.monotonic() - self.started < budget_s

    callback = StopAtTarget()
    model = PPO("MlpPolicy", gym.make(env_id), seed=1) if algo == "ppo" else DDPG("MlpPolicy", gym.make(env_id), seed=1)
    model.learn(total_timesteps=10_000_000, callback=callback)
    log.info("SB3 %s on %s: %s after %d steps", algo.upper(), env_id,
             f"solved in {callback.solved_at:.0f}s" if callback.solved_at else "NOT solved", model.num_timesteps)
    return callback.solved_at, model.num_timesteps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=900.0, help="per case")
    parser.add_argument("--only", choices=["ppo", "ddpg"], default=None)
    parser.add_argument("--skip-sb3", action="store_true")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, float | int | None] = {}
    with tempfile.TemporaryDirectory(prefix="surreal-solve-") as tmp:
        workdir = Path(tmp)
        if options.only in (None, "ppo"):
            result["ppo_cartpole_s"], result["ppo_cartpole_steps"] = run_launch("ppo_cartpole.yaml", 2, options.budget_s, workdir)
            result["ppo_cartpole_4_agents_s"], result["ppo_cartpole_4_agents_steps"] = run_launch(
                "ppo_cartpole.yaml", 4, options.budget_s, workdir)
            if not options.skip_sb3:
                result["sb3_ppo_cartpole_s"], result["sb3_ppo_cartpole_steps"] = run_sb3("ppo", options.budget_s)
        if options.only in (None, "ddpg"):
            result["ddpg_pendulum_s"], result["ddpg_pendulum_steps"] = run_launch("ddpg_pendulum.yaml", 2, options.budget_s, workdir)
            if not options.skip_sb3:
                result["sb3_ddpg_pendulum_s"], result["sb3_ddpg_pendulum_steps"] = run_sb3("ddpg", options.budget_s)
    for ours, theirs in (("ppo_cartpole_s", "sb3_ppo_cartpole_s"), ("ddpg_pendulum_s", "sb3_ddpg_pendulum_s")):
        if result.get(ours) and result.get(theirs):
            result[ours.replace("_s", "_time_ratio_vs_sb3")] = result[ours] / result[theirs]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
