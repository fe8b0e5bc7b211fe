"""The extensibility check: an algorithm defined entirely inside the test folder
(tests/plugins/toy_pg.py: its declaration, trainer, policy and config) runs end to end through
``launch`` on a real Redis (agents, learner, eval, checkpoints, MLflow, rollout), with no file of
the package touched. The config names the module (``plugins``) and every process imports it."""

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
TOY = ["-o", "plugins=[toy_pg]", "-o", "algo=toy_pg", "-o", "ppo=null", "-o", "toy_pg.learning_rate=0.05"]


def run_cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_plugin_algorithm_runs_through_launch(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    done = run_cli("launch", str(ROOT / "configs" / "smoke.yaml"), "--agents", "2", *TOY,
                   "-o", f"experiment.root={tmp_path}", "-o", "experiment.name=toy", "-o", "stop.max_env_steps=3000",
                   "-o", "stop.target_return=null", "-o", "eval.every_s=1", "-o", "checkpoint.every_updates=2",
                   cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "run 'toy' finished" in done.stderr
    experiment = tmp_path / "toy"
    learner_log = (experiment / "logs" / "learner.log").read_text()
    assert "Traceback" not in learner_log
    checkpoints = sorted((experiment / "checkpoints").glob("ckpt-*.pt"))
    assert checkpoints, "no checkpoint written"
    agent_logs = [p.read_text() for p in (experiment / "logs").glob("agent-*.log")]
    assert len(agent_logs) == 2 and all("Traceback" not in log for log in agent_logs)

    from mlflow.tracking import MlflowClient

    run_id = (experiment / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{experiment.resolve()}/mlflow.db")
    run = client.get_run(run_id)
    assert run.data.params["algo"] == "toy_pg" and run.data.params["toy_pg.learning_rate"] == "0.05"
    assert "losses/toy_grad_norm" in run.data.metrics
    assert run.data.metrics["charts/env_steps"] >= 3000

    rollout = run_cli("rollout", str(checkpoints[-1]), "--episodes", "1", cwd=tmp_path, timeout=120)
    assert rollout.returncode == 0, rollout.stderr[-4000:]
