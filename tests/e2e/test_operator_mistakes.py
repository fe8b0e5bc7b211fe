"""End to end: what an operator does by mistake must not damage a live run. A second launch of a
live run (``--fresh``, ``--resume`` or plain) is refused before it moves or deletes anything;
Ctrl-C exits 130 (not 0, a finished run's code); a second Ctrl-C still closes the MLflow run as
KILLED and says what was not saved. Embedded Redis, configs/smoke.yaml, under a minute each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from surreal_redis.connection import connect
from surreal_redis.embedded import find_redis_server

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
LONG = ("-o", "stop.max_env_steps=10000000", "-o", "stop.max_seconds=600", "-o", "eval.enabled=false",
        "--agents", "1")


@pytest.fixture(autouse=True)
def _needs_redis_server():
    if find_redis_server() is None:
        pytest.skip("no redis-server")


def start_launch(tmp_path: Path, *args: str) -> subprocess.Popen:
    """A launch in a session of its own (a terminal's Ctrl-C goes to its process group)."""
    return subprocess.Popen([*CLI, "launch", SMOKE, "-o", f"experiment.root={tmp_path}", *LONG, *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def learner_iteration(folder: Path) -> int:
    """The update the run's learner last reported, through the Redis URL its launcher announced."""
    try:
        url = json.loads((folder / "hub.json").read_text())["url"]
        raw = connect(url).get("sr:{smoke}:learner")
    except (OSError, ValueError, KeyError):
        return 0
    except Exception:  # the embedded Redis is still starting
        return 0
    return int(json.loads(raw).get("iteration", 0)) if raw else 0


def wait_for_updates(proc: subprocess.Popen, folder: Path, updates: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while learner_iteration(folder) < updates:
        if proc.poll() is not None:
            pytest.fail(f"launch exited with {proc.returncode}:\n{proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {updates} learner updates within {timeout}s")
        time.sleep(0.3)


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def mlflow_status(folder: Path) -> str:
    from mlflow.tracking import MlflowClient

    run_id = (folder / "mlflow_run_id").read_text().strip()
    return MlflowClient(tracking_uri=f"sqlite:///{folder.resolve()}/mlflow.db").get_run(run_id).info.status


def test_a_second_launch_of_a_live_run_is_refused_before_it_moves_anything(tmp_path):
    folder = tmp_path / "smoke"
    first = start_launch(tmp_path, "-o", "tracking.enabled=false")
    try:
        wait_for_updates(first, folder, 1)
        for flag in ("--fresh", "--resume", None):
            second = subprocess.run([*CLI, "launch", SMOKE, "-o", f"experiment.root={tmp_path}",
                                     "-o", "stop.max_env_steps=1", "-o", "tracking.enabled=false",
                                     *([flag] if flag else [])],
                                    cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert second.returncode == 1, (flag, second.stderr[-3000:])
            message = second.stderr.strip().splitlines()[-1]
            assert "is live" in message and f"pid {first.pid}" in message, (flag, message)
            assert "nothing was moved or deleted" in message, (flag, message)
            assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke"], flag  # not moved aside
            assert json.loads((folder / "hub.json").read_text())["pid"] == first.pid, flag
        os.killpg(first.pid, signal.SIGINT)
        out, _ = first.communicate(timeout=60)
    finally:
        kill_group(first)
    assert "run 'smoke' interrupted" in out, out[-3000:]
    assert "learner crashed" not in out and "exited with code" not in out
    assert list((folder / "checkpoints").glob("ckpt-*.pt"))  # the first run's final checkpoint is there


def test_ctrl_c_exits_130_not_the_code_of_a_finished_run(tmp_path):
    proc = start_launch(tmp_path)
    try:
        wait_for_updates(proc, tmp_path / "smoke", 1)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 130, out[-4000:]
    assert "run 'smoke' interrupted (signal SIGINT; MLflow marks it KILLED)" in out
    assert mlflow_status(tmp_path / "smoke") == "KILLED"


def test_a_second_ctrl_c_still_marks_the_mlflow_run_killed_and_says_what_was_not_saved(tmp_path):
    folder = tmp_path / "smoke"
    proc = start_launch(tmp_path, "-o", "checkpoint.every_updates=1000")
    try:
        wait_for_updates(proc, folder, 2)
        deadline = time.monotonic() + 60  # the learner opens its MLflow run after its first update
        while not (folder / "mlflow_run_id").exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert mlflow_status(folder) == "RUNNING"
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        os.killpg(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while not any("stopping: signal SIGINT" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.005)
        # The launcher took the first; the learner is writing its final checkpoint and MLflow run (a
        # fixed sleep here once lost the race to a fast stop)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        out = "".join(lines)
    finally:
        kill_group(proc)
    deadline = time.monotonic() + 30  # the tracking process closes the run once the learner is gone
    while mlflow_status(folder) == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert mlflow_status(folder) == "KILLED"
    assert proc.returncode == 130, out[-4000:]
    (line,) = [line for line in out.splitlines() if "second SIGINT" in line]
    assert "not saved" in line or "is saved" in line, line
    assert "MLflow run" in line and "KILLED" in line, line
