"""End to end: a lockstep launch (the default for PPO) of the smoke config through the real CLI:
nearly every env step the agents make reaches a gradient update, none is dropped as stale, and the
launcher's summary, MLflow and the learner's log say so. About 15 s on 2 cores."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
SUMMARY = re.compile(r"experience used (?P<used>[\d.]+)% \(\+(?P<unused>\d+) steps unused at the stop\), policy lag "
                     r"p90 (?P<lag>\d+), learner busy (?P<busy>\d+)%, agents idle (?P<idle>\d+)% \[lockstep\]")


def final_metrics(experiment: Path) -> dict[str, float]:
    run_id = (experiment / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{experiment.resolve()}/mlflow.db")
    return client.get_run(run_id).data.metrics  # the last value of each


def test_a_lockstep_launch_uses_nearly_every_step_and_drops_none_as_stale(tmp_path):
    done = subprocess.run([sys.executable, "-m", "surreal_redis.cli", "launch", SMOKE, "-o", f"experiment.root={tmp_path}",
                           "-o", "eval.enabled=false"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "run 'smoke' finished (reached" in done.stderr, done.stderr[-4000:]
    summary = SUMMARY.search(done.stderr)
    assert summary, done.stderr[-4000:]
    assert float(summary["used"]) >= 95.0 and int(summary["lag"]) <= 1
    assert 0 < int(summary["busy"]) <= 100 and 0 < int(summary["idle"]) <= 100

    metrics = final_metrics(tmp_path / "smoke")
    assert metrics["hub/experience_used_fraction"] >= 0.95
    assert metrics["system/replay_dropped_stale_steps"] == 0 and metrics["hub/experience_wasted_steps_total"] == 0
    assert metrics["hub/policy_lag_max"] <= 1 and metrics["hub/lockstep_topups_total"] == 0
    # every step the learner took in was used, but for what it held at the stop
    assert metrics["hub/experience_used_steps_total"] + metrics["hub/experience_held_steps"] == metrics["charts/env_steps"]
    assert 0 < metrics["system/learner_busy_fraction"] <= 1 and 0 <= metrics["hub/agent_idle_fraction"] <= 1
