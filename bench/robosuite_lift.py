"""Does PPO learn robosuite Lift here? ``.venv-robosuite/bin/python bench/robosuite_lift.py
[--budget-s 900] [--seeds 1 2 3] [--agents 2] [--random-episodes 10] [--keep DIR] [--json PATH]
[-o key=value ...]``.

For each seed, ``surreal-redis launch configs/ppo_robosuite_lift.yaml`` (proprio and object
state, SURREAL's PPO settings; ``--agents`` agents, 2 for 2 cores) runs for ``stop.max_seconds`` =
budget, with an eval every ``eval.every_s`` (stochastic, as SURREAL evaluates). Its eval history
comes from the run's MLflow store; the first eval (parameters v1, before any update) is the
return at the start, the last periodic one the return at the end. Beside them, a uniform random policy's
return over ``--random-episodes`` episodes of the same env (same wrappers, 200-step episodes).

Reported per seed and as mean and spread over seeds: the final eval, its gain over the start and
over random. The last line of stdout is one JSON object; ``--json PATH`` writes it to PATH and
the seeds' curves beside it (PATH with ``.png``). Needs the robosuite venv
(``scripts/setup-env robosuite``): robosuite cannot share the dev venv.

Not ``bench/robosuite.py``: run as a script, its folder comes first on ``sys.path`` and that name
would shadow the robosuite package. SURREAL's own community result for scale: Lift 400+ after about 3 hours with 4 agents and a
desktop GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from surreal_redis import plots

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo_robosuite_lift.yaml"
log = logging.getLogger("bench.robosuite")


class SeedResult(NamedTuple):
    seed: int
    env_steps: int
    updates: int
    start_eval: float
    final_eval: float
    best_eval: float
    wall_s: float | None
    """The launch's whole wall time (None: a run read back with ``--keep``)."""


def random_return(overrides: list[str], episodes: int, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of a uniform random policy's episode return on the config's env."""
    from surreal_redis.config import load_config
    from surreal_redis.envs import make_env

    config = load_config(str(CONFIG), overrides)
    env = make_env(config.env, seed=seed, mode="eval")
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))


def launch_seed(seed: int, budget_s: float, agents: int, root: Path, overrides: list[str]) -> tuple[SeedResult, Path]:
    """One budgeted launch (or, with ``--keep``, the finished run already there: a bench that was
    cut off goes on from its last seed); its results read back from the run's MLflow store."""
    name = f"bench_robosuite_s{seed}"
    run_dir = root / name
    wall_s: float | None = None
    if (run_dir / "mlflow_run_id").is_file() and not (run_dir / "hub.json").exists():
        log.info("seed %d: reading the finished run in %s", seed, run_dir)
    else:
        sets = [f"experiment.root={root}", f"experiment.name={name}", f"experiment.seed={seed}",
                f"agent.num_agents={agents}", f"stop.max_seconds={budget_s}", "stop.max_env_steps=null", *overrides]
        command = [sys.executable, "-m", "surreal_redis.cli", "launch", str(CONFIG),
                   *[arg for value in sets for arg in ("-o", value)]]
        started = time.monotonic()
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=budget_s + 600)
        wall_s = round(time.monotonic() - started, 1)
        if done.returncode != 0:
            raise RuntimeError(f"seed {seed}: launch exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    curves = plots.read_run(run_dir, f"seed {seed}")
    evals = next((s for s in curves.series if s.kind == "eval"), None)
    if evals is None or not evals.returns:
        raise RuntimeError(f"seed {seed}: the run logged no eval (see {run_dir / 'logs'})")
    env_steps, updates = last_progress(run_dir)
    result = SeedResult(seed, env_steps, updates, evals.returns[0], evals.returns[-1],
                        max(evals.returns), wall_s)
    return result, run_dir


def last_progress(run_dir: Path) -> tuple[int, int]:
    """Env steps and updates at the run's last metrics flush (its MLflow store)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    history = client.get_metric_history((run_dir / "mlflow_run_id").read_text().strip(), plots.ENV_STEPS)
    if not history:
        raise RuntimeError(f"{run_dir}: no {plots.ENV_STEPS} in its MLflow store")
    last = max(history, key=lambda m: (m.step, m.timestamp))
    return int(last.value), int(last.step)


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": round(statistics.fmean(values), 2),
            "std": round(statistics.pstdev(values), 2) if len(values) > 1 else 0.0,
            "min": round(min(values), 2), "max": round(max(values), 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=900.0, help="Wall budget per seed (stop.max_seconds).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--random-episodes", type=int, default=10)
    parser.add_argument("--keep", type=Path, default=None, help="Keep the runs under this folder.")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="Config override for every seed's launch (e.g. eval.every_s=60).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    overrides = ["eval.every_s=60", *args.override]

    random_mean, random_std = random_return(overrides, args.random_episodes)
    log.info("random policy: %.2f +- %.2f over %d episodes", random_mean, random_std, args.random_episodes)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_robosuite_"))
    root.mkdir(parents=True, exist_ok=True)
    results, runs = [], []
    for seed in args.seeds:
        result, run_dir = launch_seed(seed, args.budget_s, args.agents, root, overrides)
        log.info("seed %d: %d env steps, %d updates, eval start %.2f -> final %.2f (best %.2f), wall %s s",
                 seed, result.env_steps, result.updates, result.start_eval, result.final_eval,
                 result.best_eval, result.wall_s)
        results.append(result)
        runs.append(plots.read_run(run_dir, f"seed {seed}"))

    finals = [r.final_eval for r in results]
    report = {
        "bench": "robosuite_lift_ppo", "budget_s": args.budget_s, "agents": args.agents,
        "random_return": {"mean": round(random_mean, 2), "std": round(random_std, 2),
                          "episodes": args.random_episodes},
        "seeds": [r._asdict() for r in results],
        "final_eval": spread(finals),
        "gain_over_start": spread([r.final_eval - r.start_eval for r in results]),
        "gain_over_random": spread([f - random_mean for f in finals]),
        "env_steps": spread([float(r.env_steps) for r in results]),
        "runs": str(root) if args.keep else None,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        plots.save_beside(plots.draw_curves(runs, title=f"PPO on robosuite Lift, {args.agents} agents, "
                                                        f"{args.budget_s:.0f} s per seed"), args.json)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
