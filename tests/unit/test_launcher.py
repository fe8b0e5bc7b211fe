"""The launcher's decisions that need no process: folders of earlier runs, settings it cannot run
with, how a learner is restarted, restart delays. (Supervision itself: tests/e2e/test_launch.py.)"""

from pathlib import Path

import pytest

from surreal_redis.config import load_config
from surreal_redis.launcher import Launcher, LaunchError, restart_delay
from surreal_redis.runtime import StopFlag


def make_launcher(tmp_path: Path, *overrides: str, **kwargs) -> Launcher:
    config = load_config("smoke", [f"experiment.root={tmp_path}", *overrides])
    return Launcher(config, StopFlag(install_handlers=False), **kwargs)


def earlier_run(tmp_path: Path) -> Path:
    folder = tmp_path / "smoke"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-0000000005.pt").write_bytes(b"x")
    (folder / "mlflow_run_id").write_text("abc")
    return folder


def test_a_folder_holding_a_run_is_refused_without_resume(tmp_path):
    folder = earlier_run(tmp_path)
    with pytest.raises(LaunchError) as refused:
        make_launcher(tmp_path).run()  # refused before any Redis or process starts
    message = str(refused.value)
    assert str(folder) in message and "--resume" in message and "--fresh" in message
    assert "checkpoints/" in message and "mlflow_run_id" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke"]
    assert (folder / "mlflow_run_id").read_text() == "abc" and not (folder / "config.yaml").exists()


def test_resume_takes_the_folder_and_fresh_moves_the_earlier_run_aside(tmp_path):
    folder = earlier_run(tmp_path)
    make_launcher(tmp_path, resume="latest")._claim_folder()
    assert (folder / "mlflow_run_id").exists()
    make_launcher(tmp_path, fresh=True)._claim_folder()
    assert not folder.exists()
    (archive,) = [p for p in tmp_path.iterdir() if p.name.startswith("smoke.")]
    assert (archive / "mlflow_run_id").read_text() == "abc"
    earlier_run(tmp_path)
    make_launcher(tmp_path, fresh=True)._claim_folder()  # a second one in the same second
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("smoke.")]) == 2


def test_a_folder_with_only_a_config_is_not_a_run(tmp_path):
    (tmp_path / "smoke" / "logs").mkdir(parents=True)
    (tmp_path / "smoke" / "config.yaml").write_text("algo: ppo\n")
    make_launcher(tmp_path)._claim_folder()
    assert (tmp_path / "smoke" / "config.yaml").exists()


@pytest.mark.parametrize("overrides, kwargs, message", [
    (["agent.num_agents=0"], {}, "agent.num_agents=0"),
    ([], {"fresh": True, "resume": "latest"}, "--fresh"),
])
def test_settings_a_launch_cannot_run_with_are_named(tmp_path, overrides, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_launcher(tmp_path, *overrides, **kwargs)


def test_a_restarted_learner_resumes_from_the_latest_checkpoint(tmp_path):
    launcher = make_launcher(tmp_path)
    launcher.url = "redis://127.0.0.1:1/0"
    command = launcher._learner_command()
    assert "--resume" not in command
    assert command[command.index("--config") + 1] == str((tmp_path / "smoke" / "config.yaml").resolve())
    earlier_run(tmp_path)
    command = launcher._learner_command()
    assert command[command.index("--resume") + 1] == "latest" and "--resume-from" not in command

    other = make_launcher(tmp_path / "b", resume="best", resume_from=Path("elsewhere"))
    other.url = launcher.url
    command = other._learner_command()  # no checkpoint of its own yet: as it was asked to start
    assert command[command.index("--resume") + 1] == "best"
    assert command[command.index("--resume-from") + 1] == str(Path("elsewhere").resolve())


def test_restart_delays_double_up_to_a_cap():
    delays = [restart_delay(n) for n in range(1, 10)]
    assert delays[:4] == [1, 2, 4, 8] and max(delays) == 30 and delays == sorted(delays)


def test_children_get_the_malloc_limits_unless_the_user_set_them(monkeypatch):
    from surreal_redis.launcher import child_env

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    env = child_env()
    assert env["MALLOC_ARENA_MAX"] == "2" and env["MALLOC_TRIM_THRESHOLD_"] == "4096"
    assert env["PATH"] == __import__("os").environ["PATH"]


def test_agents_and_evals_get_one_blas_thread_unless_the_user_set_it(monkeypatch):
    from surreal_redis.launcher import child_env

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    agent, learner = child_env(actor=True), child_env()
    assert agent["OPENBLAS_NUM_THREADS"] == "1" and agent["OMP_NUM_THREADS"] == "3"
    assert agent["MALLOC_MMAP_THRESHOLD_"] == learner["MALLOC_MMAP_THRESHOLD_"] == "16777216"
    assert "OPENBLAS_NUM_THREADS" not in learner and learner["OMP_NUM_THREADS"] == "3"
