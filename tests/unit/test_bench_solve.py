"""bench/solve.py splits a launch into start-up (launch to the learner's first update) and shutdown
(the learner's stop to launch's exit) from the learner log's stamps, in the format
runtime.setup_logging writes."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from datetime import datetime
from pathlib import Path

import pytest

from surreal_redis.config import load_config

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def solve(request):
    sys.path.insert(0, str(BENCH))
    request.addfinalizer(lambda: sys.path.remove(str(BENCH)))
    return importlib.import_module("solve")


def stamp(when: datetime) -> str:
    """A record's time as the learner's log handler writes it (local time, ms)."""
    formatter = logging.Formatter("%(asctime)s")
    record = logging.LogRecord("x", logging.INFO, "", 0, "", None, None)
    record.created, record.msecs = when.timestamp(), when.microsecond // 1000
    return formatter.format(record)


def test_phases_from_the_learner_log(solve):
    started = datetime(2026, 1, 2, 3, 4, 5, 250_000)
    log_text = "\n".join([
        f"{stamp(datetime(2026, 1, 2, 3, 4, 9, 0))} INFO MainProcess surreal_redis.algos.ppo.trainer: PPO on cpu",
        f"{stamp(datetime(2026, 1, 2, 3, 4, 11, 500_000))} INFO MainProcess surreal_redis.learner: first update "
        "done (1.2s after the learner was built)",
        f"{stamp(datetime(2026, 1, 2, 3, 4, 40, 0))} INFO MainProcess surreal_redis.runtime: stopping: train return "
        "480.0 reached stop.target_return=475.0",
        f"{stamp(datetime(2026, 1, 2, 3, 4, 40, 100_000))} INFO MainProcess surreal_redis.learner: learner stopped",
    ])
    split = solve.phases(log_text, started.timestamp(), started.timestamp() + 36.0)
    assert split.startup_s == pytest.approx(6.25)
    assert split.shutdown_s == pytest.approx(1.25)
    assert solve.phases("no stamps", 0.0, 1.0) == (None, None)


def test_only_names_each_case_and_sac_is_in_the_default_set(solve, capsys):
    assert solve.parse_args(["--only", "sac"]).only == "sac"
    assert solve.parse_args([]).only is None and set(solve.LAUNCHES) == {"ppo", "ddpg", "sac"}
    assert solve.LAUNCHES["sac"] == (("sac_pendulum", "sac_pendulum.yaml", 2, ()),)
    with pytest.raises(SystemExit):
        solve.parse_args(["--only", "td3"])
    with pytest.raises(SystemExit):
        solve.parse_args(["--budget-s", "0"])
    assert "--budget-s must be > 0, got 0.0" in capsys.readouterr().err


def test_sb3_settings_are_the_zoos(solve):
    """rl-baselines3-zoo hyperparams/sac.yml Pendulum-v1: n_timesteps 20000, MlpPolicy, learning_rate
    1e-3, nothing else (SB3's defaults); the stop is SB3's last 20 training episodes >= -200."""
    assert solve.ZOO["sac"] == {"n_timesteps": 20_000, "learning_rate": 1e-3}
    assert solve.TASKS["sac"] == ("Pendulum-v1", -200.0, 20) == solve.TASKS["ddpg"]


def test_sb3_sac_models_take_the_zoos_learning_rate_over_sb3s_defaults(solve):
    pytest.importorskip("stable_baselines3")
    zoo, total = solve.sb3_model("sac", "zoo")
    defaults, _ = solve.sb3_model("sac", "defaults")
    assert total == solve.UNTIL_STOPPED  # a constant rate: the target or the budget ends the run
    assert type(zoo).__name__ == type(defaults).__name__ == "SAC"
    assert zoo.learning_rate == 1e-3 and defaults.learning_rate == 3e-4
    for model in (zoo, defaults):
        assert (model.learning_starts, model.batch_size, model.gamma, model.tau) == (100, 256, 0.99, 0.005)
        assert model.ent_coef == "auto" and model.policy.net_arch == [256, 256]


def test_our_sac_pendulum_stops_on_a_complete_eval(solve):
    from surreal_redis.config import load_config

    stop = load_config("sac_pendulum").stop
    assert (stop.target_metric, stop.target_return) == ("eval", -200.0)


def test_the_sac_case_writes_its_times_and_the_ratio_to_sb3(solve, monkeypatch, capsys):
    launched, sb3 = [], []

    def fake_launch(config, agents, budget_s, workdir, overrides=()):
        launched.append((config, agents, budget_s))
        return 30.0, 6000, solve.Phases(5.0, 1.0)

    def fake_sb3(algo, settings, budget_s):
        sb3.append((algo, settings))
        return {"zoo": 60.0, "defaults": 40.0}[settings], 9000, None

    monkeypatch.setattr(solve, "run_launch", fake_launch)
    monkeypatch.setattr(solve, "run_sb3", fake_sb3)
    result = solve.main(["--only", "sac", "--budget-s", "600"])
    assert launched == [("sac_pendulum.yaml", 2, 600.0)] and sb3 == [("sac", "zoo"), ("sac", "defaults")]
    assert result == {
        "sac_pendulum_s": 30.0, "sac_pendulum_steps": 6000, "sac_pendulum_startup_s": 5.0,
        "sac_pendulum_shutdown_s": 1.0, "sb3_zoo_sac_pendulum_s": 60.0, "sb3_zoo_sac_pendulum_steps": 9000,
        "sb3_defaults_sac_pendulum_s": 40.0, "sb3_defaults_sac_pendulum_steps": 9000,
        "sac_pendulum_time_ratio_vs_sb3_zoo": 0.5, "sac_pendulum_time_ratio_vs_sb3_defaults": 0.75,
    }
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    launched.clear()
    assert "sac_pendulum_s" in solve.main(["--skip-sb3"]) and [c for c, _, _ in launched] == [
        "ppo_cartpole.yaml", "ppo_cartpole.yaml", "ppo_cartpole.yaml", "appo_cartpole.yaml", "ddpg_pendulum.yaml",
        "sac_pendulum.yaml"]
    result = solve.main(["--only", "ppo"])  # every launch of a task against that task's SB3 runs
    assert sb3[-2:] == [("ppo", "zoo"), ("ppo", "defaults")]
    for key in ("ppo_cartpole", "ppo_cartpole_4_agents", "ppo_cartpole_lockstep", "appo_cartpole"):
        assert result[f"{key}_time_ratio_vs_sb3_zoo"] == 0.5 and result[f"{key}_time_ratio_vs_sb3_defaults"] == 0.75


def test_json_writes_the_result_and_the_learning_curves_beside_it(solve, monkeypatch, tmp_path):
    """Ours from each launch's real MLflow store, moved onto the launch's clock (start-up 6.0 s, of
    which the learner took 1.5 s from its build to its first update); SB3's from its callback's
    points, its deterministic eval at the stop as one point."""
    from surreal_redis.tracking import Tracker

    def fake_launch(config, agents, budget_s, workdir, overrides=()):
        run_dir = workdir / solve.launch_name(config, agents, overrides)
        tracker = Tracker(run_dir, "exp", run_dir.name)
        tracker.log_params({"stop.target_return": -200.0})
        for update, (steps, seconds, train, evaluated) in enumerate([(1000, 4.0, -1100.0, -900.0),
                                                                     (2000, 8.0, -400.0, -150.0)], 1):
            tracker.log_metrics({"charts/env_steps": steps, "system/elapsed_s": seconds,
                                 "charts/episode_return_mean": train, "charts/eval_return": evaluated}, update)
        tracker.finish()
        (run_dir / "logs").mkdir()
        (run_dir / "logs" / "learner.log").write_text(
            "2026-01-02 03:04:05,000 INFO MainProcess surreal_redis.learner: first update done (1.5s after the "
            "learner was built)\n")
        return 30.0, 2000, solve.Phases(6.0, 1.0)

    def fake_sb3(algo, settings, budget_s):
        points = {"steps": 3000, "stopped_s": 59.0, "eval_at_stop": -180.0,
                  "curve": [[200, 10.0, -1200.0], [3000, 59.0, -190.0]]}
        return 60.0, 3000, solve.sb3_curves(f"SB3 {settings}", algo, points)

    monkeypatch.setattr(solve, "run_launch", fake_launch)
    monkeypatch.setattr(solve, "run_sb3", fake_sb3)
    out = tmp_path / "solve.json"
    result = solve.main(["--only", "sac", "--json", str(out), "--keep", str(tmp_path / "runs")])
    assert json.loads(out.read_text()) == result and result["sac_pendulum_s"] == 30.0
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    ours = solve.launch_curves(tmp_path / "runs" / "sac_pendulum_2a", "sac_pendulum", 6.0)
    assert [(s.kind, s.env_steps, s.wall_s, s.returns) for s in ours.series] == [
        ("train", (1000.0, 2000.0), (8.5, 12.5), (-1100.0, -400.0)),
        ("eval", (1000.0, 2000.0), (8.5, 12.5), (-900.0, -150.0))]
    sb3 = fake_sb3("sac", "zoo", 600)[2]
    figure = solve.solve_figure([("SAC Pendulum-v1", [ours, sb3]), ("PPO CartPole-v1", [])])
    steps_ax, time_ax = figure.axes  # the row without curves is left out
    lines = {line.get_label(): line for line in time_ax.get_lines()}
    assert set(lines) == {"sac_pendulum train", "sac_pendulum eval", "SB3 zoo train", "SB3 zoo eval", "target -200"}
    assert tuple(lines["SB3 zoo train"].get_xdata()) == (10.0, 59.0)
    assert tuple(lines["SB3 zoo eval"].get_ydata()) == (-180.0,)
    assert tuple(lines["sac_pendulum eval"].get_xdata()) == (8.5, 12.5)
    assert time_ax.get_xlabel().startswith("seconds (ours: from launch") and steps_ax.get_title() == "SAC Pendulum-v1"
    assert solve.sb3_curves("SB3 zoo", "sac", {"steps": 0, "curve": []}) is None


def test_the_cartpole_launches_run_the_agents_their_configs_ship(solve):
    """Each CartPole launch that stands for a shipped config (not the 4-agent case) and bench/appo's
    CartPole race run as many agents as the config holds, so a benchmark measures what a user runs."""
    for key, config, agents, _ in solve.LAUNCHES["ppo"]:
        if key != "ppo_cartpole_4_agents":
            assert agents == load_config(str(solve.ROOT / "configs" / config)).agent.num_agents, key
    appo = importlib.import_module("appo")  # bench/appo.py, on the path with solve
    for config, _ in appo.CARTPOLE.values():
        assert appo.CARTPOLE_AGENTS == load_config(str(solve.ROOT / "configs" / config)).agent.num_agents


def test_quick_runs_the_quick_start_against_sb3_zoo_and_says_its_verdict(solve):
    """--quick: `launch configs/ppo_cartpole.yaml` (1 agent) and SB3 zoo's PPO only; the verdict
    holds its first update (<= 3 s from the command), its exit (<= 1 s from the target, final eval
    included: no eval.final_episodes=0 override) and its whole process (<= 0.8x SB3 zoo's)."""
    launches, settings = solve.plan(solve.parse_args(["--quick"]))
    assert launches == {"ppo": (("ppo_cartpole", "ppo_cartpole.yaml", 1, ()),)} and settings == ("zoo",)
    assert solve.plan(solve.parse_args(["--only", "sac"]))[0] == {"sac": solve.LAUNCHES["sac"]}
    result = {"ppo_cartpole_s": 12.0, "ppo_cartpole_startup_s": 2.5, "ppo_cartpole_shutdown_s": 1.5,
              "sb3_zoo_ppo_cartpole_s": 16.0}
    solve.add_ratios(result)
    assert solve.quick_verdict(result) == (
        "quick start: first update 2.50 s (met: <= 3 s) after the command; exit 1.50 s (NOT met: <= 1 s) after "
        "the target; whole process 12.0 s against SB3 zoo's 16.0 s: 0.75x (met: <= 0.8x)")
    assert "exit ? after" in solve.quick_verdict({})
