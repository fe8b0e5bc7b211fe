"""bench/utilization.py reads the launch summary the launcher really prints, and draws its result
beside its JSON (no launches here)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from surreal_redis import plots
from surreal_redis.learner.metrics import use_summary

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
                      "rho_clipped": pytest.approx(0.12), "epochs_per_update": None, "kl_per_update": None}
    assert "policy lag p90 3 (0:50% 1:25% 2:25%), rho clipped 12%, learner busy 81%" in text
    on_policy = dict(status, epochs_per_update_total=19.75, epochs_per_update=20.0, kl_per_update=0.0123)
    text = text.replace(use_summary(status, whole_run=True), use_summary(on_policy, whole_run=True))
    # the reuse per sample (the whole run's mean) and the KL per update
    assert "rho clipped 12%, passes/sample 19.8, kl/update 0.012, learner busy 81%" in text
    parsed = utilization.parse_summary(text)
    assert parsed["epochs_per_update"] == 19.8 and parsed["kl_per_update"] == pytest.approx(0.012)
    assert ", passes/sample 20.0, kl/update 0.012," in use_summary(on_policy)  # the last flush window's
    small = utilization.parse_summary(text.replace("kl/update 0.012", "kl/update 5.4e-05"))
    assert small["kl_per_update"] == pytest.approx(5.4e-5)
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


def test_json_writes_the_result_and_its_bars_beside_it(utilization, monkeypatch, tmp_path):
    """A bar per mode in each PANELS panel of each env, and the solve times; the JSON is the result."""
    numbers = {"lockstep": (100, 6400, 0.9, True), "free": (150, 9600, 1.0, False), "appo": (140, 9000, 0.95, True)}

    def fake_case(env, mode, overrides, workdir, timeout_s):
        updates, steps, machine, solved = numbers[mode]
        return {"wall_s": 40.0 if mode == "lockstep" else 30.0, "updates": updates, "env_steps": steps,
                "machine_used": machine, "used": 1.0, "learner_busy": 0.5, "agents_idle": None, "solved": solved}

    monkeypatch.setattr(utilization, "run_case", fake_case)
    out = tmp_path / "modes.json"
    result = utilization.main(["--envs", "cartpole", "--modes", "lockstep,free,appo", "--solve", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    panels = utilization.utilization_panels(result, ["cartpole"])
    assert [p.title for p in panels] == [f"cartpole: {title}" for title in utilization.PANELS.values()] + [
        "cartpole: seconds to 475"]
    assert panels[0].labels == ("lockstep", "free", "appo") and panels[0].values == (6400, 9600, 9000)
    assert panels[-1].labels == ("lockstep", "appo") and panels[-1].values == (40.0, 30.0)  # free is not timed to the target
    figure = plots.draw_bars(panels, columns=3)
    assert [p.get_height() for p in figure.axes[1].patches] == [100.0, 150.0, 140.0]
    assert [t.get_text() for t in figure.axes[5].texts] == ["n/a", "n/a", "n/a"]  # agents idle unmeasured


def test_steady_use_is_the_machine_used_between_start_up_and_shutdown(utilization):
    """CPU-seconds of the samples inside 20%..90% of the wall time, over that span and the cores."""
    timeline = [(0.0, 0.0), (10.0, 5.0), (20.0, 15.0), (30.0, 35.0), (40.0, 55.0), (50.0, 75.0), (60.0, 80.0)]
    assert utilization.steady_use(timeline, 60.0, 2) == 1.0  # samples at 20..50 s: 60 CPU-s in 30 s on 2 cores
    assert utilization.steady_use(timeline, 60.0, 4) == 0.5
    assert utilization.steady_use([(0.0, 0.0), (59.0, 10.0)], 60.0, 2) is None  # nothing inside the window
