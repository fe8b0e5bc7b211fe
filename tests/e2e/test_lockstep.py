"""End to end: launches of the smoke config through the real CLI with production on grants, in
lockstep (the default for PPO) and overlapped, and of the APPO CartPole config (as shipped, on
grants one batch ahead, and with agents producing freely; every update all its epochs): nearly every env step the agents make reaches a gradient
update, and the launcher's summary and MLflow say so. About 15 s each on 2 cores."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from surreal_redis.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SMOKE = str(CONFIGS / "smoke.yaml")
SUMMARY = re.compile(r"experience used (?P<used>[\d.]+)% \(\+(?P<unused>\d+) steps unused at the stop\), policy lag "
                     r"p90 (?P<lag>\d+) \((?P<shares>[^)]*)\), passes/sample (?P<passes>[\d.]+), kl/update [^,]+, "
                     r"learner busy (?P<busy>\d+)%, agents idle (?P<idle>\d+)% \[(?P<sync>\w+)\]")
FREE = ("learner.on_policy_sync=free", "hub.sender.max_lag=16", "replay.fifo.max_policy_lag=8", "agent.nice=10",
        "learner.prefetch_chunks=8", "learner.receive_batch=4")
"""appo_cartpole.yaml with agents producing freely, as appo_pong.yaml's do (the backlog bounds
appo_halfcheetah.yaml had until 2026-12-05, scaled to CartPole's 256-step updates)."""


def final_metrics(experiment: Path) -> dict[str, float]:
    run_id = (experiment / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{experiment.resolve()}/mlflow.db")
    return client.get_run(run_id).data.metrics  # the last value of each


def launch_smoke(tmp_path: Path, sync: str) -> tuple[re.Match, dict[str, float]]:
    done = subprocess.run([sys.executable, "-m", "surreal_redis.cli", "launch", SMOKE, "-o", f"experiment.root={tmp_path}",
                           "-o", "eval.enabled=false", "-o", f"learner.on_policy_sync={sync}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "run 'smoke' finished (reached" in done.stderr, done.stderr[-4000:]
    summary = SUMMARY.search(done.stderr)
    assert summary and summary["sync"] == sync, done.stderr[-4000:]
    return summary, final_metrics(tmp_path / "smoke")


def test_a_lockstep_launch_uses_nearly_every_step_and_drops_none_as_stale(tmp_path):
    summary, metrics = launch_smoke(tmp_path, "lockstep")
    assert float(summary["used"]) >= 95.0 and int(summary["lag"]) == 0
    assert summary["shares"].startswith("0:"), summary["shares"]  # the lag histogram: nearly all at 0
    assert 0 < int(summary["busy"]) <= 100 and 0 < int(summary["idle"]) <= 100
    assert metrics["hub/experience_used_fraction"] >= 0.95
    assert metrics["system/replay_dropped_stale_steps"] == 0 and metrics["hub/experience_wasted_steps_total"] == 0
    assert metrics["hub/policy_lag_max"] <= 1 and metrics["hub/lockstep_topups_total"] == 0
    # every step the learner took in was used, but for what it held at the stop
    assert metrics["hub/experience_used_steps_total"] + metrics["hub/experience_held_steps"] == metrics["charts/env_steps"]
    assert 0 <= metrics["system/learner_busy_fraction"] <= 1 and 0 <= metrics["hub/agent_idle_fraction"] <= 1


def test_an_overlapped_launch_uses_nearly_every_step_one_version_behind(tmp_path):
    summary, metrics = launch_smoke(tmp_path, "overlap")
    assert float(summary["used"]) >= 95.0 and int(summary["lag"]) == 1  # made while the learner trained
    assert metrics["hub/experience_used_fraction"] >= 0.95 and metrics["hub/lockstep_topups_total"] == 0


@pytest.mark.parametrize("sync", ["overlap", "free"])
def test_an_appo_launch_uses_nearly_every_step_each_for_all_its_passes(tmp_path, sync):
    """appo_cartpole.yaml for 30k env steps, as shipped (agents one batch ahead on grants) and with
    free agents (never waiting for grants; the learner takes what arrives within max_policy_lag):
    nearly every step used, each update ran all update_epochs epochs, and on grants the steps
    lagged one version (two for a flush that straddled an update, which V-trace keeps)."""
    overrides = FREE if sync == "free" else ()
    done = subprocess.run([sys.executable, "-m", "surreal_redis.cli", "launch", str(CONFIGS / "appo_cartpole.yaml"),
                           "-o", f"experiment.root={tmp_path}", "-o", "eval.enabled=false", "-o", "stop.target_return=null",
                           "-o", "stop.max_env_steps=30000", *(arg for o in overrides for arg in ("-o", o))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "run 'appo_cartpole' finished (reached" in done.stderr, done.stderr[-4000:]
    use = re.search(r"experience used (?P<used>[\d.]+)% .*policy lag p90 (?P<lag>\d+) .*, rho clipped (?P<rho>\d+)%, "
                    r"passes/sample (?P<epochs>[\d.]+), kl/update [^,]+, learner busy (?P<busy>\d+)%, "
                    r"agents idle (?P<idle>\d+)% \[(?P<sync>\w+)\]", done.stderr)
    assert use and use["sync"] == sync, done.stderr[-4000:]
    most = load_config(str(CONFIGS / "appo_cartpole.yaml")).algo_config.update_epochs
    assert float(use["used"]) >= 95.0 and float(use["epochs"]) == most and 0 <= int(use["rho"]) <= 100
    metrics = final_metrics(tmp_path / "appo_cartpole")
    assert metrics["hub/experience_used_fraction"] >= 0.95 and metrics["charts/env_steps"] >= 30000
    assert metrics["losses/epochs"] == most and "losses/rho_clipped_fraction" in metrics
    if sync == "overlap":
        assert int(use["lag"]) == 1 and metrics["hub/policy_lag_max"] <= 2
        assert metrics["system/replay_dropped_stale_steps"] <= 0.01 * metrics["charts/env_steps"]
