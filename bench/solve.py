"""Time to solve, end to end: ``surreal-redis launch`` of the shipped configs against
stable-baselines3, with rl-baselines3-zoo's tuned settings and with its defaults, on the same
machine, in the same run.

    python bench/solve.py [--budget-s 900] [--only ppo|ddpg|sac] [--quick] [--skip-sb3] [--keep DIR] [--json PATH]

- PPO CartPole-v1 (1 agent with 8 envs, as shipped, and 4 agents with 2 each, in its own overlap
  mode; 1 in lockstep) and APPO (``appo_cartpole.yaml``, 1 agent):
  wall seconds from ``launch`` until the learner stops because
  the mean of the last 100 training-episode returns reached 475; SB3 PPO: until its
  ``ep_info_buffer`` (the last 100 training episodes) has a mean >= 475.
- DDPG Pendulum-v1: ours stops when a complete eval (20 deterministic episodes) averages >= -200;
  SB3 DDPG (no action noise by default, so its training episodes are deterministic too): when
  the mean of its last 20 training episodes is >= -200.
- SAC Pendulum-v1 (``configs/sac_pendulum.yaml``, 2 agents): ours stops as DDPG's does, on a
  complete deterministic eval >= -200; SB3 SAC when the mean of its last 20 training episodes is
  >= -200. SAC's training episodes sample from the policy, so they score below its deterministic
  mean action, and the window reaches 20 episodes (4000 steps) back: a policy that would already
  pass our eval keeps SB3 running, which favours ours. What favours SB3: its check is free and
  comes with every episode's end, ours waits for the next complete eval (``eval.every_s``, 20
  episodes in the eval process). The log gives SB3's deterministic eval (20 episodes) at its stop,
  not counted in its time, to show how far past the target its policy already was.

Both wall times are whole processes, as a user waits for them: ours from ``launch`` to its exit
(process start-up, the embedded Redis, MLflow, and the eval of the final checkpoint that ``launch``
runs after the stop, which SB3's run does not have) and SB3's from its interpreter's start
(imports included). A case that misses the target within the budget reports null. The last line of output is
one JSON object, with ``<case>_time_ratio_vs_sb3_<zoo|defaults>`` (ours / SB3's; target <= 1).
Ours is also split, from the learner's log: ``*_startup_s`` from ``launch`` to the
learner's first update, ``*_shutdown_s`` from the learner's stop (target reached) to ``launch``'s
exit, its final eval included. ``--quick`` runs the quick start only (``launch
configs/ppo_cartpole.yaml``, 1 agent) and SB3 zoo's PPO, and logs the quick start's verdict: its
first update within 3 s of the command, its exit within 1 s of the target, its whole process at
most 0.8x SB3 zoo's.

``--json PATH`` also writes that object to PATH and the learning curves beside it (PATH with
``.png``; :mod:`surreal_redis.plots`): a row per algorithm, return against env steps and against
seconds, ours from each launch's MLflow store (the train return's window mean and the evals) on
the launch's clock, SB3's from its process start (the mean of its stop check's window at each
episode end; the deterministic eval at its stop as one point).
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
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from surreal_redis import plots  # light: matplotlib and MLflow load when a figure is made

PROCESS_STARTED = time.monotonic()  # an SB3 case's clock starts with its interpreter
ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.solve")

STOPPED = re.compile(r"learner stopped \((?P<reason>.*)\): (?P<updates>\d+) updates, (?P<steps>\d+) env steps")
STAMP = r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"  # runtime.setup_logging's format
FIRST_UPDATE = re.compile(STAMP + "first update done", re.MULTILINE)
BUILT_BEFORE = re.compile(r"first update done \((?P<seconds>[\d.]+)s after the learner was built\)")
STOPPING = re.compile(STAMP + "surreal_redis.runtime: stopping: ", re.MULTILINE)
USE = re.compile(r"experience used .*")  # the launch summary's line on how the run used its time


class Phases(NamedTuple):
    """Seconds from ``launch`` to the learner's first update, and from its stop to ``launch``'s exit."""

    startup_s: float | None
    shutdown_s: float | None


def log_time(match: re.Match) -> float:
    """The ``time.time()`` of a log line matched with :data:`STAMP` (its local time, in ms)."""
    return datetime.strptime(match.group("time"), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def phases(learner_log: str, started: float, ended: float) -> Phases:
    """From the learner log's local-time stamps (ms) and the launch's ``time.time()`` bounds."""
    def at(pattern: re.Pattern) -> float | None:
        match = pattern.search(learner_log)
        return log_time(match) if match else None

    first, stop = at(FIRST_UPDATE), at(STOPPING)
    return Phases(None if first is None else first - started, None if stop is None else ended - stop)


def launch_name(config: str, agents: int, overrides: tuple[str, ...] = ()) -> str:
    """experiment.name of one launch (its folder under the work folder)."""
    suffix = "".join("_" + re.sub(r"[^a-z0-9]+", "_", o.rpartition(".")[2].lower()) for o in overrides)
    return f"{Path(config).stem}_{agents}a{suffix}"


def launch_curves(run_dir: Path, label: str, startup_s: float | None) -> plots.RunCurves | None:
    """A launch's return curves from its MLflow store, on the launch's clock: the learner's
    elapsed seconds plus the time from ``launch`` to the learner's build (start-up minus what the
    learner's log says the build took to its first update). None (logged) when unreadable."""
    try:
        curves = plots.read_run(run_dir, label)
    except plots.PlotError as exc:
        log.warning("no curves for %s: %s", label, exc)
        return None
    built = BUILT_BEFORE.search((run_dir / "logs" / "learner.log").read_text(errors="replace"))
    if startup_s is None or built is None:
        return curves
    return plots.shift_time(curves, startup_s - float(built["seconds"]))


def sb3_curves(label: str, algo: str, result: dict) -> plots.RunCurves | None:
    """An SB3 case's curve (``sb3_case``'s ``curve``, ``eval_at_stop``) as RunCurves; None without points."""
    if not result.get("curve"):
        return None
    series = [plots.series_from_points(label, "train", result["curve"])]
    if "eval_at_stop" in result:
        series.append(plots.series_from_points(label, "eval", [(result["steps"], result["stopped_s"],
                                                                 result["eval_at_stop"])]))
    return plots.RunCurves(label, tuple(series), TASKS[algo][1])


def solve_figure(rows: list[tuple[str, list[plots.RunCurves]]]):
    """The ``--json`` figure: a row per algorithm that has curves."""
    return plots.draw_curve_rows([row for row in rows if row[1]], title="time to solve: ours against SB3",
                                 xlabels={"time": "seconds (ours: from launch; SB3: from its process start)"})


def run_launch(config: str, agents: int, budget_s: float, workdir: Path,
               overrides: tuple[str, ...] = ()) -> tuple[float | None, int | None, Phases]:
    """Wall seconds and env steps to the target ((None, steps) when it was not reached), and the phases."""
    name = launch_name(config, agents, overrides)
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", str(ROOT / "configs" / config),
            "--agents", str(agents), "-o", f"experiment.root={workdir}", "-o", f"experiment.name={name}",
            "-o", f"stop.max_seconds={budget_s}",
            *(arg for o in overrides for arg in ("-o", o))]
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
    use = USE.search(done.stderr)
    log.info("%s, %d agents: %s after %.0fs, %d env steps (start-up %s s, shutdown %s s); %s", config, agents,
             "solved" if reached else f"NOT solved ({match.group('reason')})", wall, steps,
             *(f"{value:.1f}" if value is not None else "?" for value in split), use[0] if use else "-")
    return (wall if reached else None), steps, split


# rl-baselines3-zoo's tuned settings (hyperparams/ppo.yml CartPole-v1, hyperparams/ddpg.yml and
# hyperparams/sac.yml Pendulum-v1; what an entry leaves out takes SB3's defaults). ``n_timesteps``
# is the zoo's budget: PPO's linear schedules anneal over it, the off-policy runs stop at the
# target or the wall budget instead (their learning rates are constants).
ZOO = {
    "ppo": dict(n_timesteps=100_000, n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate="lin_0.001", clip_range="lin_0.2"),
    "ddpg": dict(n_timesteps=20_000, gamma=0.98, buffer_size=200_000, learning_starts=10_000, noise_std=0.1,
                 gradient_steps=1, train_freq=1, learning_rate=1e-3, net_arch=[400, 300]),
    "sac": dict(n_timesteps=20_000, learning_rate=1e-3),
}
# the env, the target and how many of the last training episodes SB3's check averages
TASKS = {"ppo": ("CartPole-v1", 475.0, 100), "ddpg": ("Pendulum-v1", -200.0, 20), "sac": ("Pendulum-v1", -200.0, 20)}
# ours: (JSON key, config, agents, overrides) for each launch; the first one's key names the case
# (ppo_cartpole.yaml's own mode is overlap; lockstep is the one APPO is held against). The CartPole
# configs ship one agent with the zoo's 8 envs; 4 agents keep those 8 envs, 2 each.
LAUNCHES: dict[str, tuple[tuple[str, str, int, tuple[str, ...]], ...]] = {
    "ppo": (("ppo_cartpole", "ppo_cartpole.yaml", 1, ()),
            ("ppo_cartpole_4_agents", "ppo_cartpole.yaml", 4, ("env.num_envs=2",)),
            ("ppo_cartpole_lockstep", "ppo_cartpole.yaml", 1, ("learner.on_policy_sync=lockstep",)),
            ("appo_cartpole", "appo_cartpole.yaml", 1, ())),
    "ddpg": (("ddpg_pendulum", "ddpg_pendulum.yaml", 2, ()),),
    "sac": (("sac_pendulum", "sac_pendulum.yaml", 2, ()),),
}
UNTIL_STOPPED = 10_000_000  # total_timesteps where the target or the budget ends the run


def _linear(start: float):
    return lambda progress_remaining: progress_remaining * start


def sb3_model(algo: str, settings: str):
    """The SB3 model for ``algo`` with the zoo's ``settings`` or SB3's ``defaults``, and the
    ``total_timesteps`` its ``learn`` gets."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import DDPG, PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    env_id = TASKS[algo][0]
    if settings == "defaults":
        return {"ppo": PPO, "ddpg": DDPG, "sac": SAC}[algo]("MlpPolicy", gym.make(env_id), seed=1), UNTIL_STOPPED
    z = dict(ZOO[algo])
    n_timesteps = z.pop("n_timesteps")
    if algo == "ppo":
        env = make_vec_env(env_id, n_envs=z.pop("n_envs"), seed=1)
        z["learning_rate"], z["clip_range"] = _linear(1e-3), _linear(0.2)
        return PPO("MlpPolicy", env, seed=1, **z), n_timesteps
    if algo == "ddpg":
        noise = NormalActionNoise(np.zeros(1), z.pop("noise_std") * np.ones(1))
        return DDPG("MlpPolicy", gym.make(env_id), seed=1, action_noise=noise,
                    policy_kwargs={"net_arch": z.pop("net_arch")}, **z), UNTIL_STOPPED
    return SAC("MlpPolicy", gym.make(env_id), seed=1, **z), UNTIL_STOPPED


def deterministic_eval(model, env_id: str, episodes: int) -> float:
    """Mean return of ``episodes`` deterministic episodes from seeded random starts."""
    import gymnasium as gym

    env, returns = gym.make(env_id), []
    for episode in range(episodes):
        obs, _ = env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return sum(returns) / len(returns)


def sb3_case(algo: str, settings: str, budget_s: float, started: float) -> dict:
    """One SB3 run in this process; seconds are counted from ``started`` (the process start, so
    imports count as they do for ``launch``). Off-policy runs also report a deterministic eval of
    as many episodes as the window at their stop, and its seconds, which ``run_sb3`` takes off."""
    import numpy as np
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)  # same as our learner (learner.torch_threads)
    env_id, target, window = TASKS[algo]

    class StopAtTarget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.solved_at: float | None = None
            self.curve: list[tuple[int, float, float]] = []  # (env steps, seconds, window mean) at episode ends

        def _on_step(self) -> bool:
            episodes = [info["r"] for info in list(self.model.ep_info_buffer)[-window:]]
            # SB3 adds the episodes that end at this step to its buffer after this call: the curve takes them now
            ended = [info["episode"]["r"] for info in self.locals.get("infos", ()) if "episode" in info]
            if ended:
                self.curve.append((self.model.num_timesteps, round(time.monotonic() - started, 3),
                                   float(np.mean((episodes + ended)[-window:]))))
            if len(episodes) >= window and float(np.mean(episodes)) >= target:
                self.solved_at = time.monotonic() - started
                return False
            return time.monotonic() - started < budget_s

    model, total = sb3_model(algo, settings)
    callback = StopAtTarget()
    model.learn(total_timesteps=total, callback=callback)
    result = {"seconds": callback.solved_at, "steps": model.num_timesteps, "curve": callback.curve,
              "stopped_s": time.monotonic() - started}
    if algo != "ppo":
        evaluating = time.monotonic()
        result["eval_at_stop"] = deterministic_eval(model, env_id, window)
        result["eval_s"] = time.monotonic() - evaluating  # taken off the whole process's time
    return result


def run_sb3(algo: str, settings: str, budget_s: float) -> tuple[float | None, int | None, plots.RunCurves | None]:
    """Wall seconds of a whole SB3 process (interpreter start to target), its env steps and its curves."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        log.warning("stable-baselines3 is not installed (pip install -e '.[bench]'): skipping SB3 %s", algo)
        return None, None, None
    args = [sys.executable, __file__, "--sb3-case", f"{algo}:{settings}", "--budget-s", str(budget_s)]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=budget_s + 300)
    if done.returncode != 0:
        log.error("SB3 %s (%s) failed:\n%s", algo, settings, done.stderr[-3000:])
        return None, None, None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    wall = time.monotonic() - started - result.get("eval_s", 0.0)
    solved = result["seconds"] is not None
    evaluated = f", deterministic eval at the stop {result['eval_at_stop']:.1f}" if "eval_at_stop" in result else ""
    log.info("SB3 %s (%s settings): %s, %d steps%s", algo.upper(), settings,
             f"solved, {wall:.0f}s whole process" if solved else "NOT solved", result["steps"], evaluated)
    return (wall if solved else None), result["steps"], sb3_curves(f"SB3 {settings}", algo, result)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=900.0, help="per case")
    parser.add_argument("--only", choices=list(LAUNCHES), default=None)
    parser.add_argument("--quick", action="store_true",
                        help="the quick start and SB3 zoo's PPO only, with the quick start's verdict")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="a folder for our runs (logs), kept; default: a temporary one")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the JSON object here, and the learning curves beside it (.png)")
    parser.add_argument("--sb3-case", default=None, help=argparse.SUPPRESS)  # internal: one SB3 run
    options = parser.parse_args(argv)
    if options.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {options.budget_s}")
    if options.keep is not None:
        options.keep = options.keep.resolve()  # our launches run in it: experiment.root must be absolute
        options.keep.mkdir(parents=True, exist_ok=True)
    return options


def add_ratios(result: dict) -> None:
    """``<launch>_time_ratio_vs_sb3_<settings>``: ours / SB3's wall seconds on the task (SB3 runs
    once per task, under its first launch's name), where both solved."""
    for launches in LAUNCHES.values():
        case = launches[0][0]
        for settings in ("zoo", "defaults"):
            theirs = result.get(f"sb3_{settings}_{case}_s")
            for key, *_ in launches:
                ours = result.get(f"{key}_s")
                if ours and theirs:
                    result[f"{key}_time_ratio_vs_sb3_{settings}"] = ours / theirs


QUICK = {"startup_s": 3.0, "shutdown_s": 1.0, "ratio": 0.8}  # the quick start's bars (--quick)


def plan(options: argparse.Namespace) -> tuple[dict[str, tuple[tuple[str, str, int, tuple[str, ...]], ...]],
                                                tuple[str, ...]]:
    """The launches to run per algorithm and SB3's settings to run against them."""
    if options.quick:
        return {"ppo": LAUNCHES["ppo"][:1]}, ("zoo",)
    return {algo: launches for algo, launches in LAUNCHES.items() if options.only in (None, algo)}, ("zoo", "defaults")


def quick_verdict(result: dict) -> str:
    """The quick start's three numbers against :data:`QUICK` (``?`` where one is missing)."""
    def said(value: float | None, bar: float, unit: str = " s") -> str:
        return "?" if value is None else f"{value:.2f}{unit} ({'met' if value <= bar else 'NOT met'}: <= {bar:g}{unit})"

    whole, sb3 = result.get("ppo_cartpole_s"), result.get("sb3_zoo_ppo_cartpole_s")
    return (f"quick start: first update {said(result.get('ppo_cartpole_startup_s'), QUICK['startup_s'])} after the "
            f"command; exit {said(result.get('ppo_cartpole_shutdown_s'), QUICK['shutdown_s'])} after the target; "
            f"whole process {'?' if whole is None else f'{whole:.1f} s'} against SB3 zoo's "
            f"{'?' if sb3 is None else f'{sb3:.1f} s'}: "
            f"{said(result.get('ppo_cartpole_time_ratio_vs_sb3_zoo'), QUICK['ratio'], 'x')}")


def main(argv: list[str] | None = None) -> dict:
    options = parse_args(argv)
    if options.sb3_case:
        algo, settings = options.sb3_case.split(":")
        print(json.dumps(sb3_case(algo, settings, options.budget_s, PROCESS_STARTED)))
        return {}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, float | int | None] = {}
    rows: list[tuple[str, list[plots.RunCurves]]] = []  # the figure's: a row per algorithm
    with (nullcontext(options.keep) if options.keep else tempfile.TemporaryDirectory(prefix="surreal-solve-")) as tmp:
        launches_of, sb3_settings = plan(options)
        for algo, launches in launches_of.items():
            curves = []
            for key, config, agents, overrides in launches:
                result[f"{key}_s"], result[f"{key}_steps"], split = run_launch(config, agents, options.budget_s,
                                                                               Path(tmp), overrides)
                result[f"{key}_startup_s"], result[f"{key}_shutdown_s"] = split
                if options.json:
                    curves.append(launch_curves(Path(tmp) / launch_name(config, agents, overrides), key,
                                                split.startup_s))
            if not options.skip_sb3:
                case = launches[0][0]
                for settings in sb3_settings:
                    result[f"sb3_{settings}_{case}_s"], result[f"sb3_{settings}_{case}_steps"], sb3 = run_sb3(
                        algo, settings, options.budget_s)
                    curves.append(sb3)
            rows.append((f"{algo.upper()} {TASKS[algo][0]}", [c for c in curves if c is not None]))
    add_ratios(result)
    if options.quick:
        log.info("%s", quick_verdict(result))
    print(json.dumps(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
        if any(curves for _, curves in rows):
            log.info("curves: %s", plots.save_beside(solve_figure(rows), options.json))
    return result


if __name__ == "__main__":
    main()
