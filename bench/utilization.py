"""Does a run use the machine and the experience at once? Whole launches of each production mode,
side by side in one run: ``python bench/utilization.py [--envs cartpole,halfcheetah] [--seconds 60]
[--modes lockstep,overlap,free,appo] [--solve] [--json PATH]``.

Per env and mode, ``surreal-redis launch`` of the shipped config (PPO: ``ppo_<env>.yaml`` with
``learner.on_policy_sync`` set to the mode; ``appo``: ``appo_<env>.yaml`` as shipped) runs for
``--seconds`` of learner time with no return target and eval off. Reported per case:

- ``machine_used``: CPU-seconds of every process of the launch (Redis, learner, MLflow, agents,
  eval; ``/proc/<pid>/stat`` of its process tree every ``POLL_S``, each process's last reading,
  so at most ``POLL_S`` of each is missed: ``getrusage`` would miss the processes the launcher
  does not reap) over ``wall_s x cores``: start-up and shutdown included, as a user pays them;
  ``machine_used_steady`` the same from 20% to 90% of the wall time (:data:`STEADY`), and
  ``cores_by_role`` the cores each part used over the wall time (learner, agent, redis, ...);
- ``updates``, ``env_steps``, ``mean_return`` (the last ``stop.return_window`` training
  episodes), and from the learner's whole-run status: ``used`` (the fraction of env steps that
  reached an update), ``policy_lag_p90``, ``rho_clipped`` (APPO: samples whose importance weight
  V-trace clipped, last update), ``epochs_per_update`` (on-policy: the whole run's
  mean, the gradient passes per sample), ``kl_per_update`` (on-policy: ``losses/approx_kl``, last
  flush window), ``learner_busy``, ``agents_idle``;
- ratios against lockstep in the same run: ``updates_vs_lockstep``, ``env_steps_vs_lockstep``.

``--solve`` adds CartPole time to the 475 target (whole process, ``stop.max_seconds`` 300) for
lockstep, overlap and appo, and ``solve_s_vs_lockstep``. The last line of stdout is one JSON object;
``--json PATH`` also writes it to PATH and a bar chart of it beside it (PATH with ``.png``,
:mod:`surreal_redis.plots`): per env, the :data:`PANELS` numbers of each mode, and the solve times.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import process_tree  # noqa: E402  (bench/ is not a package)
from throughput import cmdline, cpu_seconds  # noqa: E402

from surreal_redis import plots  # noqa: E402  (light: matplotlib loads when a figure is made)

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.25
log = logging.getLogger("bench.utilization")

MODES = ("lockstep", "overlap", "free", "appo")
TOTALS = re.compile(r"(?P<steps>\d+) env steps, (?P<updates>\d+) updates, mean return (?P<mean>\S+), "
                    r"last eval (?P<eval>\S+)")
USE = re.compile(r"experience used (?P<used>[\d.]+|-)%?.*?, policy lag p90 (?P<lag>[\d.]+|-)[^,]*"
                 r"(?:, rho clipped (?P<rho>[\d.]+|-)%)?(?:, passes/sample (?P<epochs>[\d.]+))?(?:, kl/update (?P<kl>[^,]+))?"
                 r", learner busy (?P<busy>[\d.]+|-)%?, agents idle (?P<idle>[\d.]+|-)%?")
SOLVED = re.compile(r"learner stopped \((?P<reason>[^)]*)\)")
PANELS = {"env_steps": "env steps", "updates": "updates", "machine_used": "machine used",
          "used": "experience used", "learner_busy": "learner busy", "agents_idle": "agents idle"}
"""Each case's numbers the figure draws: key -> panel title."""


def _number(text: str) -> float | None:
    text = text.strip(",%")
    return None if text in ("-", "") else float(text)


def case_args(env: str, mode: str) -> list[str]:
    """The config and overrides of one (env, mode) case."""
    if mode == "appo":
        return [str(ROOT / "configs" / f"appo_{env}.yaml")]
    return [str(ROOT / "configs" / f"ppo_{env}.yaml"), "-o", f"learner.on_policy_sync={mode}"]


def parse_summary(stderr: str) -> dict[str, float | None]:
    """The launch summary's totals and whole-run use line."""
    totals, use = TOTALS.search(stderr), USE.search(stderr)
    if totals is None or use is None:
        raise ValueError(f"no launch summary in:\n{stderr[-2000:]}")
    percent = {key: (None if (v := _number(use[key])) is None else v / 100) for key in ("used", "busy", "idle")}
    return {"env_steps": int(totals["steps"]), "updates": int(totals["updates"]), "mean_return": _number(totals["mean"]),
            "used": percent["used"], "policy_lag_p90": _number(use["lag"]), "learner_busy": percent["busy"],
            "agents_idle": percent["idle"], "rho_clipped": None if use["rho"] is None else _number(use["rho"]) / 100,
            "epochs_per_update": None if use["epochs"] is None else float(use["epochs"]),
            "kl_per_update": None if use["kl"] is None else float(use["kl"])}


ROLES = ("learner", "agent", "eval", "redis", "mlflow", "launch")
"""The process roles of a launch's tree, matched in its command lines in this order."""


def process_role(command: str) -> str:
    """Which part of a launch one process is (its command line): a :data:`ROLES` name, or ``other``."""
    if "redis-server" in command:
        return "redis"
    words = command.split()
    if "surreal_redis.tracking" in words or any(os.path.basename(word).startswith("mlflow") for word in words):
        return "mlflow"
    for role in ("learner", "agent", "eval", "launch"):
        if role in words:
            return role
    return "other"


STEADY = (0.2, 0.9)
"""The part of a launch's wall time that ``machine_used_steady`` covers: past start-up (imports,
the first parameters, MLflow's start) and before the shutdown."""


def steady_use(timeline: list[tuple[float, float]], wall: float, cores: int) -> float | None:
    """Machine used between :data:`STEADY`'s fractions of ``wall``, from ``(seconds, CPU-seconds
    so far)`` samples; None with fewer than two samples in that window."""
    inside = [(t, cpu) for t, cpu in timeline if STEADY[0] * wall <= t <= STEADY[1] * wall]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    (t0, cpu0), (t1, cpu1) = inside[0], inside[-1]
    return round((cpu1 - cpu0) / ((t1 - t0) * cores), 3)


def run_case(env: str, mode: str, overrides: list[str], workdir: Path, timeout_s: float) -> dict:
    """One whole launch; its wall time, summary and the CPU-seconds of all its processes."""
    name = f"{env}_{mode}_{len(list(workdir.iterdir()))}"
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", *case_args(env, mode), "-o", f"experiment.root={workdir}",
            "-o", f"experiment.name={name}", "-o", "eval.enabled=false"]
    for override in overrides:
        args += ["-o", override]
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        cpu_by_pid: dict[int, float] = {}
        role_of: dict[int, str] = {}
        timeline: list[tuple[float, float]] = []  # (seconds since start, CPU-seconds of the tree so far)
        while proc.poll() is None:
            if time.monotonic() - started > timeout_s:
                proc.kill()
                raise RuntimeError(f"{env} {mode}: launch still running after {timeout_s} s")
            for pid in process_tree(proc.pid):
                seconds = cpu_seconds(pid)
                if seconds is not None:
                    cpu_by_pid[pid] = seconds
                    if role_of.get(pid, "other") == "other":  # a process just forked may not show its command yet
                        role_of[pid] = process_role(cmdline(pid))
            timeline.append((time.monotonic() - started, sum(cpu_by_pid.values())))
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        stderr.seek(0)
        text = stderr.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{env} {mode}: launch exited {proc.returncode}:\n{text[-3000:]}")
    cpu = sum(cpu_by_pid.values())
    cores = os.cpu_count() or 1
    by_role: dict[str, float] = {}
    for pid, seconds in cpu_by_pid.items():
        by_role[role_of[pid]] = by_role.get(role_of[pid], 0.0) + seconds
    result = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "processes": len(cpu_by_pid),
              "machine_used": round(cpu / (wall * cores), 3), "machine_used_steady": steady_use(timeline, wall, cores),
              "cores_by_role": {role: round(seconds / wall, 2) for role, seconds in sorted(by_role.items())},
              **parse_summary(text)}
    solved = SOLVED.search((workdir / name / "logs" / "learner.log").read_text(errors="replace"))
    result["solved"] = bool(solved and "target_return" in solved["reason"])
    log.info("%s %s: %s", env, mode, result)
    return result


def utilization_panels(result: dict, envs: list[str]) -> list[plots.Bars]:
    """The ``--json`` figure's panels: :data:`PANELS` per env (a bar per mode), then the solve times."""
    panels = [bars for env in envs
              for bars in plots.result_panels(result[env], {key: f"{env}: {title}" for key, title in PANELS.items()})]
    if "cartpole_solve" in result:
        panels += plots.result_panels(result["cartpole_solve"], {"solve_s": "cartpole: seconds to 475"})
    return panels


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="cartpole,halfcheetah")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seconds", type=float, default=60.0, help="learner seconds per case")
    parser.add_argument("--solve", action="store_true", help="also CartPole time to 475 per mode")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON object here, and its bar chart "
                        "beside it (.png)")
    options = parser.parse_args(argv)
    envs, modes = options.envs.split(","), options.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r} (known: {', '.join(MODES)})")
    if options.seconds <= 0:
        parser.error(f"--seconds must be > 0, got {options.seconds}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict[str, object] = {"cores": os.cpu_count(), "seconds": options.seconds, "load_before": os.getloadavg()[0]}
    fixed = [f"stop.max_seconds={options.seconds}", "stop.target_return=null", "stop.max_env_steps=null"]
    with tempfile.TemporaryDirectory(prefix="surreal-utilization-") as tmp:
        workdir = Path(tmp)
        for env in envs:
            cases = {mode: run_case(env, mode, fixed, workdir, options.seconds + 300) for mode in modes}
            base = cases.get("lockstep")
            for case in cases.values():
                if base and base["updates"]:
                    case["updates_vs_lockstep"] = round(case["updates"] / base["updates"], 2)
                    case["env_steps_vs_lockstep"] = round(case["env_steps"] / base["env_steps"], 2)
            result[env] = cases
        if options.solve:
            solve = [f"stop.max_seconds={300}", "stop.max_env_steps=null"]
            times = {}
            for mode in [m for m in modes if m != "free"]:
                case = run_case("cartpole", mode, solve, workdir, 600)
                times[mode] = {"solve_s": case["wall_s"] if case["solved"] else None, "env_steps": case["env_steps"],
                               "machine_used": case["machine_used"]}
            base_s = times.get("lockstep", {}).get("solve_s")
            for case in times.values():
                if base_s and case["solve_s"]:
                    case["solve_s_vs_lockstep"] = round(case["solve_s"] / base_s, 2)
            result["cartpole_solve"] = times
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
        figure = plots.draw_bars(utilization_panels(result, envs), columns=3,
                                 title=f"production modes: {options.seconds:.0f} s launches on {result['cores']} cores")
        log.info("figure: %s", plots.save_beside(figure, options.json))
    return result


if __name__ == "__main__":
    main()
