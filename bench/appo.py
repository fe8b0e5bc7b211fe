"""APPO against lockstep PPO, whole launches side by side in one run:
``python bench/appo.py [--seeds 3] [--race-s 300] [--race-modes lockstep,appo] [--cartpole-seeds 10]
[--agents 1,2,4,8] [--scaling-s 45] [--scaling-envs cartpole,halfcheetah] [-o KEY=VALUE ...] [--skip-race] [--skip-scaling]
[--json PATH]``.

- **Race** (HalfCheetah-v5): per seed (``experiment.seed`` 1..``--seeds``), ``configs/ppo_halfcheetah.yaml``
  (lockstep, its default) and ``configs/appo_halfcheetah.yaml`` for ``--race-s`` learner seconds
  each, one after the other (:func:`halfcheetah.run_ours`: training window of 10 episodes, the
  eval of the final checkpoint); both run all 20 epochs per update (since 2026-12-05 APPO's
  epochs no longer follow the agents' speed), so at equal env steps only the lag and V-trace
  differ. Per mode: the eval and training returns (mean, min, max over
  seeds), env steps and updates; ``appo_minus_lockstep_eval`` (equal wall-clock) and, at equal env
  steps, each mode's training return at the seed's common count (the fewer of the modes' final
  env steps; the curve's last point at or before it): ``<mode>_train_at_common_steps``, per seed
  in ``at_common_steps``.
- **CartPole** (``--cartpole-seeds N``): per seed 1..N, lockstep PPO (``ppo_cartpole.yaml`` with
  ``learner.on_policy_sync=lockstep``) then APPO (``appo_cartpole.yaml``), each a whole launch to
  a 100-episode mean of 475 (:func:`solve.run_launch`); APPO's time over lockstep's per seed, its
  spread, the medians, and the seeds where APPO was no slower.
- **Scaling**: per env and agent count, one :func:`utilization.run_case` launch of the APPO
  config with free agents (:data:`FREE`; ``agent.num_agents`` set) for ``--scaling-s``: env steps/s and updates/s of the
  learner's clock, machine used, the CPU by role, experience used, agents idle; and per agent
  count the agents' env steps per agent core-second, the input of the many-core model in
  ``docs/benchmarks.md``.

Progress goes to stderr; the last line of stdout is one JSON object; ``--json PATH`` also writes
it there (no figure: bench/utilization.py draws the modes' bars).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import halfcheetah  # noqa: E402  (bench/ is not a package)
import solve  # noqa: E402
import utilization  # noqa: E402

log = logging.getLogger("bench.appo")
ENV_ID = "HalfCheetah-v5"
RACE = {"lockstep": ("ppo_halfcheetah.yaml", []), "appo": ("appo_halfcheetah.yaml", [])}
"""Race modes: config and overrides."""
WINDOW = 10
CARTPOLE = {"lockstep": ("ppo_cartpole.yaml", ("learner.on_policy_sync=lockstep",)), "appo": ("appo_cartpole.yaml", ())}
"""CartPole race modes: config and overrides (ppo_cartpole.yaml and appo_cartpole.yaml ship
overlap; lockstep is the issue's baseline)."""
CARTPOLE_AGENTS = 1
"""Agents in each CartPole launch: as both configs ship (one agent with 8 envs)."""
FREE_PRODUCTION = ("learner.on_policy_sync=free", "hub.sender.max_lag=16", "replay.fifo.max_policy_lag=8",
                   "agent.nice=10", "learner.prefetch_chunks=8", "learner.receive_batch=4")
FREE = {"cartpole": FREE_PRODUCTION, "halfcheetah": FREE_PRODUCTION}
"""Scaling: overrides that make an env's shipped APPO config produce freely (appo_cartpole.yaml and
appo_halfcheetah.yaml ship on grants, one batch ahead), with the backlog bounds
appo_halfcheetah.yaml had until 2026-12-05 (scaled to CartPole's 256-step updates)."""


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Mean, min and max of the values that were measured (None where none was)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"mean": None, "min": None, "max": None}
    return {"mean": round(statistics.fmean(known), 1), "min": round(min(known), 1), "max": round(max(known), 1)}


def race(seeds: int, budget_s: float, modes: list[str]) -> dict:
    """The HalfCheetah race, the modes one after the other per seed; each APPO mode against
    lockstep when lockstep ran."""
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    at_common_steps: list[dict] = []
    for seed in range(1, seeds + 1):
        finals = {}
        for mode in modes:
            config, overrides = RACE[mode]
            with tempfile.TemporaryDirectory(prefix=f"surreal-appo-{mode}-") as tmp:
                result = halfcheetah.run_ours(config, ENV_ID, seed, budget_s, WINDOW, None, list(overrides), Path(tmp))
                finals[mode] = (result, halfcheetah.our_curves(Path(tmp)))
            runs[mode].append({"seed": seed, **result})
            log.info("race seed %d %s: %s", seed, mode, result)
        common = min(result["env_steps"] for result, _ in finals.values())
        at_common_steps.append({"seed": seed, "env_steps": common, **{
            f"{mode}_train": halfcheetah.train_return_by(curves, common) for mode, (_, curves) in finals.items()}})
    out: dict = {"budget_s": budget_s, "seeds": seeds, "runs": runs, "at_common_steps": at_common_steps}
    for mode in modes:
        for key in ("eval_return", "train_return", "env_steps", "updates"):
            out[f"{mode}_{key}"] = spread([r[key] for r in runs[mode]])
        out[f"{mode}_train_at_common_steps"] = spread([row[f"{mode}_train"] for row in at_common_steps])
    if "lockstep" not in modes:
        return out
    for mode in modes:
        if mode != "lockstep":
            pairs = [(a["eval_return"], b["eval_return"]) for a, b in zip(runs[mode], runs["lockstep"])]
            out[f"{mode}_minus_lockstep_eval"] = spread([a - b if a is not None and b is not None else None
                                                         for a, b in pairs])
    return out


def cartpole(seeds: int, budget_s: float) -> dict:
    """CartPole to 475 per seed, lockstep then APPO (:data:`CARTPOLE`), whole launches
    (:func:`solve.run_launch`, :data:`CARTPOLE_AGENTS` each): per seed both times and env steps and APPO's ratio
    to lockstep; over the seeds the medians, the ratio's spread, and in how many seeds APPO was no
    slower. A launch that misses the target within ``budget_s`` counts as ``budget_s``."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="surreal-appo-cartpole-") as tmp:
        for seed in range(1, seeds + 1):
            row: dict = {"seed": seed}
            for mode, (config, overrides) in CARTPOLE.items():
                wall, steps, phases = solve.run_launch(config, CARTPOLE_AGENTS, budget_s, Path(tmp), (*overrides, f"experiment.seed={seed}"))
                row[mode] = {"solve_s": None if wall is None else round(wall, 1), "env_steps": steps,
                             "startup_s": None if phases.startup_s is None else round(phases.startup_s, 1)}
            times = {mode: row[mode]["solve_s"] or budget_s for mode in CARTPOLE}
            row["appo_vs_lockstep"] = round(times["appo"] / times["lockstep"], 2)
            log.info("cartpole seed %d: %s", seed, row)
            rows.append(row)
    ratios = [row["appo_vs_lockstep"] for row in rows]
    return {"budget_s": budget_s, "seeds": rows, "appo_vs_lockstep": spread(ratios),
            "appo_no_slower": sum(r <= 1.0 for r in ratios),
            **{f"{mode}_median_s": statistics.median(row[mode]["solve_s"] or budget_s for row in rows) for mode in CARTPOLE},
            **{f"{mode}_missed": sum(row[mode]["solve_s"] is None for row in rows) for mode in CARTPOLE}}


def scaling(envs: list[str], agents: list[int], seconds: float, extra: list[str]) -> dict:
    """APPO launches with each agent count; rates per learner second, the CPU by role. ``extra``:
    overrides for every launch (``--override``)."""
    fixed = [f"stop.max_seconds={seconds}", "stop.target_return=null", "stop.max_env_steps=null", *extra]
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="surreal-appo-scaling-") as tmp:
        for env in envs:
            rows = {}
            for count in agents:
                case = utilization.run_case(env, "appo", [*FREE.get(env, ()), *fixed, f"agent.num_agents={count}"],
                                            Path(tmp), seconds + 300)
                agent_cores = case["cores_by_role"].get("agent", 0.0)
                rows[str(count)] = {
                    "env_steps_per_s": round(case["env_steps"] / seconds), "updates_per_s": round(case["updates"] / seconds, 2),
                    "machine_used": case["machine_used"], "machine_used_steady": case["machine_used_steady"],
                    "cores_by_role": case["cores_by_role"], "used": case["used"],
                    "agents_idle": case["agents_idle"], "learner_busy": case["learner_busy"],
                    "policy_lag_p90": case["policy_lag_p90"], "epochs_per_update": case["epochs_per_update"],
                    # agent cores are averaged over the launch's whole wall time, steps over the learner's
                    "steps_per_agent_core_s": round(case["env_steps"] / (agent_cores * case["wall_s"])) if agent_cores else None}
            out[env] = rows
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--race-s", type=float, default=300.0, help="learner seconds per race launch")
    parser.add_argument("--race-modes", default="lockstep,appo", help=f"of {', '.join(RACE)}")
    parser.add_argument("--agents", default="1,2,4,8", help="agent counts of the scaling launches")
    parser.add_argument("--scaling-s", type=float, default=45.0, help="learner seconds per scaling launch")
    parser.add_argument("--scaling-envs", default="cartpole,halfcheetah")
    parser.add_argument("--cartpole-seeds", type=int, default=0, help="CartPole to 475 per seed, lockstep and APPO "
                        "(0: skip)")
    parser.add_argument("--cartpole-budget-s", type=float, default=90.0, help="per CartPole launch")
    parser.add_argument("--skip-race", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON object here")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every scaling launch, e.g. tracking.enabled=false on a machine "
                        "without MLflow (repeatable)")
    options = parser.parse_args(argv)
    if options.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {options.seeds}")
    if options.cartpole_seeds < 0 or options.cartpole_budget_s <= 0:
        parser.error(f"--cartpole-seeds must be >= 0 and --cartpole-budget-s > 0, got {options.cartpole_seeds} and "
                     f"{options.cartpole_budget_s}")
    if options.race_s <= 0 or options.scaling_s <= 0:
        parser.error(f"--race-s and --scaling-s must be > 0, got {options.race_s} and {options.scaling_s}")
    try:
        options.agents = [int(n) for n in options.agents.split(",")]
    except ValueError:
        parser.error(f"--agents must be comma-separated integers, got {options.agents!r}")
    if min(options.agents) < 1:
        parser.error(f"--agents needs counts >= 1, got {options.agents}")
    options.race_modes = options.race_modes.split(",")
    if unknown := sorted(set(options.race_modes) - set(RACE)):
        parser.error(f"unknown --race-modes {unknown} (known: {', '.join(RACE)})")
    unknown = sorted(set(options.scaling_envs.split(",")) - {"cartpole", "halfcheetah", "pong"})
    if unknown:
        parser.error(f"unknown --scaling-envs {unknown} (known: cartpole, halfcheetah, pong)")
    return options


def main(argv: list[str] | None = None) -> dict:
    options = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict = {"cores": os.cpu_count(), "load_before": os.getloadavg()[0]}
    if not options.skip_scaling:
        result["scaling"] = scaling(options.scaling_envs.split(","), options.agents, options.scaling_s,
                                    options.override)
    if options.cartpole_seeds:
        result["cartpole"] = cartpole(options.cartpole_seeds, options.cartpole_budget_s)
    if not options.skip_race:
        result["race"] = race(options.seeds, options.race_s, options.race_modes)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
