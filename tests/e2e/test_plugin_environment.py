"""The extensibility check for environments: tests/plugins/corridor.py, a gymnasium env defined
entirely inside the test folder, is trained through ``launch`` on a real Redis by both doors
docs/environments.md shows, with no file of the package touched:

- ``env.env_id: corridor:Corridor-v0``: gymnasium imports the module, which registers the id;
- ``plugins: [corridor]`` with ``env.family: corridor``: the module registers a family by name.

The corridor pays 1.0 on reaching its end and 0 otherwise, and an episode takes at least
``cells - 1`` steps: the returns and lengths MLflow logged show which env the agents ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from surreal_redis.embedded import find_redis_server

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]


def run_cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def launch_corridor(tmp_path: Path, name: str, *overrides: str) -> dict[str, list[float]]:
    """A short smoke run on the corridor; returns the logged ``charts/episode_return`` and
    ``charts/episode_length`` histories (means over each metrics interval)."""
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    done = run_cli("launch", str(ROOT / "configs" / "smoke.yaml"), "--agents", "2", *overrides,
                   "-o", f"experiment.root={tmp_path}", "-o", f"experiment.name={name}",
                   "-o", "stop.max_env_steps=3000", "-o", "stop.target_return=null", "-o", "eval.every_s=1",
                   cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"run '{name}' finished" in done.stderr
    experiment = tmp_path / name
    logs = [p.read_text() for p in (experiment / "logs").glob("*.log")]
    assert len(logs) >= 3 and all("Traceback" not in log for log in logs)

    from mlflow.tracking import MlflowClient

    run_id = (experiment / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{experiment.resolve()}/mlflow.db")
    metrics = client.get_run(run_id).data.metrics
    assert metrics["charts/env_steps"] >= 3000 and any(key.startswith("losses/") for key in metrics)  # it trained
    return {key: [m.value for m in client.get_metric_history(run_id, f"charts/{key}")]
            for key in ("episode_return", "episode_length")}


def test_an_env_registered_with_gymnasium_runs_by_its_module_path(tmp_path):
    history = launch_corridor(tmp_path, "corridor_id", "-o", "env.env_id=corridor:Corridor-v0")
    returns, lengths = history["episode_return"], history["episode_length"]
    assert returns and all(0.0 <= r <= 1.0 for r in returns) and max(returns) > 0
    assert lengths and all(4 <= n <= 20 for n in lengths)  # 5 cells, cut at 20 steps


def test_an_env_family_registered_by_a_plugin_runs_by_name(tmp_path):
    history = launch_corridor(tmp_path, "corridor_family", "-o", "plugins=[corridor]", "-o", "env.family=corridor",
                              "-o", "env.env_id=corridor-3", "-o", "env.max_episode_steps=8")
    returns, lengths = history["episode_return"], history["episode_length"]
    assert returns and all(0.0 <= r <= 1.0 for r in returns) and max(returns) > 0
    assert lengths and all(2 <= n <= 8 for n in lengths)  # 3 cells, cut at 8 steps
