"""Memory of a whole ``launch``: ``python bench/memory.py [--config configs/ppo_pong.yaml]
[--agents 4] [--seconds 90] [-o key=value ...]``.

Runs ``surreal-redis launch`` and samples every process of its tree (launcher, learner, agents,
eval, the embedded redis-server) every ``--every-s`` seconds from ``/proc``: RSS (``VmRSS``,
counts shared pages once per process) and PSS (``smaps_rollup``, shares them out, so the PSS of
all processes adds up to what the run really holds). Reports the peak of the summed PSS and RSS,
each role's peak, and each role's share at the sample of the summed-RSS peak (RSS, PSS, private
anonymous memory -- heap, tensors, arrays -- and shared pages -- libraries mapped by several
processes, counted again in each one's RSS), against a baseline: one bare interpreter that imported
what an agent imports (torch, gymnasium, the env family) and nothing else, i.e. the fixed cost every
process pays.

Progress goes to stderr; the last line of stdout is one JSON object with the results (MiB).
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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.memory")
MIB = 1 << 20

ROLE = re.compile(r"surreal[_-]redis(?:\.cli)? .*?\b(learner|agent|eval|launch)\b(?: --id (\d+))?")
BASELINE_IMPORTS = ("import torch, gymnasium, numpy; import surreal_redis.agent; "
                    "import importlib.util as u; u.find_spec('ale_py') and __import__('ale_py')")


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/<pid>/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def process_tree(root: int) -> list[int]:
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += children(pid)
    return seen


class Memory(NamedTuple):
    """One process's memory in bytes: ``anon`` is private anonymous memory (heap, tensors, arrays),
    ``shared`` the resident pages other processes map too (each process's RSS counts them)."""

    rss: int
    pss: int
    anon: int
    shared: int


def memory_of(pid: int) -> Memory | None:
    """The memory of one process, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    rss = re.search(r"VmRSS:\s+(\d+) kB", status)
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB", rollup, re.MULTILINE))
    if rss is None or "Pss" not in fields:  # a zombie
        return None
    kib = {name: int(fields.get(name, 0)) * 1024 for name in ("Pss", "Anonymous", "Shared_Clean", "Shared_Dirty")}
    return Memory(int(rss.group(1)) * 1024, kib["Pss"], kib["Anonymous"], kib["Shared_Clean"] + kib["Shared_Dirty"])


def role_of(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    return role_from_cmdline(cmdline)


def role_from_cmdline(cmdline: str) -> str:
    """``launch``, ``learner``, ``agent<id>``, ``eval``, ``mlflow`` (the learner's tracking
    process), ``redis-server`` or ``other``."""
    if "redis-server" in cmdline:
        return "redis-server"
    if "surreal_redis.tracking" in cmdline:
        return "mlflow"
    match = ROLE.search(cmdline)
    if match is None:
        return "other"
    role, agent_id = match.groups()
    return f"agent{agent_id}" if role == "agent" and agent_id else role


def baseline() -> tuple[float, float]:
    """(RSS, PSS) in MiB of a bare interpreter that imported what an agent imports."""
    probe = subprocess.Popen([sys.executable, "-c", BASELINE_IMPORTS + "; import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, cwd=ROOT)
    try:
        time.sleep(1.0)
        while True:  # wait until the imports are done (RSS stops growing)
            before = memory_of(probe.pid)
            time.sleep(1.0)
            after = memory_of(probe.pid)
            if before is None or after is None or after.rss <= before.rss:
                break
        return (after.rss / MIB, after.pss / MIB) if after is not None else (0.0, 0.0)
    finally:
        probe.communicate(b"")


def measure(args: list[str], every_s: float, workdir: Path) -> dict:
    """Run ``args`` and sample its process tree until it exits; peaks in MiB."""
    peak_total_pss = peak_total_rss = 0.0
    peak_by_role: dict[str, dict[str, float]] = {}
    at_peak: dict[str, dict[str, float]] = {}  # each role's memory at the sample of the summed-RSS peak
    with open(workdir / "launch.log", "w") as out:
        launch = subprocess.Popen(args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        while launch.poll() is None:
            sample: dict[str, dict[str, float]] = {}
            for pid in process_tree(launch.pid):
                mem = memory_of(pid)
                if mem is None:
                    continue
                name = role_of(pid)
                if name in sample:  # two processes of one role (an agent's restart): both count
                    name = f"{name}#{pid}"
                sample[name] = {field: value / MIB for field, value in mem._asdict().items()}
                role = peak_by_role.setdefault(role_of(pid), {"rss": 0.0, "pss": 0.0})
                role["rss"], role["pss"] = max(role["rss"], mem.rss / MIB), max(role["pss"], mem.pss / MIB)
            total_rss = sum(m["rss"] for m in sample.values())
            if total_rss > peak_total_rss:
                peak_total_rss, at_peak = total_rss, sample
            peak_total_pss = max(peak_total_pss, sum(m["pss"] for m in sample.values()))
            time.sleep(every_s)
    tail = (workdir / "launch.log").read_text(errors="replace")[-3000:]
    if launch.returncode != 0:
        raise RuntimeError(f"launch exited {launch.returncode}:\n{tail}")
    log.info("launch output (tail):\n%s", tail)
    return {"peak_total_pss_mib": round(peak_total_pss), "peak_total_rss_mib": round(peak_total_rss),
            "by_role_peak_mib": {role: {k: round(v) for k, v in peaks.items()}
                                 for role, peaks in sorted(peak_by_role.items())},
            "at_rss_peak_mib": {role: {k: round(v) for k, v in mem.items()} for role, mem in sorted(at_peak.items())}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "ppo_pong.yaml"))
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=90.0, help="stop.max_seconds of the run")
    parser.add_argument("--every-s", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("-o", "--override", action="append", default=[], help="config override, as launch's -o")
    options = parser.parse_args(argv)
    if options.agents < 1 or options.seconds <= 0 or options.every_s <= 0:
        parser.error(f"need --agents >= 1, --seconds > 0, --every-s > 0; got {options.agents}, "
                     f"{options.seconds}, {options.every_s}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    base_rss, base_pss = baseline()
    log.info("baseline process (imports only): RSS %.0f MiB, PSS %.0f MiB", base_rss, base_pss)
    with tempfile.TemporaryDirectory(prefix="surreal-memory-") as tmp:
        args = [sys.executable, "-m", "surreal_redis.cli", "launch", options.config, "--agents", str(options.agents),
                "-o", f"experiment.root={tmp}", "-o", f"stop.max_seconds={options.seconds}"]
        for override in options.override:
            args += ["-o", override]
        result = measure(args, options.every_s, Path(tmp))
    result.update(config=Path(options.config).name, agents=options.agents, seconds=options.seconds,
                  cores=os.cpu_count(), baseline_process_rss_mib=round(base_rss),
                  baseline_process_pss_mib=round(base_pss), overrides=options.override)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
