"""bench/utilization.py reads the launch summary the launcher really prints (no launches here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from surreal_redis.learner_metrics import use_summary

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def utilization(request):
    sys.path.insert(0, str(BENCH))
    request.addfinalizer(lambda: sys.path.remove(str(BENCH)))
    return importlib.import_module("utilization")


def test_the_summary_the_launcher_prints_is_parsed(utilization):
    status = {"experience_used_fraction": 0.987, "experience_unused_at_stop": 64, "policy_lag_p90": 3.0,
              "policy_lag_shares": {"0": 0.5, "1": 0.25, "2": 0.25, "3-4": 0.0}, "rho_clipped_fraction": 0.125,
              "learner_busy_total": 0.81, "agent_idle_total": 0.07, "sync": "free"}
    text = (f"run 'x' finished (max_seconds)\n  5120 env steps, 20 updates, mean return 41.5, last eval -\n"
            f"  {use_summary(status, whole_run=True)}\n")
    parsed = utilization.parse_summary(text)
    assert parsed == {"env_steps": 5120, "updates": 20, "mean_return": 41.5, "used": pytest.approx(0.987),
                      "policy_lag_p90": 3.0, "learner_busy": pytest.approx(0.81), "agents_idle": pytest.approx(0.07),
                      "rho_clipped": pytest.approx(0.12)}
    assert "policy lag p90 3 (0:50% 1:25% 2:25%), rho clipped 12%, learner busy 81%" in text
    unknown = utilization.parse_summary("  0 env steps, 0 updates, mean return -, last eval -\n  "
                                        + use_summary({}, whole_run=True))
    assert unknown["used"] is None and unknown["learner_busy"] is None and unknown["mean_return"] is None
    assert unknown["rho_clipped"] is None
    with pytest.raises(ValueError, match="no launch summary"):
        utilization.parse_summary("Traceback ...")


def test_each_mode_launches_its_config(utilization):
    assert utilization.case_args("cartpole", "appo")[-1].endswith("configs/appo_cartpole.yaml")
    assert utilization.case_args("cartpole", "free")[1:] == ["-o", "learner.on_policy_sync=free"]
    for env in ("cartpole", "halfcheetah"):
        for mode in utilization.MODES:
            assert Path(utilization.case_args(env, mode)[0]).name in {f"ppo_{env}.yaml", f"appo_{env}.yaml"}
    with pytest.raises(SystemExit):
        utilization.main(["--modes", "lockstep,turbo"])
