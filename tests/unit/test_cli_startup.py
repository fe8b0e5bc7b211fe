"""The CLI loads without torch and gymnasium: `surreal-redis --help`, `status` and `stop` stay fast
(torch alone takes ~1.5 s to import on 2 cores); commands import what they need when they run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_cli_module_imports_neither_torch_nor_gymnasium():
    """Nor numpy: an agent started by hand sets its BLAS threads before numpy reads them."""
    code = ("import sys, surreal_redis.cli.group; "
            "print(sorted(m for m in ('torch', 'gymnasium', 'mlflow', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_agent_started_by_hand_gets_one_blas_thread_unless_the_user_set_it(monkeypatch):
    from surreal_redis.cli.common import _one_blas_thread

    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # restored after the test
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    _one_blas_thread()
    import os

    assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "4"


def test_help_runs_without_importing_torch():
    code = ("import sys; from click.testing import CliRunner; from surreal_redis.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
            "assert 'launch' in r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_launcher_and_config_load_without_torch():
    """`launch` imports the launcher and loads a config (PPO and DDPG sections, checkpoints) in the
    launcher process, which never builds a network: no torch (~1.5-2 s of start-up, ~150 MiB),
    no MLflow (the learner tracks)."""
    code = ("import sys, surreal_redis.launcher, surreal_redis.config as c; "
            "c.load_config('configs/ppo_cartpole.yaml'); c.load_config('configs/ddpg_pendulum.yaml'); "
            "print(sorted(m for m in ('torch', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("config", ["configs/ppo_cartpole.yaml", "configs/sac_pendulum.yaml"])
def test_a_trainer_builds_updates_and_checkpoints_without_torch_dynamo(config):
    """A learner's (and a final eval's) trainer: its optimizers build, step and save their state
    without importing torch._dynamo (~1 s of CPU on each start, networks.EagerAdam)."""
    code = ("import sys, torch, gymnasium as gym, surreal_redis.config as c; "
            "from surreal_redis.algos.learning import make_trainer; "
            f"cfg = c.load_config({config!r}); env = gym.make(cfg.env.env_id); "
            "t = make_trainer(cfg.algo_config, env.observation_space, env.action_space); "
            "opts = [o for o in vars(t).values() if isinstance(o, torch.optim.Optimizer)]; "
            "assert opts, vars(t); "
            "[(o.zero_grad(), o.step(), o.load_state_dict(o.state_dict())) for o in opts]; "
            "t.load_state_dict(t.state_dict()); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_activation_names_match_the_networks():
    """Configs check activations against a torch-free list; the networks map the same names."""
    from surreal_redis.algos.network_config import ACTIVATION_NAMES
    from surreal_redis.algos.networks import ACTIVATIONS

    assert sorted(ACTIVATION_NAMES) == sorted(ACTIVATIONS)


def test_agent_nice_lowers_the_priority_of_the_process_that_reads_it():
    from surreal_redis.config import load_config
    from surreal_redis.configtools import ConfigError

    code = ("import os; from surreal_redis.runtime import lower_priority; before = os.getpriority(os.PRIO_PROCESS, 0); "
            "lower_priority(0); same = os.getpriority(os.PRIO_PROCESS, 0); lower_priority(7); "
            "print(same - before, os.getpriority(os.PRIO_PROCESS, 0) - before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "7"]
    assert load_config(None, ["agent.nice=5"]).agent.nice == 5
    try:
        load_config(None, ["agent.nice=20"])
    except ConfigError as exc:
        assert "nice must be in 0..19, got 20" in str(exc)
    else:
        raise AssertionError("agent.nice=20 was accepted")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value per thread is Linux's")
def test_lower_thread_priority_lowers_the_calling_thread_only():
    """A start-up ahead of need (the final eval's standby) runs niced in a thread
    while the process's other threads keep their priority, which they could not raise again."""
    code = ("import os, threading; from surreal_redis.runtime import lower_thread_priority as lower; "
            "seen = {}\n"
            "def work(): seen['ok'] = lower(5); seen['nice'] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
            "t = threading.Thread(target=work); t.start(); t.join(); "
            "print(seen['ok'], seen['nice'] - os.getpriority(os.PRIO_PROCESS, 0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", str(min(5, 19 - os.getpriority(os.PRIO_PROCESS, 0)))]


def test_a_child_the_launcher_starts_niced_is_not_made_nicer_twice(tmp_path):
    """Agents and evals start agent.nice nicer (their imports yield to the learner's from the
    first instruction); their own lower_priority(agent.nice) then changes nothing."""
    from surreal_redis.launcher.children import Child

    code = ("import os; from surreal_redis.runtime import lower_priority; at_start = os.getpriority(os.PRIO_PROCESS, 0); "
            "lower_priority(7); print(at_start, os.getpriority(os.PRIO_PROCESS, 0))")
    child = Child("agent-0", [sys.executable, "-c", code], tmp_path / "agent-0.log", 0, nice=7)
    child.start()
    assert child.process.wait(timeout=60) == 0
    at_start, after = map(int, child.log_path.read_text().split())
    assert at_start - os.getpriority(os.PRIO_PROCESS, 0) == 7 and after == at_start
