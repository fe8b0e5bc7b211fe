"""Smoke tests of bench/memory.py, bench/throughput.py and bench/halfcheetah.py: argument checks,
the /proc readers they measure with, halfcheetah's curves figure, and a tiny plain loop (seconds;
no launches)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surreal_redis.learner.metrics import fmt_number

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench(request):
    sys.path.insert(0, str(BENCH))
    request.addfinalizer(lambda: sys.path.remove(str(BENCH)))
    names = ("memory", "throughput", "halfcheetah", "appo", "utilization", "learner_step", "update_phases")
    return {name: importlib.import_module(name) for name in names}


@pytest.mark.parametrize("argv, message", [
    (["--envs", "cartpole,doom"], "unknown envs ['doom']"),
    (["--agents", "1,x"], "--agents must be comma-separated integers, got '1,x'"),
    (["--agents", "0,2"], "--agents needs counts >= 1, got '0,2'"),
    (["--seconds", "0"], "--seconds and --plain-s must be > 0, got 0.0"),
])
def test_throughput_refuses_bad_arguments_by_name(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench["throughput"].main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, message", [
    ("halfcheetah", ["--budget-s", "-5"], "--budget-s must be > 0, got -5.0"),
    ("halfcheetah", ["--agents", "0"], "--agents must be >= 1, got 0"),
    ("halfcheetah", ["--eval-episodes", "0"], "--eval-episodes must be >= 1, got 0"),
    ("halfcheetah", ["--window", "0"], "--window must be >= 1, got 0"),
    ("memory", ["--agents", "0"], "need --agents >= 1"),
    ("memory", ["--every-s", "0"], "--every-s > 0; got 4, 90.0, 0.0"),
    ("appo", ["--seeds", "0"], "--seeds must be >= 1, got 0"),
    ("appo", ["--agents", "1,x"], "--agents must be comma-separated integers, got '1,x'"),
    ("appo", ["--agents", "0,2"], "--agents needs counts >= 1, got [0, 2]"),
    ("appo", ["--scaling-envs", "cartpole,doom"], "unknown --scaling-envs ['doom']"),
    ("appo", ["--race-modes", "lockstep,free"], "unknown --race-modes ['free']"),
])
def test_other_benches_refuse_bad_arguments_by_name(bench, capsys, module, argv, message):
    with pytest.raises(SystemExit):
        bench[module].main(argv)
    assert message in capsys.readouterr().err


def test_halfcheetah_defaults_are_the_issue_budget(bench):
    options = bench["halfcheetah"].parse_args([])
    assert options.budget_s == 600.0 and options.agents is None and not options.skip_sb3
    assert options.algo == "ppo"  # as before --algo came


def test_halfcheetah_algo_picks_our_config_and_refuses_others(bench, capsys):
    halfcheetah = bench["halfcheetah"]
    assert halfcheetah.parse_args(["--algo", "sac"]).algo == "sac"
    assert halfcheetah.CONFIGS == {"ppo": "ppo_halfcheetah.yaml", "sac": "sac_halfcheetah.yaml",
                                   "crossq": "crossq_halfcheetah.yaml", "ddpg": "ddpg_halfcheetah.yaml"}
    # SB3 has no CrossQ; its zoo tunes TD3, not DDPG, for MuJoCo
    assert halfcheetah.SB3_ALGO == {"ppo": "ppo", "sac": "sac", "crossq": "sac", "ddpg": "td3"}
    assert all((BENCH.parent / "configs" / config).is_file() for config in halfcheetah.CONFIGS.values())
    with pytest.raises(SystemExit):
        halfcheetah.parse_args(["--algo", "td3"])
    assert "invalid choice: 'td3'" in capsys.readouterr().err


def test_halfcheetah_sb3_settings_are_the_zoos(bench):
    """rl-baselines3-zoo HalfCheetah-v4 entries: hyperparams/sac.yml n_timesteps 1e6, MlpPolicy,
    learning_starts 10000 (SB3 SAC's defaults otherwise); hyperparams/ppo.yml as before."""
    zoo = bench["halfcheetah"].ZOO_HALFCHEETAH
    assert zoo["sac"] == {"learning_starts": 10_000} and bench["halfcheetah"].N_TIMESTEPS == 1_000_000
    # hyperparams/td3.yml's MuJoCo defaults: normal noise 0.1, net_arch [400, 300]
    assert zoo["td3"] == dict(learning_starts=10_000, learning_rate=1e-3, batch_size=256, train_freq=1, gradient_steps=1)
    assert (bench["halfcheetah"].TD3_NOISE_STD, bench["halfcheetah"].TD3_NET_ARCH) == (0.1, [400, 300])
    assert zoo["ppo"] == dict(n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                              clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096)


def test_halfcheetah_sb3_sac_model_is_sb3s_defaults_but_learning_starts(bench):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("mujoco")
    model, transform = bench["halfcheetah"].sb3_model("sac", "HalfCheetah-v5", 1)
    assert type(model).__name__ == "SAC" and transform("obs") == "obs"  # no normalization
    assert (model.learning_starts, model.learning_rate, model.batch_size, model.buffer_size) == (10_000, 3e-4, 256, 1_000_000)
    assert (model.gamma, model.tau, model.ent_coef, model.gradient_steps) == (0.99, 0.005, "auto", 1)
    assert model.policy.net_arch == [256, 256] and model.env.num_envs == 1


def test_halfcheetah_sb3_td3_model_is_the_zoos_mujoco_defaults(bench):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("mujoco")
    model, transform = bench["halfcheetah"].sb3_model("td3", "Hopper-v5", 2)
    assert type(model).__name__ == "TD3" and transform("obs") == "obs"
    assert (model.learning_starts, model.learning_rate, model.batch_size, model.gradient_steps) == (10_000, 1e-3, 256, 1)
    assert (model.policy_delay, model.target_policy_noise, model.target_noise_clip) == (2, 0.2, 0.5)
    assert model.policy.net_arch == [400, 300] and model.seed == 2
    assert model.action_noise._sigma.tolist() == [0.1] * 3  # Hopper: 3 actions


def test_halfcheetah_sac_race_passes_the_algo_to_both_sides_and_writes_the_scores(bench, monkeypatch, capsys):
    halfcheetah, calls = bench["halfcheetah"], []

    def fake_ours(config, env_id, seed, budget_s, window, agents, overrides, workdir):
        calls.append(("ours", config, env_id, seed, budget_s))
        return {"wall_s": 610.0, "env_steps": 50_000, "updates": 45_000, "train_return": 2500.0, "eval_return": 3000.0}

    def fake_sb3(algo, env_id, seed, budget_s, window, eval_episodes):
        calls.append(("sb3", algo, env_id, seed, budget_s))
        return {"wall_s": 600.0, "env_steps": 40_000, "train_return": 2000.0, "eval_return": 3100.0}

    monkeypatch.setattr(halfcheetah, "run_ours", fake_ours)
    monkeypatch.setattr(halfcheetah, "run_sb3", fake_sb3)
    result = halfcheetah.main(["--algo", "sac", "--budget-s", "600"])
    assert calls == [("ours", "sac_halfcheetah.yaml", "HalfCheetah-v5", 1, 600.0),
                     ("sb3", "sac", "HalfCheetah-v5", 1, 600.0)]
    assert {key: result[key] for key in ("algo", "budget_s", "eval_ours_minus_sb3", "train_ours_minus_sb3")} == {
        "algo": "sac", "budget_s": 600.0, "eval_ours_minus_sb3": -100.0, "train_ours_minus_sb3": 500.0}
    assert set(result) == {"algo", "env_id", "seed", "cores", "budget_s", "ours", "sb3_zoo", "eval_ours_minus_sb3",
                           "train_ours_minus_sb3", "train_at_env_steps"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result

    calls.clear()  # CrossQ races SB3's SAC; the task and the seed reach both sides
    result = halfcheetah.main(["--algo", "crossq", "--env-id", "Walker2d-v5", "--seed", "3", "--budget-s", "60"])
    assert calls == [("ours", "crossq_halfcheetah.yaml", "Walker2d-v5", 3, 60.0),
                     ("sb3", "crossq", "Walker2d-v5", 3, 60.0)]  # run_sb3 races SB3_ALGO["crossq"]
    assert (result["algo"], result["env_id"], result["seed"]) == ("crossq", "Walker2d-v5", 3)


@pytest.mark.parametrize("ours, theirs", [("ddpg", "td3"), ("crossq", "sac"), ("ppo", "ppo")])
def test_halfcheetah_sb3_process_takes_our_algo_and_races_sb3s(bench, monkeypatch, ours, theirs):
    """run_sb3's command line parses in the SB3 process, which builds SB3's algorithm for ours."""
    pytest.importorskip("stable_baselines3")
    import subprocess

    halfcheetah, seen = bench["halfcheetah"], {}

    def fake_run(args, **kwargs):
        options = halfcheetah.parse_args(args[2:])  # as the SB3 process parses them
        seen.update(algo=options.algo, sb3_case=options.sb3_case, env_id=options.env_id, seed=options.seed)
        return subprocess.CompletedProcess(args, 0, json.dumps({"wall_s": 1.0, "curve": []}) + "\n", "")

    def fake_case(algo, env_id, seed, budget_s, window, eval_episodes, started):
        seen["built"] = algo
        return {}

    monkeypatch.setattr(halfcheetah.subprocess, "run", fake_run)
    assert halfcheetah.run_sb3(ours, "Hopper-v5", 2, 60.0, 10, 5) == {"wall_s": 1.0, "curve": []}
    assert seen == {"algo": ours, "sb3_case": True, "env_id": "Hopper-v5", "seed": 2}
    monkeypatch.setattr(halfcheetah, "sb3_case", fake_case)
    halfcheetah.main(["--sb3-case", "--algo", ours])
    assert seen["built"] == theirs


def test_halfcheetah_json_writes_the_scores_and_the_race_curves_beside_them(bench, monkeypatch, tmp_path):
    """Ours from the launch's real MLflow store, SB3's from its callback's points (the curve stays
    out of the JSON), its eval after the budget as one point."""
    from surreal_redis.tracking import Tracker

    halfcheetah = bench["halfcheetah"]

    def fake_ours(config, env_id, seed, budget_s, window, agents, overrides, workdir):
        tracker = Tracker(workdir / "sac_halfcheetah", "exp", "sac_halfcheetah")
        for update, (steps, seconds, train) in enumerate([(5000, 100.0, -300.0), (20000, 590.0, 1500.0)], 1):
            tracker.log_metrics({"charts/env_steps": steps, "system/elapsed_s": seconds,
                                 "charts/episode_return_mean": train}, update)
        tracker.finish()
        return {"wall_s": 610.0, "env_steps": 20_000, "updates": 19_000, "train_return": 1500.0, "eval_return": None}

    def fake_sb3(algo, env_id, seed, budget_s, window, eval_episodes):
        return {"wall_s": 600.0, "env_steps": 30_000, "train_return": 2000.0, "eval_return": 2500.0,
                "curve": [[1000, 20.0, -400.0], [30000, 599.0, 2000.0]]}

    monkeypatch.setattr(halfcheetah, "run_ours", fake_ours)
    monkeypatch.setattr(halfcheetah, "run_sb3", fake_sb3)
    out = tmp_path / "race.json"
    result = halfcheetah.main(["--algo", "sac", "--json", str(out), "--keep", str(tmp_path / "runs")])
    assert json.loads(out.read_text()) == result and "curve" not in result["sb3_zoo"]
    # at equal env steps: ours ended at 20k; SB3's curve holds -400 from 1k on and 2000 from 30k on
    assert result["train_at_env_steps"] == {"30000": {"ours": None, "sb3_zoo": 2000.0},
                                            "60000": {"ours": None, "sb3_zoo": None}}
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    ours = halfcheetah.our_curves(tmp_path / "runs")
    sb3 = halfcheetah.sb3_curves(fake_sb3("sac", "HalfCheetah-v5", 1, 600, 10, 5))
    assert [(s.kind, s.env_steps, s.wall_s, s.returns) for s in ours.series] == [
        ("train", (5000.0, 20000.0), (100.0, 590.0), (-300.0, 1500.0))]
    assert [(s.kind, s.env_steps, s.returns) for s in sb3.series] == [
        ("train", (1000.0, 30000.0), (-400.0, 2000.0)), ("eval", (30000.0,), (2500.0,))]
    steps_ax, time_ax = halfcheetah.race_figure("sac", "HalfCheetah-v5", 600, [ours, sb3]).axes
    lines = {line.get_label(): line for line in steps_ax.get_lines()}
    assert set(lines) == {"ours train", "SB3 zoo train", "SB3 zoo eval"}
    assert tuple(lines["ours train"].get_xdata()) == (5000.0, 20000.0)
    assert tuple(next(line for line in time_ax.get_lines() if line.get_label() == "SB3 zoo train").get_xdata()) == (
        20.0, 599.0)
    assert halfcheetah.sb3_curves({"curve": []}) is None
    assert (halfcheetah.train_at(ours, 5000), halfcheetah.train_at(ours, 19_999), halfcheetah.train_at(ours, 4999)) == (
        -300.0, -300.0, None)
    assert halfcheetah.train_at(None, 30_000) is None


def test_halfcheetah_reads_the_launch_summary(bench):
    summary = bench["halfcheetah"].SUMMARY
    line = f"  204800 env steps, 100 updates, mean return {fmt_number(-12.5)}, last eval {fmt_number(None)}"
    match = summary.search("run 'x' finished\n" + line + "\n  checkpoints: /tmp")
    assert match and int(match["steps"]) == 204800 and int(match["updates"]) == 100
    assert bench["halfcheetah"]._number(match["mean"]) == pytest.approx(float(fmt_number(-12.5)))
    assert bench["halfcheetah"]._number(match["eval"]) is None


def test_halfcheetah_scores_ours_by_the_final_eval_when_the_launch_ran_one(bench, monkeypatch, tmp_path):
    """The final checkpoint's eval is our score (SB3's is its eval after the budget); a launch
    without one keeps the last periodic eval."""
    import subprocess

    halfcheetah = bench["halfcheetah"]
    summary = (f"run 'crossq_halfcheetah' finished\n  86500 env steps, 81547 updates, mean return {fmt_number(5612.9)}, "
               f"last eval {fmt_number(5668.7)}\n")
    final = ("  final eval of update 81547 (the final checkpoint): mean return 5854.8 over 10 of 10 episodes in 0.6s; "
             "best checkpoints: update 81547 (5854.8)\n")
    for stderr, score in ((summary + final, 5854.8), (summary, 5668.7)):
        monkeypatch.setattr(halfcheetah.subprocess, "run",
                            lambda *args, stderr=stderr, **kwargs: subprocess.CompletedProcess(args, 0, "", stderr))
        result = halfcheetah.run_ours("crossq_halfcheetah.yaml", "HalfCheetah-v5", 1, 600.0, 10, None, [], tmp_path)
        assert result["eval_return"] == pytest.approx(score)
        assert result["last_periodic_eval"] == pytest.approx(5668.7)
        assert (result["env_steps"], result["updates"]) == (86500, 81547)


@pytest.mark.parametrize("cmdline, role", [
    (".venv/bin/python -m surreal_redis.cli --log-level INFO agent --id 3 --config c.yaml --redis-url unix:///r", "agent3"),
    (".venv/bin/python -m surreal_redis.cli --log-level INFO learner --config c.yaml", "learner"),
    (".venv/bin/python -m surreal_redis.cli --log-level INFO eval --config c.yaml", "eval"),
    (".venv/bin/python .venv/bin/surreal-redis launch configs/ppo_pong.yaml -o stop.max_seconds=90", "launch"),
    ("redis-server *:0", "redis-server"),
    (".venv/bin/python -m surreal_redis.tracking runs/learner-agent learner-agent learner-agent ", "mlflow"),
    ("/bin/sh -c true", "other"),
])
def test_memory_names_each_process_role(bench, cmdline, role):
    assert bench["memory"].role_from_cmdline(cmdline) == role


@pytest.mark.parametrize("cmdline, role", [
    (".venv/bin/python -m surreal_redis.cli launch configs/appo_cartpole.yaml -o tracking.enabled=false", "launch"),
    (".venv/bin/python -m surreal_redis.tracking runs/x x x ", "mlflow"),
    ("/usr/local/bin/mlflow ui --backend-store-uri sqlite:///runs/x/mlflow.db", "mlflow"),
    ("/opt/redis/bin/redis-server.bin *:0", "redis"),
    (".venv/bin/python -m surreal_redis.cli --log-level INFO agent --id 3 --config c.yaml", "agent"),
])
def test_utilization_names_each_process_role(bench, cmdline, role):
    # an override naming tracking on the launch's command line does not make it MLflow's
    assert bench["utilization"].process_role(cmdline) == role


def test_memory_and_cpu_readers_see_a_child_process_and_keep_an_exited_agents_time(bench):
    memory, throughput = bench["memory"], bench["throughput"]
    # a busy child whose command line looks like an agent's
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ntime.sleep(60)",
                              "surreal_redis.cli", "--log-level", "INFO", "agent", "--id", "0"])
    try:
        deadline = time.monotonic() + 20
        while (throughput.cpu_seconds(child.pid) or 0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in memory.process_tree(os.getpid())
        mem = memory.memory_of(child.pid)
        assert 0 < mem.pss <= mem.rss and 0 < mem.anon <= mem.rss and 0 < mem.shared <= mem.rss
        clock = throughput.AgentClock()
        seen = clock.read(os.getpid())
        assert seen >= 0.3
    finally:
        child.kill()
        child.wait()
    assert memory.memory_of(child.pid) is None and throughput.cpu_seconds(child.pid) is None
    assert clock.read(os.getpid()) == seen  # an agent that exited still counts what it ran


def test_plain_loop_steps_the_configs_env_with_its_policy(bench):
    """In a child process with the agents' environment and the launch's overrides applied."""
    config = str(BENCH.parent / "configs" / "ppo_cartpole.yaml")
    result = bench["throughput"].plain_loop(config, 0.2, ["env.num_envs=3"])
    assert result["plain_sps"] > 0 and result["plain_sps_per_core"] > 0 and result["num_envs"] == 3
    with pytest.raises(RuntimeError, match="env.no_such_key"):
        bench["throughput"].plain_loop(config, 0.2, ["env.no_such_key=1"])


def test_appo_race_pairs_each_seed_and_compares_at_equal_wall_clock_and_env_steps(bench, monkeypatch, tmp_path):
    """Per seed lockstep then APPO; each mode's training return at the fewer of the two final env
    step counts (its curve's last point at or before it), from its (real) MLflow store."""
    from surreal_redis.tracking import Tracker

    appo, calls = bench["appo"], []
    real = inspect.signature(appo.halfcheetah.run_ours)

    def fake_ours(*args):
        config, env_id, seed, budget_s, window, agents, overrides, workdir = real.bind(*args).args  # as the real one is called
        calls.append((config, env_id, seed, overrides))
        if config == "appo_halfcheetah.yaml":
            tracker = Tracker(workdir / "appo_halfcheetah", "exp", "appo_halfcheetah")
            for update, (steps, train) in enumerate([(20_000, -50.0), (50_000, 100.0 * seed), (200_000, 900.0)], 1):
                tracker.log_metrics({"charts/env_steps": steps, "system/elapsed_s": update * 10.0,
                                     "charts/episode_return_mean": train}, update)
            tracker.finish()
            return {"wall_s": 260.0, "env_steps": 200_000, "updates": 400, "train_return": 900.0, "eval_return": 1000.0 + seed}
        return {"wall_s": 250.0, "env_steps": 40_000, "updates": 80, "train_return": 500.0, "eval_return": 600.0}

    monkeypatch.setattr(appo.halfcheetah, "run_ours", fake_ours)
    result = appo.main(["--skip-scaling", "--seeds", "2", "--race-s", "240", "--json", str(tmp_path / "out.json")])
    assert calls == [(config, "HalfCheetah-v5", seed, []) for seed in (1, 2)
                     for config in ("ppo_halfcheetah.yaml", "appo_halfcheetah.yaml")]
    race = result["race"]
    assert race["appo_eval_return"] == {"mean": 1001.5, "min": 1001.0, "max": 1002.0}
    assert race["appo_minus_lockstep_eval"] == {"mean": 401.5, "min": 401.0, "max": 402.0}
    assert race["appo_train_at_common_steps"] == {"mean": -50.0, "min": -50.0, "max": -50.0}  # at 20k <= 40k
    assert race["at_common_steps"][0] == {"seed": 1, "env_steps": 40_000, "lockstep_train": None, "appo_train": -50.0}
    calls.clear()
    alone = appo.main(["--skip-scaling", "--seeds", "1", "--race-modes", "appo"])["race"]
    assert calls == [("appo_halfcheetah.yaml", "HalfCheetah-v5", 1, [])]
    assert alone["appo_eval_return"]["mean"] == 1001.0 and "appo_minus_lockstep_eval" not in alone
    assert alone["appo_train_at_common_steps"]["mean"] == 900.0  # alone: at its own final steps
    assert json.loads((tmp_path / "out.json").read_text()) == result
    assert appo.spread([None]) == {"mean": None, "min": None, "max": None}
    assert appo.halfcheetah.train_return_by(None, 10) is None


def test_learner_step_times_an_update_and_refuses_what_it_cannot_time(bench, capsys):
    result = bench["learner_step"].main(["--configs", "ppo_cartpole", "--steps", "64", "--minibatch", "32,0",
                                         "--repeats", "1", "--device", "cpu"])
    [case] = result["cases"]  # minibatch 0 (the config's 256 rows) is over the 64-step batch: skipped
    assert case["steps"] == 64 and case["minibatches"] == 2 and case["epochs"] == 10 and case["device"] == "cpu"
    assert case["update_s"] > 0 and case["samples_per_s"] > 0
    assert case["minibatch_step_ms"] == pytest.approx(case["epoch_ms"] / 2, abs=0.01)
    assert case["sb3_minibatch_step_ms"] > 0  # stable-baselines3's same update, in the same run
    assert case["ratio"] == pytest.approx(case["minibatch_step_ms"] / case["sb3_minibatch_step_ms"], abs=0.01)
    with pytest.raises(SystemExit):
        bench["learner_step"].main(["--steps", "x"])
    assert "--steps takes comma-separated integers, got 'x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench["learner_step"].main(["--algos", "ppo,dqn"])
    assert "--algos takes ppo, appo, sac, ddpg, crossq, got 'ppo,dqn'" in capsys.readouterr().err


@pytest.mark.parametrize("config", ["sac_pendulum", "ddpg_pendulum"])
def test_learner_step_times_off_policy_updates_against_sb3(bench, config):
    result = bench["learner_step"].main(["--configs", config, "--batch", "16", "--repeats", "1", "--device", "cpu"])
    [case] = result["cases"]
    assert case["batch"] == 16 and case["algo"] == config.split("_")[0] and case["update_ms"] > 0
    assert case["ratio"] == pytest.approx(case["update_ms"] / case["sb3_update_ms"], abs=0.01)
    skipped = bench["learner_step"].main(["--algos", "ppo", "--configs", config, "--no-reference"])
    assert skipped["cases"] == []  # a config of an algorithm outside --algos


@pytest.mark.parametrize("config", ["ppo_cartpole", "appo_cartpole"])
def test_learner_step_phases_split_an_update_and_leave_the_trainer_as_it_was(bench, config, monkeypatch):
    from surreal_redis.algos.ppo.trainer import PPOTrainer

    installed = []
    real_time_phases = bench["learner_step"].time_phases

    def spy(algo, chunks, repeats):
        out = real_time_phases(algo, chunks, repeats)
        installed.append({name for name in vars(algo) if name.startswith("_") and callable(vars(algo)[name])})
        return out

    monkeypatch.setattr(bench["learner_step"], "time_phases", spy)
    result = bench["learner_step"].main(["--configs", config, "--steps", "64", "--minibatch", "32", "--repeats", "1",
                                         "--device", "cpu", "--no-reference", "--phases"])
    [case] = result["cases"]
    shares, seconds = case["phase_share"], case["phase_s"]
    assert set(shares) == set(seconds) == {*bench["update_phases"].PHASES, "other"}
    assert seconds["gradient"] > 0 and seconds["decode"] > 0 and seconds["no_grad_pass"] > 0 and seconds["targets"] > 0
    assert seconds["reward_scale"] == 0 and seconds["z_filter"] >= 0  # CartPole's configs scale no reward
    assert sum(shares.values()) == pytest.approx(1, abs=0.01)
    assert case["non_gradient_share"] == pytest.approx(1 - shares["gradient"], abs=1e-3)
    assert case["no_grad_pass_share"] == shares["no_grad_pass"]
    assert installed == [set()]  # the clock's wrappers are gone: the class's methods again
    assert "_minibatch_step" in vars(PPOTrainer)


def test_update_phase_clock_attributes_each_phase(bench):
    """Fake trainer methods that advance a fake clock: each phase gets its own seconds."""
    phases = bench["update_phases"]
    now = [0.0]

    class Fake:
        device = __import__("torch").device("cpu")
        reward_scaler = None

        def _rollout(self):
            now[0] += 1.0  # decode
            self._features_no_grad()
            now[0] += 2.0  # the rest of the pass
            self._targets()

        def _features_no_grad(self):
            now[0] += 4.0

        def _targets(self):
            now[0] += 8.0

        def _minibatch_step(self):
            now[0] += 16.0

        def _update_obs_normalizer(self):
            now[0] += 32.0

    algo = Fake()
    clock = phases.PhaseClock(algo)
    clock.now = lambda: now[0]
    with clock:
        algo._rollout()
        algo._minibatch_step()
        algo._update_obs_normalizer()
    assert clock.seconds == {"reward_scale": 0.0, "decode": 1.0, "no_grad_pass": 14.0, "targets": 8.0,
                             "gradient": 16.0, "z_filter": 32.0}
    shares = clock.shares(64.0)
    assert shares["phase_s"]["no_grad_pass"] == 6.0 and shares["phase_s"]["other"] == 1.0
    assert shares["non_gradient_share"] == 0.75 and shares["no_grad_pass_share"] == round(6 / 64, 4)
    assert "_rollout" not in vars(algo)


LEARNER_LOG = """\
2026-12-05 06:27:20,000 INFO MainProcess surreal_redis.learner.loop: first update done (0.2s after the learner was built)
2026-12-05 06:27:22,500 INFO MainProcess surreal_redis.learner.metrics: update 0 | v1 | 3072 env steps (0/s) | 0.0 updates/s | return - | eval - | experience used -, policy lag p90 -, learner busy 0%, agents idle 91%
2026-12-05 06:27:28,000 INFO MainProcess surreal_redis.learner.metrics: update 6 | v7 | 3072 env steps (0/s) | 0.0 updates/s | return - | eval 0.4 | experience used 100.0%, policy lag p90 0 (0:100%), passes/sample 20.0, kl/update 0.0043, learner busy 85%, agents idle 91% [lockstep]
2026-12-05 06:27:31,000 INFO MainProcess surreal_redis.checkpoint: checkpoint /x/ckpt-0000000010.pt written
2026-12-05 06:27:34,000 INFO MainProcess surreal_redis.learner.metrics: update 14 | v15 | 7168 env steps (707/s) | 1.4 updates/s | return -1.3 | eval 0.4 | experience used 100.0%, policy lag p90 0 (0:100%), passes/sample 20.0, kl/update 0.0048, learner busy 80%, agents idle 88% [lockstep]
2026-12-05 06:27:36,000 INFO MainProcess surreal_redis.learner.metrics: update 30 | v31 | 15360 env steps (732/s) | 1.4 updates/s | return 42.0 | eval 0.4 | experience used 100.0%, policy lag p90 0 (0:100%), passes/sample 20.0, kl/update 0.0072, learner busy 90%, agents idle 90% [lockstep]
"""


def test_learner_step_loop_reads_the_learners_steady_rate_and_busy_fraction(bench):
    """From the first metrics line after an update (06:27:28, update 6) to the last: 24 updates
    in 8 s; busy 80% over 6 s and 90% over 2 s."""
    learner_step = bench["learner_step"]
    rate = learner_step.steady_rate(LEARNER_LOG)
    assert rate.updates_per_s == pytest.approx(3.0) and rate.window_s == pytest.approx(8.0) and rate.updates == 24
    assert rate.learner_busy == pytest.approx((0.8 * 6 + 0.9 * 2) / 8)
    assert learner_step.steady_rate(LEARNER_LOG.splitlines()[2]).updates_per_s is None  # one line: no window
    assert learner_step.loop_efficiency(3.0, 0.3) == pytest.approx(0.9)
    assert learner_step.loop_efficiency(None, 0.3) is None


def test_learner_step_loop_times_the_bare_update_around_each_launch(bench, monkeypatch, tmp_path, capsys):
    learner_step, launched = bench["learner_step"], []

    def fake_launch(config, agents, budget_s, workdir, overrides=()):
        launched.append((config, agents, budget_s, overrides))
        logs = workdir / learner_step.launch_name(config, agents, overrides) / "logs"
        logs.mkdir(parents=True)
        (logs / "learner.log").write_text(LEARNER_LOG)
        return None, 15360, None

    monkeypatch.setattr(learner_step, "run_launch", fake_launch)
    result = learner_step.main(["--configs", "ppo_cartpole", "--loop", "30", "--loop-rounds", "2", "--repeats", "1",
                                "--device", "cpu"])
    assert launched == [("ppo_cartpole.yaml", 1, 30.0, ("stop.target_return=null",))] * 2
    [bare], [loop] = result["cases"], result["loop"]
    assert bare["steps"] == 256 and "sb3_minibatch_step_ms" not in bare  # the config's sizes, no reference
    assert loop["rounds"] == 2 and len(loop["launches"]) == 2
    bares = loop["bare_update_s"]
    assert len(bares) == 3 and bares[-1] == pytest.approx(bare["update_s"], abs=1e-5)  # the case kept: the last
    for i, launch in enumerate(loop["launches"]):
        assert launch["launch_updates_per_s"] == 3.0 and launch["learner_busy"] == pytest.approx(0.825, abs=1e-3)
        assert launch["launch_update_s"] == pytest.approx(0.825 / 3.0, abs=1e-4)  # busy seconds per update
        # against the bare timings on either side of it; printed to 3 decimals, the bare timings
        # to 5: 5e-4 + 3.0 x 5e-6 apart at most
        assert launch["loop_efficiency"] == pytest.approx(3.0 * (bares[i] + bares[i + 1]) / 2, abs=5.2e-4)
    efficiencies = sorted(launch["loop_efficiency"] for launch in loop["launches"])
    assert loop["loop_efficiency"] == pytest.approx(sum(efficiencies) / 2)  # the median of two
    assert loop["launch_updates_per_s"] == 3.0
    assert loop["bare_updates_per_s"] == pytest.approx(1 / sorted(bares)[1], rel=1e-2)
    with pytest.raises(SystemExit):
        learner_step.main(["--loop", "30", "--steps", "8192"])
    assert "--loop times each config's own sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        learner_step.main(["--loop", "30", "--loop-rounds", "0"])
    assert "--loop-rounds needs >= 1, got 0" in capsys.readouterr().err


def test_learner_step_times_crossq_alone(bench, monkeypatch):
    """No stable-baselines3 CrossQ: its case has no reference, with or without --no-reference.
    Pendulum's spaces in place of HalfCheetah's (MuJoCo is an extra)."""
    module = bench["learner_step"]
    load = module.load_config
    monkeypatch.setattr(module, "load_config",
                        lambda name: load(name, ["env.env_id=Pendulum-v1", "crossq.critic_hidden=[16, 16]"]))
    result = module.main(["--configs", "crossq_halfcheetah", "--batch", "16", "--repeats", "1", "--device", "cpu"])
    [case] = result["cases"]
    assert case["algo"] == "crossq" and case["batch"] == 16 and case["update_ms"] > 0 and "ratio" not in case
    assert case["updates_per_block"] % 3 == 0
