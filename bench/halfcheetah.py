"""Wall-clock learning race on HalfCheetah-v5 (or another MuJoCo task), PPO, SAC, CrossQ or DDPG:
``python bench/halfcheetah.py [--algo ppo|sac|crossq|ddpg] [--env-id ID] [--seed N] [--budget-s 600]
[--agents N] [--skip-sb3] [--keep DIR] [--json PATH] [-o key=value ...]``.

Both sides get the same wall-clock budget, as whole processes (start-up and imports count):

- ours: ``surreal-redis launch configs/<algo>_halfcheetah.yaml`` (``env.env_id`` and
  ``experiment.seed`` set from ``--env-id`` and ``--seed``, nothing else changed) with ``stop.max_seconds`` =
  budget (its clock starts with the learner, so the launch's start-up comes on top: ``wall_s``
  says how much); scores from the launch summary: the mean of the last ``--window`` training
  episodes (raw rewards) and the final eval of the final checkpoint (deterministic,
  ``eval.final_episodes``; the last periodic eval, at most ``eval.every_s`` old, where none ran);
- stable-baselines3 with rl-baselines3-zoo's MuJoCo settings (HalfCheetah-v4 entries, here on
  v5), one env, one torch thread (our learner: the config's learner.torch_threads, 1 for PPO, 2 for
  SAC, whose agents leave the second of 2 cores idle):

  - ``--algo ppo`` (``hyperparams/ppo.yml``): VecNormalize of observations and rewards (gamma
    0.98), MlpPolicy pi/vf [256, 256] ReLU, log_std_init -2, no orthogonal init, n_steps 512,
    batch 64, 20 epochs, lr 2.0633e-05, gamma 0.98, gae_lambda 0.92, clip 0.1, ent 0.000401762,
    vf 0.58096, max_grad_norm 0.8;
  - ``--algo sac`` and ``--algo crossq`` (``hyperparams/sac.yml``; SB3 has no CrossQ, so ours
    races SB3 SAC, the reference the off-policy targets name): learning_starts 10000, otherwise
    SB3 SAC's defaults (MlpPolicy [256, 256], lr 3e-4, batch 256, buffer 1e6, tau 0.005, gamma
    0.99, one gradient step per env step, ent_coef 'auto'); no normalization. The zoo's entries
    for Hopper, Walker2d and Ant are the same, so ``--env-id`` races them with these settings.
  - ``--algo ddpg`` against SB3 TD3 (``hyperparams/td3.yml``, its MuJoCo defaults; SB3's DDPG
    entries are not tuned for MuJoCo): learning_starts 10000, Gaussian action noise 0.1, lr 1e-3,
    batch 256, one gradient step per env step, net_arch [400, 300], otherwise TD3's defaults
    (twin critics, policy delay 2, target noise 0.2 clipped at 0.5, tau 0.005, gamma 0.99).

  Both sides take ``--seed``: ours as ``experiment.seed``, SB3 for its model and env.

  It trains until the budget (counted from its interpreter's start) runs out; scores: the mean
  of its last ``--window`` training episodes (Monitor, raw rewards) and ``--eval-episodes``
  deterministic episodes afterwards (PPO's normalization frozen; not counted in the budget).

``train_at_env_steps`` holds both sides' training curves at 30k and 60k env steps (ours: the
launch's ``tracking.curve_window`` episodes, from its MLflow store; SB3's: ``--window``).

Target: ours >= SB3 on both. Training means lag the policy (its noise, and a window that reaches
back), deterministic evals do not, so ``eval_ours_minus_sb3`` is the headline. The last line of
stdout is one JSON object; ``--json PATH`` also writes it to PATH and the race's curves beside it
(PATH with ``.png``; :mod:`surreal_redis.plots`): return against env steps and seconds, ours from
the launch's MLflow store (the training window mean, the evals) on the learner's clock, which
the budget counts, SB3's from its process start (its training window mean at each episode end,
the deterministic eval after the budget as one point).
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from surreal_redis import plots  # light: matplotlib and MLflow load when a figure is made

PROCESS_STARTED = time.monotonic()  # the SB3 run's clock starts with its interpreter
ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.halfcheetah")

SUMMARY = re.compile(r"(?P<steps>\d+) env steps, (?P<updates>\d+) updates, mean return (?P<mean>\S+), "
                     r"last eval (?P<eval>\S+)")
USE = re.compile(r"experience used .*")  # the summary's line on how the run used its time
FINAL_EVAL = re.compile(r"final eval of update \d+ \(the final checkpoint\): mean return (?P<score>\S+) ")

# rl-baselines3-zoo's HalfCheetah-v4 entries (hyperparams/ppo.yml, hyperparams/sac.yml); what an entry
# leaves out takes SB3's defaults; both train for n_timesteps 1e6, which the budget cuts short
ZOO_HALFCHEETAH = {
    "ppo": dict(n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096),
    "sac": dict(learning_starts=10_000),
    "td3": dict(learning_starts=10_000, learning_rate=1e-3, batch_size=256, train_freq=1, gradient_steps=1),
}
TD3_NOISE_STD, TD3_NET_ARCH = 0.1, [400, 300]  # td3.yml's noise_type normal, noise_std, policy_kwargs
N_TIMESTEPS = 1_000_000
EQUAL_STEPS = (30_000, 60_000)  # env steps where both sides' training curves are compared
CONFIGS = {"ppo": "ppo_halfcheetah.yaml", "sac": "sac_halfcheetah.yaml", "crossq": "crossq_halfcheetah.yaml",
           "ddpg": "ddpg_halfcheetah.yaml"}
SB3_ALGO = {"ppo": "ppo", "sac": "sac", "crossq": "sac", "ddpg": "td3"}  # the SB3 algorithm each of ours races


def _number(text: str) -> float | None:
    return None if text.strip(",") == "-" else float(text.strip(","))


def run_ours(config: str, env_id: str, seed: int, budget_s: float, window: int, agents: int | None,
             overrides: list[str], workdir: Path) -> dict:
    """One launch of ``configs/<config>`` on ``env_id`` for ``budget_s`` learner seconds; its summary's numbers."""
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", str(ROOT / "configs" / config),
            "-o", f"experiment.root={workdir}", "-o", f"stop.max_seconds={budget_s}", "-o", f"stop.return_window={window}",
            "-o", f"env.env_id={env_id}", "-o", f"experiment.seed={seed}"]
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
    final, last_periodic = FINAL_EVAL.search(done.stderr), _number(summary["eval"])
    result = {"wall_s": round(wall, 1), "env_steps": int(summary["steps"]), "updates": int(summary["updates"]),
              "train_return": _number(summary["mean"]), "last_periodic_eval": last_periodic,
              # the final checkpoint's eval, as SB3's eval after its budget; the last periodic one without it
              "eval_return": _number(final["score"]) if final else last_periodic}
    use = USE.search(done.stderr)
    log.info("ours: %s; %s", result, use[0] if use else "-")
    return result


def our_curves(workdir: Path) -> plots.RunCurves | None:
    """Our launch's curves from the newest run folder in ``workdir``; None (logged) when none is readable."""
    runs = sorted((d for d in workdir.iterdir() if (d / "mlflow.db").is_file()), key=lambda d: d.stat().st_mtime)
    if not runs:
        log.warning("no run folder with an MLflow store in %s: no curves for ours", workdir)
        return None
    try:
        return plots.read_run(runs[-1], "ours")
    except plots.PlotError as exc:
        log.warning("no curves for ours: %s", exc)
        return None


def sb3_curves(result: dict) -> plots.RunCurves | None:
    """SB3's ``curve`` points and its eval after the budget (one point) as RunCurves; None without points."""
    if not result.get("curve"):
        return None
    series = [plots.series_from_points("SB3 zoo", "train", result["curve"])]
    if result.get("eval_return") is not None:
        series.append(plots.series_from_points("SB3 zoo", "eval", [(result["env_steps"], result["wall_s"],
                                                                    result["eval_return"])]))
    return plots.RunCurves("SB3 zoo", tuple(series), None)


def train_series(curves: plots.RunCurves | None) -> plots.Series | None:
    """The training curve of ``curves`` (None without one)."""
    return next((s for s in curves.series if s.kind == "train"), None) if curves else None


def train_return_by(curves: plots.RunCurves | None, env_steps: float) -> float | None:
    """The training curve's last point at or before ``env_steps``; None without a curve or a
    point that early."""
    train = train_series(curves)
    if train is None:
        return None
    index = bisect.bisect_right(train.env_steps, env_steps)
    return train.returns[index - 1] if index else None


def train_at(curves: plots.RunCurves | None, env_steps: int) -> float | None:
    """The training curve's value at ``env_steps`` (:func:`train_return_by`, rounded); None also
    where the curve ends before ``env_steps``."""
    train = train_series(curves)
    if train is None or not train.env_steps or train.env_steps[-1] < env_steps:
        return None
    value = train_return_by(curves, env_steps)
    return None if value is None else round(value, 1)


def race_figure(algo: str, env_id: str, budget_s: float, curves: list[plots.RunCurves]):
    """The ``--json`` figure: both sides' curves, a panel per x axis."""
    versus = "" if SB3_ALGO[algo] == algo else f" against SB3 {SB3_ALGO[algo].upper()}"
    return plots.draw_curve_rows([(f"{algo.upper()}{versus} {env_id}, {budget_s:.0f} s each", curves)],
                                 xlabels={"time": "seconds (ours: learner clock; SB3: from its process start)"})


def sb3_model(algo: str, env_id: str, seed: int):
    """SB3 PPO, SAC or TD3 with the zoo's settings on ``env_id``, and the observation transform its
    deterministic eval applies (PPO's VecNormalize, frozen; none for SAC and TD3)."""
    import numpy as np
    import torch
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    env = make_vec_env(env_id, n_envs=1, seed=seed)
    if algo == "sac":
        return SAC("MlpPolicy", env, seed=seed, **ZOO_HALFCHEETAH["sac"]), lambda obs: obs
    if algo == "td3":
        actions = env.action_space.shape[0]
        noise = NormalActionNoise(np.zeros(actions), np.full(actions, TD3_NOISE_STD))
        return TD3("MlpPolicy", env, seed=seed, action_noise=noise, policy_kwargs=dict(net_arch=TD3_NET_ARCH),
                   **ZOO_HALFCHEETAH["td3"]), lambda obs: obs
    env = VecNormalize(env, gamma=ZOO_HALFCHEETAH["ppo"]["gamma"])
    policy_kwargs = dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                         net_arch=dict(pi=[256, 256], vf=[256, 256]))
    model = PPO("MlpPolicy", env, seed=seed, policy_kwargs=policy_kwargs, **ZOO_HALFCHEETAH["ppo"])

    def normalized(obs):
        env.training, env.norm_reward = False, False
        return env.normalize_obs(obs)

    return model, normalized


def sb3_case(algo: str, env_id: str, seed: int, budget_s: float, window: int, eval_episodes: int,
             started: float) -> dict:
    """SB3 ``algo`` with the zoo's settings on ``env_id`` until ``budget_s`` seconds after ``started``."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)  # one process, one thread (ours: learner.torch_threads)

    class Budget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.curve: list[tuple[int, float, float]] = []  # (env steps, seconds, window mean) at episode ends

        def _on_step(self) -> bool:
            # SB3 adds the episodes that end at this step to its buffer after this call: the curve takes them now
            ended = [info["episode"]["r"] for info in self.locals.get("infos", ()) if "episode" in info]
            if ended:
                episodes = [info["r"] for info in self.model.ep_info_buffer] + ended
                self.curve.append((self.model.num_timesteps, round(time.monotonic() - started, 3),
                                   float(np.mean(episodes[-window:]))))
            return time.monotonic() - started < budget_s

    model, transform = sb3_model(algo, env_id, seed)
    budget = Budget()
    model.learn(total_timesteps=N_TIMESTEPS, callback=budget)  # the zoo's n_timesteps
    wall = time.monotonic() - started
    episodes = [info["r"] for info in list(model.ep_info_buffer)[-window:]]
    eval_env = gym.make(env_id)
    returns = []
    for episode in range(eval_episodes):
        obs, _ = eval_env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(transform(obs[None]), deterministic=True)
            obs, reward, terminated, truncated, _ = eval_env.step(action[0])
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return {"wall_s": round(wall, 1), "env_steps": model.num_timesteps,
            "train_return": float(np.mean(episodes)) if episodes else None,
            "eval_return": float(np.mean(returns)) if returns else None, "curve": budget.curve}


def run_sb3(algo: str, env_id: str, seed: int, budget_s: float, window: int, eval_episodes: int) -> dict | None:
    """SB3's side of the race against our ``algo`` (SB3's :data:`SB3_ALGO` of it), in a process of its own."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        log.warning("stable-baselines3 is not installed (pip install -e '.[bench]'): skipping SB3")
        return None
    args = [sys.executable, __file__, "--sb3-case", "--algo", algo, "--env-id", env_id, "--seed", str(seed),
            "--budget-s", str(budget_s), "--window", str(window), "--eval-episodes", str(eval_episodes)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=budget_s + 600)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 run exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    log.info("SB3 %s (zoo settings): %s", SB3_ALGO[algo].upper(), {k: v for k, v in result.items() if k != "curve"})
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=list(CONFIGS), default="ppo", help="configs/<algo>_halfcheetah.yaml "
                        "against SB3's <algo> (SAC for crossq, TD3 for ddpg) with the zoo's settings")
    parser.add_argument("--env-id", default="HalfCheetah-v5", help="the MuJoCo task both sides train on")
    parser.add_argument("--seed", type=int, default=1, help="both sides' seed")
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall seconds for each side")
    parser.add_argument("--agents", type=int, default=None, help="agents for ours (default: the config's)")
    parser.add_argument("--window", type=int, default=10, help="training episodes averaged on each side")
    parser.add_argument("--eval-episodes", type=int, default=5, help="deterministic episodes after SB3's budget")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="a folder for our run (logs), kept; default: a temporary one")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the JSON object here, and the race's curves beside it (.png)")
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
    if options.keep is not None:
        options.keep = options.keep.resolve()  # our launch runs in it: experiment.root must be absolute
        options.keep.mkdir(parents=True, exist_ok=True)
    return options


def main(argv: list[str] | None = None) -> dict:
    options = parse_args(argv)
    if options.sb3_case:
        result = sb3_case(SB3_ALGO[options.algo], options.env_id, options.seed, options.budget_s, options.window,
                          options.eval_episodes, PROCESS_STARTED)
        print(json.dumps(result))
        return result
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, object] = {"algo": options.algo, "env_id": options.env_id, "seed": options.seed,
                                 "cores": os.cpu_count(), "budget_s": options.budget_s}
    sb3_curve: plots.RunCurves | None = None
    with (nullcontext(options.keep) if options.keep else tempfile.TemporaryDirectory(prefix="surreal-halfcheetah-")) as tmp:
        result["ours"] = run_ours(CONFIGS[options.algo], options.env_id, options.seed, options.budget_s, options.window,
                                  options.agents, options.override, Path(tmp))
        our_curve = our_curves(Path(tmp))
    if not options.skip_sb3:
        result["sb3_zoo"] = sb3 = run_sb3(options.algo, options.env_id, options.seed, options.budget_s,
                                          options.window, options.eval_episodes)
        if sb3 is not None:
            sb3_curve = sb3_curves(sb3)
            sb3.pop("curve", None)  # the figure's, not the JSON's
    ours, theirs = result.get("ours"), result.get("sb3_zoo")
    # each side's training curve (ours: tracking.curve_window episodes; SB3: --window) at equal env steps
    sides = {"ours": our_curve, **({"sb3_zoo": sb3_curve} if isinstance(theirs, dict) else {})}
    result["train_at_env_steps"] = {str(steps): {side: train_at(c, steps) for side, c in sides.items()}
                                    for steps in EQUAL_STEPS}
    if isinstance(ours, dict) and isinstance(theirs, dict):
        # returns can be negative early on: differences, not ratios
        for score in ("eval_return", "train_return"):
            if ours[score] is not None and theirs[score] is not None:
                result[f"{score.split('_')[0]}_ours_minus_sb3"] = round(ours[score] - theirs[score], 1)
    print(json.dumps(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
        drawn = [c for c in (our_curve, sb3_curve) if c is not None]
        if drawn:
            log.info("curves: %s", plots.save_beside(race_figure(options.algo, options.env_id, options.budget_s, drawn),
                                                             options.json))
    return result


if __name__ == "__main__":
    main()
