"""Time to solve, end to end: ``surreal-redis launch`` of the shipped configs against
stable-baselines3, with rl-baselines3-zoo's tuned settings and with its defaults, on the same
machine, in the same run.

    python bench/solve.py [--budget-s 900] [--only ppo|ddpg] [--skip-sb3]

- PPO CartPole-v1 (2 and 4 agents): wall seconds from ``launch`` until the learner stops because
  the mean of the last 100 training-episode returns reached 475; SB3 PPO: until its
  ``ep_info_buffer`` (the last 100 training episodes) has a mean >= 475.
- DDPG Pendulum-v1: ours stops when a complete eval (20 deterministic episodes) averages >= -200;
  SB3 DDPG (no action noise by default, so its training episodes are deterministic too): when
  the mean of its last 20 training episodes is >= -200.

Both wall times are whole processes, as a user waits for them: ours from ``launch`` (process
start-up, the embedded Redis, MLflow) and SB3's from its interpreter's start (imports included). A case that misses the target within the budget reports null. The last line of output is
one JSON object. Ours is also split, from the learner's log: ``*_startup_s`` from ``launch`` to the
learner's first update, ``*_shutdown_s`` from the learner's stop (target reached) to ``launch``'s exit.
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
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

PROCESS_STARTED = time.monotonic()  # an SB3 case's clock starts with its interpreter
ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.solve")

STOPPED = re.compile(r"learner stopped \((?P<reason>.*)\): (?P<updates>\d+) updates, (?P<steps>\d+) env steps")
STAMP = r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"  # runtime.setup_logging's format
FIRST_UPDATE = re.compile(STAMP + "first update done", re.MULTILINE)
STOPPING = re.compile(STAMP + "surreal_redis.runtime: stopping: ", re.MULTILINE)


class Phases(NamedTuple):
    """Seconds from ``launch`` to the learner's first update, and from its stop to ``launch``'s exit."""

    startup_s: float | None
    shutdown_s: float | None


def phases(learner_log: str, started: float, ended: float) -> Phases:
    """From the learner log's local-time stamps (ms) and the launch's ``time.time()`` bounds."""
    def at(pattern: re.Pattern) -> float | None:
        match = pattern.search(learner_log)
        return datetime.strptime(match.group("time"), "%Y-%m-%d %H:%M:%S,%f").timestamp() if match else None

    first, stop = at(FIRST_UPDATE), at(STOPPING)
    return Phases(None if first is None else first - started, None if stop is None else ended - stop)


def run_launch(config: str, agents: int, budget_s: float, workdir: Path) -> tuple[float | None, int | None, Phases]:
    """Wall seconds and env steps to the target ((None, steps) when it was not reached), and the phases."""
    name = f"{Path(config).stem}_{agents}a"
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", str(ROOT / "configs" / config),
            "--agents", str(agents), "-o", f"experiment.root={workdir}", "-o", f"experiment.name={name}",
            "-o", f"stop.max_seconds={budget_s}"]
    started, clock = time.monotonic(), time.time()
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=budget_s + 300)
    wall = time.monotonic() - started
    learner_log = (workdir / name / "logs" / "learner.log").read_text(errors="replace")
    split = phases(learner_log, clock, clock + wall)
    match = STOPPED.search(learner_log)
    if done.returncode != 0 or match is None:
        log.error("%s with %d agents failed (exit %d):\n%s", config, agents, done.returncode, done.stderr[-3000:])
        return None, None, split
    steps = int(match.group("steps"))
    reached = "target_return" in match.group("reason")
    log.info("%s, %d agents: %s after %.0fs, %d env steps (start-up %s s, shutdown %s s)", config, agents,
             "solved" if reached else f"NOT solved ({match.group('reason')})", wall, steps,
             *(f"{value:.1f}" if value is not None else "?" for value in split))
    return (wall if reached else None), steps, split


# rl-baselines3-zoo's tuned settings (hyperparams/ppo.yml CartPole-v1, hyperparams/ddpg.yml Pendulum-v1).
ZOO = {
    "ppo": dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate="lin_0.001", clip_range="lin_0.2"),
    "ddpg": dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, noise_std=0.1, gradient_steps=1,
                 train_freq=1, learning_rate=1e-3, net_arch=[400, 300]),
}


def _linear(start: float):
    return lambda progress_remaining: progress_remaining * start


def sb3_case(algo: str, settings: str, budget_s: float, started: float) -> dict:
    """One SB3 run in this process; seconds are counted from ``started`` (the process start, so
    imports count as they do for ``launch``)."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DDPG, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)  # same as our learner (learner.torch_threads)
    target, window, env_id = (475.0, 100, "CartPole-v1") if algo == "ppo" else (-200.0, 20, "Pendulum-v1")

    class StopAtTarget(BaseCallback):
        solved_at: float | None = None

        def _on_step(self) -> bool:
            episodes = [info["r"] for info in list(self.model.ep_info_buffer)[-window:]]
            if len(episodes) >= window and float(np.mean(episodes)) >= target:
                self.solved_at = time.monotonic() - started
                return False
            return time.monotonic() - started < budget_s

    if algo == "ppo" and settings == "zoo":
        z = dict(ZOO["ppo"])
        env = make_vec_env(env_id, n_envs=z.pop("n_envs"), seed=1)
        z["learning_rate"], z["clip_range"] = _linear(1e-3), _linear(0.2)
        model = PPO("MlpPolicy", env, seed=1, **z)
        total = 100_000  # the zoo's budget: the linear schedules anneal over it
    elif algo == "ppo":
        model, total = PPO("MlpPolicy", gym.make(env_id), seed=1), 10_000_000
    elif settings == "zoo":
        z = dict(ZOO["ddpg"])
        env = gym.make(env_id)
        noise = NormalActionNoise(np.zeros(1), z.pop("noise_std") * np.ones(1))
        model = DDPG("MlpPolicy", env, seed=1, action_noise=noise, policy_kwargs={"net_arch": z.pop("net_arch")}, **z)
        total = 10_000_000
    else:
        model, total = DDPG("MlpPolicy", gym.make(env_id), seed=1), 10_000_000
    callback = StopAtTarget()
    model.learn(total_timesteps=total, callback=callback)
    return {"seconds": callback.solved_at, "steps": model.num_timesteps}


def run_sb3(algo: str, settings: str, budget_s: float) -> tuple[float | None, int | None]:
    """Wall seconds of a whole SB3 process (interpreter start to target) and its env steps."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        log.warning("stable-baselines3 is not installed (pip install -e '.[bench]'): skipping SB3 %s", algo)
        return None, None
    args = [sys.executable, __file__, "--sb3-case", f"{algo}:{settings}", "--budget-s", str(budget_s)]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=budget_s + 300)
    wall = time.monotonic() - started
    if done.returncode != 0:
        log.error("SB3 %s (%s) failed:\n%s", algo, settings, done.stderr[-3000:])
        return None, None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    solved = result["seconds"] is not None
    log.info("SB3 %s (%s settings): %s, %d steps", algo.upper(), settings,
             f"solved, {wall:.0f}s whole process" if solved else "NOT solved", result["steps"])
    return (wall if solved else None), result["steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=900.0, help="per case")
    parser.add_argument("--only", choices=["ppo", "ddpg"], default=None)
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--sb3-case", default=None, help=argparse.SUPPRESS)  # internal: one SB3 run
    options = parser.parse_args()
    if options.sb3_case:
        algo, settings = options.sb3_case.split(":")
        print(json.dumps(sb3_case(algo, settings, options.budget_s, PROCESS_STARTED)))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, float | int | None] = {}
    with tempfile.TemporaryDirectory(prefix="surreal-solve-") as tmp:
        workdir = Path(tmp)
        if options.only in (None, "ppo"):
            for case, agents in (("ppo_cartpole", 2), ("ppo_cartpole_4_agents", 4)):
                result[f"{case}_s"], result[f"{case}_steps"], split = run_launch(
                    "ppo_cartpole.yaml", agents, options.budget_s, workdir)
                result[f"{case}_startup_s"], result[f"{case}_shutdown_s"] = split
            if not options.skip_sb3:
                for settings in ("zoo", "defaults"):
                    result[f"sb3_{settings}_ppo_cartpole_s"], result[f"sb3_{settings}_ppo_cartpole_steps"] = run_sb3(
                        "ppo", settings, options.budget_s)
        if options.only in (None, "ddpg"):
            result["ddpg_pendulum_s"], result["ddpg_pendulum_steps"], split = run_launch(
                "ddpg_pendulum.yaml", 2, options.budget_s, workdir)
            result["ddpg_pendulum_startup_s"], result["ddpg_pendulum_shutdown_s"] = split
            if not options.skip_sb3:
                for settings in ("zoo", "defaults"):
                    result[f"sb3_{settings}_ddpg_pendulum_s"], result[f"sb3_{settings}_ddpg_pendulum_steps"] = run_sb3(
                        "ddpg", settings, options.budget_s)
    for case in ("ppo_cartpole", "ddpg_pendulum"):
        for settings in ("zoo", "defaults"):
            ours, theirs = result.get(f"{case}_s"), result.get(f"sb3_{settings}_{case}_s")
            if ours and theirs:
                result[f"{case}_time_ratio_vs_sb3_{settings}"] = ours / theirs
    print(json.dumps(result))


if __name__ == "__main__":
    main()
