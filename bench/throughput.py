"""Actor and learner throughput of whole launches: ``python bench/throughput.py [--quick]
[--envs cartpole,halfcheetah,pong] [--agents 1,2,4] [--seconds 40]``.

Baseline, measured in the same run: a plain single-process loop (``make_vector_env`` with the
config's ``num_envs``, the config's PPO policy network acting on CPU with one torch thread,
``step_vector_env``): no Redis, no learner; the ceiling of actor throughput per core. It runs
before each launch and after the last, and each launch is compared with the mean of the plain
loops just before and after it: on a machine shared with other work the CPU cost of a step
drifts with the load, so a baseline measured once at the start compared unlike conditions.

Per env and agent count, ``surreal-redis launch`` of the shipped config (eval off, PPO in its
default lockstep production) runs for ``--seconds``. The learner's status key (written every
second, ``learner.metrics_every_s=1``, polled every ``POLL_S``) and the agents' CPU time
(``/proc/<pid>/stat``, read at each poll, so within ``POLL_S`` of the report it goes with) are
read in a window from the learner's first update to its last report, so start-up is not counted:

- ``env_sps``: env steps/s the agents made (wall time); ``used_sps``: steps/s that reached a
  gradient update (updates x ``steps_per_update``); ``used_fraction``: the learner's whole-run
  ``hub/experience_used_fraction``;
- ``actor_sps_per_core``: env steps per CPU-second of the agent processes; ``per_core_ratio``:
  that over ``plain_sps_per_core``, the plain loop's steps per CPU-second around this launch
  (target >= 0.8). CPU time, not wall time,
  because the cores are shared: with lockstep, agents also wait (idle, no CPU) while the
  learner trains, which ``agent_idle`` reports;
- ``learner_samples_per_s``: samples through gradient steps per second (used steps x
  ``update_epochs``), and ``learner_busy``: the learner's whole-run busy fraction.

Progress goes to stderr; the last line of stdout is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import process_tree  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.throughput")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

ENVS: dict[str, tuple[str, str]] = {
    # name: (shipped config, module that must be installed)
    "cartpole": ("ppo_cartpole.yaml", "gymnasium"),
    "halfcheetah": ("ppo_halfcheetah.yaml", "mujoco"),
    "pong": ("ppo_pong.yaml", "ale_py"),
}
REDIS_URL = re.compile(r"--redis-url (\S+)")
POLL_S = 0.25  # status and agent CPU reads; a report's CPU reading is at most this late


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime (fields 14, 15 of stat)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def plain_loop(config_path: str, seconds: float, overrides: list[str]) -> dict[str, float]:
    """Env steps/s (wall and CPU) of one process stepping the config's vector env with its policy,
    on the backend the agents use (``agent.inference``, after ``overrides``), in a child process
    with the environment ``launch`` gives its agents (one BLAS thread, the same malloc settings)."""
    from surreal_redis.launcher.children import child_env

    command = [sys.executable, __file__, "--plain-case", config_path, "--plain-s", str(seconds)]
    for override in overrides:
        command += ["-o", override]
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(actor=True), timeout=seconds + 300)
    if done.returncode != 0:
        raise RuntimeError(f"the plain loop failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def plain_case(config_path: str, seconds: float, overrides: list[str]) -> dict[str, float]:
    """The plain loop itself (run by :func:`plain_loop` in a child process)."""
    from surreal_redis.algos.policies import make_policy
    from surreal_redis.config import load_config
    from surreal_redis.envs import make_vector_env, step_vector_env

    config = load_config(config_path, overrides)
    envs = make_vector_env(config.env, seed=0)
    policy = make_policy(config.algo_config, envs.single_observation_space, envs.single_action_space,
                         envs.num_envs, agent_id=0, num_agents=1, seed=0, inference=config.agent.inference)
    if "torch" in sys.modules:  # as the agents (one core each)
        sys.modules["torch"].set_num_threads(1)
    obs, _ = envs.reset(seed=0)
    for _ in range(20):  # warm up (first calls allocate)
        obs = step_vector_env(envs, policy.act(obs).actions).obs
    steps, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            obs = step_vector_env(envs, policy.act(obs).actions).obs
        steps += 50 * envs.num_envs
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    envs.close()
    return {"plain_sps": steps / wall, "plain_sps_per_core": steps / max(cpu, 1e-9), "num_envs": envs.num_envs}


@dataclass
class Sample:
    """One learner report with the agents' CPU seconds read when it was seen."""

    time: float
    iteration: int
    env_steps: int
    agent_cpu_s: float


class AgentClock:
    """Sums the CPU seconds of every agent process of a launch, keeping the last reading of
    agents that have exited (or were restarted)."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}

    def read(self, root: int) -> float:
        for pid in process_tree(root):
            if re.search(r"surreal_redis\.cli .* agent ", cmdline(pid)):
                seconds = cpu_seconds(pid)
                if seconds is not None:
                    self.last[pid] = seconds
        return sum(self.last.values())


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def launch_case(config_path: str, agents: int, seconds: float, workdir: Path, overrides: list[str]) -> dict:
    """Run one launch and measure it from its learner's first update to its last report."""
    from surreal_redis.config import load_config
    from surreal_redis.connection import connect
    from surreal_redis.hub.run.control import RunControl

    name = f"{Path(config_path).stem}_{agents}a"
    config = load_config(config_path, overrides)
    args = [sys.executable, "-m", "surreal_redis.cli", "launch", config_path, "--agents", str(agents),
            "-o", f"experiment.root={workdir}", "-o", f"experiment.name={name}", "-o", f"stop.max_seconds={seconds}",
            "-o", "eval.enabled=false", "-o", "learner.metrics_every_s=1"]
    for override in overrides:
        args += ["-o", override]
    clock, samples, status, client = AgentClock(), [], {}, None
    with open(workdir / f"{name}.log", "w") as out:
        launch = subprocess.Popen(args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        try:
            while launch.poll() is None:
                time.sleep(POLL_S)
                agent_cpu = clock.read(launch.pid)
                if client is None:
                    urls = [m.group(1) for pid in process_tree(launch.pid) if (m := REDIS_URL.search(cmdline(pid)))]
                    client = connect(urls[0]) if urls else None
                    continue
                try:
                    status = RunControl(client, name).learner_status() or status
                except Exception as exc:  # noqa: BLE001  the run's Redis goes away as it ends
                    log.debug("status read failed: %s", exc)
                    continue
                if status and status.get("iteration", 0) >= 1 and (not samples or status["time"] != samples[-1].time):
                    samples.append(Sample(status["time"], status["iteration"], status["env_steps"], agent_cpu))
        finally:
            if launch.poll() is None:
                launch.terminate()
                launch.wait(30)
    if launch.returncode != 0:
        tail = (workdir / f"{name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"launch of {config_path} with {agents} agents exited {launch.returncode}:\n{tail}")
    if len(samples) < 2:
        return {"agents": agents, "error": f"fewer than 2 learner reports after the first update ({len(samples)})"}
    first, last = samples[0], samples[-1]
    span, agent_cpu = last.time - first.time, last.agent_cpu_s - first.agent_cpu_s
    env_steps, used = last.env_steps - first.env_steps, (last.iteration - first.iteration) * config.learner.steps_per_update
    epochs = getattr(config.algo_config, "update_epochs", 1)
    return {
        "agents": agents,
        "window_s": round(span, 1),
        "env_sps": round(env_steps / span, 1),
        "used_sps": round(used / span, 1),
        "used_fraction": _rounded(status.get("experience_used_fraction")),
        "actor_sps_per_core": round(env_steps / max(agent_cpu, 1e-9), 1),
        "agent_cpu_cores": round(agent_cpu / span, 2),
        "learner_samples_per_s": round(used * epochs / span, 1),
        "learner_busy": _rounded(status.get("learner_busy_total")),
        "agent_idle": _rounded(status.get("agent_idle_total")),
        "policy_lag_p90": status.get("policy_lag_p90"),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 s launches, 5 s plain loops")
    parser.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated, of {', '.join(ENVS)}")
    parser.add_argument("--agents", default="1,2,4", help="comma-separated agent counts")
    parser.add_argument("--seconds", type=float, default=None, help="stop.max_seconds per launch (default 40, quick 20)")
    parser.add_argument("--plain-s", type=float, default=None, help="seconds of the plain loop (default 10, quick 5)")
    parser.add_argument("-o", "--override", action="append", default=[], help="config override for every launch")
    parser.add_argument("--plain-case", default=None, help=argparse.SUPPRESS)  # internal: one plain loop
    options = parser.parse_args(argv)
    if options.plain_case:
        print(json.dumps(plain_case(options.plain_case, options.plain_s, options.override)))
        return {}
    names = [n for n in options.envs.split(",") if n]
    unknown = [n for n in names if n not in ENVS]
    if unknown:
        parser.error(f"unknown envs {unknown}; known: {', '.join(ENVS)}")
    try:
        agent_counts = [int(a) for a in options.agents.split(",") if a]
    except ValueError:
        parser.error(f"--agents must be comma-separated integers, got {options.agents!r}")
    if not agent_counts or min(agent_counts) < 1:
        parser.error(f"--agents needs counts >= 1, got {options.agents!r}")
    seconds = options.seconds if options.seconds is not None else (20.0 if options.quick else 40.0)
    plain_s = options.plain_s if options.plain_s is not None else (5.0 if options.quick else 10.0)
    if seconds <= 0 or plain_s <= 0:
        parser.error(f"--seconds and --plain-s must be > 0, got {seconds}, {plain_s}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    results: dict[str, object] = {"cores": os.cpu_count(), "seconds_per_launch": seconds}
    with tempfile.TemporaryDirectory(prefix="surreal-throughput-") as tmp:
        for name in names:
            config_file, module = ENVS[name]
            if importlib.util.find_spec(module) is None:
                log.info("%s: skipped (%s is not installed)", name, module)
                results[name] = "not installed"
                continue
            config_path = str(ROOT / "configs" / config_file)
            plains = [plain_loop(config_path, plain_s, options.override)]
            log.info("%s plain loop: %s", name, plains[-1])
            cases = []
            for agents in agent_counts:
                case = launch_case(config_path, agents, seconds, Path(tmp), options.override)
                plains.append(plain_loop(config_path, plain_s, options.override))
                log.info("%s plain loop: %s", name, plains[-1])
                around = (plains[-2]["plain_sps_per_core"] + plains[-1]["plain_sps_per_core"]) / 2
                case["plain_sps_per_core"] = round(around, 1)
                if "actor_sps_per_core" in case:
                    case["per_core_ratio"] = round(case["actor_sps_per_core"] / around, 3)
                log.info("%s, %d agents: %s", name, agents, case)
                cases.append(case)
            mean = {k: round(sum(p[k] for p in plains) / len(plains), 1) for k in plains[0]}
            results[name] = {**mean, "launches": cases}
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
