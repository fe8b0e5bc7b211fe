"""Wall-clock learning race on PPO HalfCheetah-v5: ``python bench/halfcheetah.py [--budget-s 600]
[--agents N] [--skip-sb3] [-o key=value ...]``.

Both sides get the same wall-clock budget, as whole processes (start-up and imports count):

- ours: ``surreal-redis launch configs/ppo_halfcheetah.yaml`` with ``stop.max_seconds`` = budget
  (its clock starts with the learner, so the launch's start-up comes on top: ``wall_s`` says how
  much); scores from the launch summary: the mean of the last ``--window`` training episodes (raw
  rewards) and the last eval (deterministic, ``eval.episodes``, at most ``eval.every_s`` old);
- stable-baselines3 PPO with rl-baselines3-zoo's MuJoCo settings (``hyperparams/ppo.yml``,
  HalfCheetah-v4 entry, here on v5): VecNormalize of observations and rewards (gamma 0.98),
  1 env, MlpPolicy pi/vf [256, 256] ReLU, log_std_init -2, no orthogonal init, n_steps 512,
  batch 64, 20 epochs, lr 2.0633e-05, gamma 0.98, gae_lambda 0.92, clip 0.1, ent 0.000401762,
  vf 0.58096, max_grad_norm 0.8; one torch thread (as our learner). It trains until the budget
  (counted from its interpreter's start) runs out; scores: the mean of its last ``--window``
  training episodes (Monitor, raw rewards) and ``--eval-episodes`` deterministic episodes
  afterwards (normalization frozen; not counted in the budget).

Target: ours >= SB3 on both. Training means lag the policy (its noise, and a window that reaches
back), deterministic evals do not, so ``eval_ours_minus_sb3`` is the headline. The last line of
stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROCESS_STARTED = time.monotonic()  # the SB3 run's clock starts with its interpreter
ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.halfcheetah")

SUMMARY = re.compile(r"(?P<steps>\d+) env steps, (?P<updates>\d+) updates, mean return (?P<mean>\S+), "
                     r"last eval (?P<eval>\S+)")

ZOO_HALFCHEETAH = dict(n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                       clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096)


def _number(text: str) -> float | None:
    return None if text.strip(",") == "-" else float(text.strip(","))


def run_ours(budget_s: float, window: int, agents: int | None, overrides: list[str], workdir: Path) -> dict:
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", str(ROOT / "configs" / "ppo_halfcheetah.yaml"),
            "-o", f"experiment.root={workdir}", "-o", f"stop.max_seconds={budget_s}", "-o", f"stop.return_window={window}"]
    if agents is not None:
        args += ["--agents", str(agents)]
    for override in overrides:
        args += ["-o", override]
    started = time.monotonic()
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=budget_s + 300)
    wall = time.monotonic() - started
    summary = SUMMARY.search(done.stderr)
    if done.returncode != 0 or summary is None:
        raise RuntimeError(f"launch exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = {"wall_s": round(wall, 1), "env_steps": int(summary["steps"]), "updates": int(summary["updates"]),
              "train_return": _number(summary["mean"]), "eval_return": _number(summary["eval"])}
    log.info("ours: %s", result)
    return result


def sb3_case(budget_s: float, window: int, eval_episodes: int, started: float) -> dict:
    """SB3 PPO with the zoo's settings until ``budget_s`` seconds after ``started``."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)  # same as our learner (learner.torch_threads)

    class Budget(BaseCallback):
        def _on_step(self) -> bool:
            return time.monotonic() - started < budget_s

    env = VecNormalize(make_vec_env("HalfCheetah-v5", n_envs=1, seed=1), gamma=ZOO_HALFCHEETAH["gamma"])
    policy_kwargs = dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                         net_arch=dict(pi=[256, 256], vf=[256, 256]))
    model = PPO("MlpPolicy", env, seed=1, policy_kwargs=policy_kwargs, **ZOO_HALFCHEETAH)
    model.learn(total_timesteps=1_000_000, callback=Budget())  # the zoo's n_timesteps
    wall = time.monotonic() - started
    episodes = [info["r"] for info in list(model.ep_info_buffer)[-window:]]
    env.training, env.norm_reward = False, False
    eval_env = gym.make("HalfCheetah-v5")
    returns = []
    for episode in range(eval_episodes):
        obs, _ = eval_env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(env.normalize_obs(obs[None]), deterministic=True)
            obs, reward, terminated, truncated, _ = eval_env.step(action[0])
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return {"wall_s": round(wall, 1), "env_steps": model.num_timesteps,
            "train_return": float(np.mean(episodes)) if episodes else None,
            "eval_return": float(np.mean(returns)) if returns else None}


def run_sb3(budget_s: float, window: int, eval_episodes: int) -> dict | None:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        log.warning("stable-baselines3 is not installed (pip install -e '.[bench]'): skipping SB3")
        return None
    args = [sys.executable, __file__, "--sb3-case", "--budget-s", str(budget_s), "--window", str(window),
            "--eval-episodes", str(eval_episodes)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=budget_s + 600)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 run exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    log.info("SB3 (zoo settings): %s", result)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall seconds for each side")
    parser.add_argument("--agents", type=int, default=None, help="agents for ours (default: the config's)")
    parser.add_argument("--window", type=int, default=10, help="training episodes averaged on each side")
    parser.add_argument("--eval-episodes", type=int, default=5, help="deterministic episodes after SB3's budget")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("-o", "--override", action="append", default=[], help="config override for our launch")
    parser.add_argument("--sb3-case", action="store_true", help=argparse.SUPPRESS)  # internal: the SB3 process
    options = parser.parse_args(argv)
    if options.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {options.budget_s}")
    if options.agents is not None and options.agents < 1:
        parser.error(f"--agents must be >= 1, got {options.agents}")
    if options.window < 1:
        parser.error(f"--window must be >= 1, got {options.window}")
    if options.eval_episodes < 1:
        parser.error(f"--eval-episodes must be >= 1, got {options.eval_episodes}")
    return options


def main(argv: list[str] | None = None) -> dict:
    options = parse_args(argv)
    if options.sb3_case:
        result = sb3_case(options.budget_s, options.window, options.eval_episodes, PROCESS_STARTED)
        print(json.dumps(result))
        return result
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, object] = {"cores": os.cpu_count(), "budget_s": options.budget_s}
    with tempfile.TemporaryDirectory(prefix="surreal-halfcheetah-") as tmp:
        result["ours"] = run_ours(options.budget_s, options.window, options.agents, options.override, Path(tmp))
    if not options.skip_sb3:
        result["sb3_zoo"] = run_sb3(options.budget_s, options.window, options.eval_episodes)
    ours, theirs = result.get("ours"), result.get("sb3_zoo")
    if isinstance(ours, dict) and isinstance(theirs, dict):
        # returns can be negative early on: differences, not ratios
        for score in ("eval_return", "train_return"):
            if ours[score] is not None and theirs[score] is not None:
                result[f"{score.split('_')[0]}_ours_minus_sb3"] = round(ours[score] - theirs[score], 1)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
