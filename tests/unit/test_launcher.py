"""The launcher's decisions that need no process: folders of earlier runs, settings it cannot run
with, how a learner is restarted, restart delays. (Supervision itself: tests/e2e/test_launch.py.)"""

import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from surreal_redis.config import load_config
from surreal_redis.launcher import Launcher, LaunchError
from surreal_redis.launcher.children import restart_delay
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
    from surreal_redis.runtime import child_env

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    env = child_env()
    assert env["MALLOC_ARENA_MAX"] == "2" and env["MALLOC_TRIM_THRESHOLD_"] == "4096"
    assert env["PATH"] == __import__("os").environ["PATH"]


def test_agents_and_evals_get_one_blas_thread_unless_the_user_set_it(monkeypatch):
    from surreal_redis.runtime import child_env

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    agent, learner = child_env(actor=True), child_env()
    assert agent["OPENBLAS_NUM_THREADS"] == "1" and agent["OMP_NUM_THREADS"] == "3"
    assert agent["MALLOC_MMAP_THRESHOLD_"] == learner["MALLOC_MMAP_THRESHOLD_"] == "16777216"
    assert "OPENBLAS_NUM_THREADS" not in learner and learner["OMP_NUM_THREADS"] == "3"


# ---------------------------------------------------------------- the run's announcement and final eval

def test_a_launch_announces_its_redis_in_the_run_folder_while_it_lives(tmp_path, monkeypatch):
    from surreal_redis.embedded import find_redis_server
    from surreal_redis.run_folder import live_local_runs

    if find_redis_server() is None:
        pytest.skip("no redis-server")
    launcher = make_launcher(tmp_path, "eval.enabled=false")
    seen = []

    def supervise(client):  # stands in for the children: what `status` sees while the run lives
        seen.extend(live_local_runs(tmp_path))
        return 0

    monkeypatch.setattr(launcher, "_supervise", supervise)
    assert launcher.run() == 0
    assert [(run.name, run.url, run.folder) for run in seen] == [("smoke", launcher.url, tmp_path / "smoke")]
    assert launcher.url.startswith("unix://") and not (tmp_path / "smoke" / "hub.json").exists()


def final_eval_launcher(tmp_path, fake_redis, *overrides, reported: int = 10):
    """A launcher whose learner stopped at update ``reported`` with checkpoints 5 (scored -1 by an
    early eval) and 10 (its final one) in the run folder, as the run leaves them."""
    from surreal_redis.hub.run.control import RunControl
    from tests.unit.test_final_eval import write_checkpoint

    launcher = make_launcher(tmp_path, "eval.final_episodes=2", *overrides)
    launcher.url = "redis://127.0.0.1:1/0"  # the final eval needs no Redis
    launcher.folder.path.mkdir(parents=True)
    (launcher.folder.path / "config.yaml").write_text(launcher.config.to_yaml())
    write_checkpoint(launcher.config, 5, seed=1)
    launcher.folder.checkpoints(launcher.config.checkpoint).record_score(5, -1.0)
    write_checkpoint(launcher.config, 10, seed=2)
    RunControl(fake_redis, "smoke").write_learner_status(
        {"iteration": reported, "state": "stopped", "env_steps": 2560, "mean_return": 30.0, "eval_return": -1.0},
        ttl_s=60)
    return launcher, launcher.folder.checkpoints(launcher.config.checkpoint)


def test_a_finished_run_ends_with_an_eval_of_its_final_checkpoint(tmp_path, fake_redis):
    launcher, manager = final_eval_launcher(tmp_path, fake_redis)
    lines = []
    launcher.progress = lines.append
    line = launcher._final_eval(fake_redis, 0)
    (score, iteration), = manager.best()  # checkpoint.keep_best: 1 in smoke.yaml
    assert iteration == 10 and score >= 1 and manager.resolve("best") == manager.path_for(10)
    assert line == (f"  final eval of update 10 (the final checkpoint): mean return {score:.1f} over 2 of 2 episodes "
                    f"in {line.split(' episodes in ')[1].split('s;')[0]}s; best checkpoints: update 10 ({score:.1f})")
    assert lines == ["final eval of update 10: 2 episodes, at most 60s (Ctrl-C skips it)"]
    assert "final eval of update 10" in (launcher.folder.path / "logs" / "final-eval.log").read_text()
    launcher.final_eval = line
    launcher.ending = "reached 8000 env steps"
    launcher._summary(fake_redis, 0)
    summary = lines[-1].splitlines()
    assert summary[0] == f"run 'smoke' finished (reached 8000 env steps); results in {launcher.folder.path}"
    assert summary[1] == "  2560 env steps, 10 updates, mean return 30.0, last eval -1.0" and summary[3] == line


def test_the_final_eval_started_ahead_scores_the_final_checkpoint_when_told(tmp_path, fake_redis):
    """The standby (eval --checkpoint -, started during the run) builds first, then scores the
    path it is given, exactly as an eval started after the stop would."""
    launcher, manager = final_eval_launcher(tmp_path, fake_redis)
    launcher.progress = lambda line: None
    launcher.finale.standby()
    try:
        standby = launcher.finale._standby
        assert standby is not None and standby.poll() is None
        select.select([standby.stdout], [], [], 120)  # until it says it is ready
        line = launcher._final_eval(fake_redis, 0)
    finally:
        launcher.finale.close()
    (score, iteration), = manager.best()
    assert iteration == 10 and line.startswith(f"  final eval of update 10 (the final checkpoint): mean return "
                                               f"{score:.1f} over 2 of 2 episodes")
    assert standby.returncode == 0 and launcher.finale._standby is None
    log = (launcher.folder.path / "logs" / "final-eval.log").read_text()
    assert log.index("final eval ready: waiting") < log.index("final eval of update 10")


def test_a_final_eval_started_ahead_and_not_ready_at_the_stop_is_replaced(tmp_path, fake_redis, monkeypatch):
    """A standby still building (at the lowest priority, which a busy machine may starve) is
    ended, and a fresh eval at full priority scores the checkpoint."""
    launcher, manager = final_eval_launcher(tmp_path, fake_redis)
    launcher.progress = lambda line: None
    finale = launcher.finale
    monkeypatch.setattr(finale, "command", lambda *role: [sys.executable, "-c", "import time; time.sleep(60)"])
    finale.standby()  # never ready
    standby = finale._standby
    monkeypatch.undo()
    try:
        line = launcher._final_eval(fake_redis, 0)
    finally:
        finale.close()
    assert standby.returncode is not None and finale._standby is None
    assert line.startswith("  final eval of update 10 (the final checkpoint)") and manager.best()[0][1] == 10


def test_an_unused_final_eval_started_ahead_exits_when_closed(tmp_path, fake_redis):
    launcher, manager = final_eval_launcher(tmp_path, fake_redis)
    launcher.finale.standby()
    standby = launcher.finale._standby
    launcher.signalled = "signal SIGINT"
    try:
        assert launcher._final_eval(fake_redis, 0) == "  final eval: skipped (signal SIGINT)"
    finally:
        launcher.finale.close()
    # exited at its stdin's end, or killed while still building: nothing recorded either way
    assert standby.returncode in (0, -signal.SIGKILL) and manager.best() == [(-1.0, 5)]
    launcher.finale.close()  # twice: nothing left to close


@pytest.mark.parametrize("case, message", [
    ("ctrl-c", "  final eval: skipped (signal SIGINT)"),
    ("no final checkpoint", "  final eval: skipped (the learner left no final checkpoint: it reported update 12, "
                            "stopped; the latest is 10)"),
    ("failed", ""),
    ("disabled", ""),
])
def test_no_final_eval_after_ctrl_c_a_failure_or_without_its_checkpoint(tmp_path, fake_redis, case, message):
    launcher, manager = final_eval_launcher(tmp_path, fake_redis, *(["eval.final_episodes=0"] * (case == "disabled")),
                                            reported=12 if case == "no final checkpoint" else 10)
    launcher.signalled = "signal SIGINT" if case == "ctrl-c" else ""
    assert launcher._final_eval(fake_redis, 1 if case == "failed" else 0) == message
    assert manager.best() == [(-1.0, 5)] and not (launcher.folder.path / "logs" / "final-eval.log").exists()


def test_a_ctrl_c_during_the_final_eval_ends_it_with_nothing_recorded(tmp_path, fake_redis):
    launcher, manager = final_eval_launcher(tmp_path, fake_redis)
    launcher.progress = lambda line: launcher.stop.set("signal SIGINT")  # Ctrl-C as it starts
    assert launcher._final_eval(fake_redis, 0) == "  final eval: interrupted, nothing recorded"
    assert manager.best() == [(-1.0, 5)]


# ---------------------------------------------------------------- a live run is never touched
# An operator's second launch of a live run (--fresh, --resume or plain) is refused before it moves
# or deletes anything, and says the run is live. Redis is unreachable (port 1) or fake here: a
# launch that got past the check would move the folder, then fail to connect.

def hold(code: str, tmp_path: Path) -> subprocess.Popen:
    """A process that runs ``code`` (with ``folder``, the run folder), prints 'ready' and sleeps."""
    script = (f"import fcntl, pathlib, time\nfolder = pathlib.Path({str(tmp_path / 'smoke')!r})\n{code}\n"
              "print('ready', flush=True)\ntime.sleep(120)\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


LIVE_LAUNCHERS = {
    # a launcher's lock on its folder, held for its life (before it announced itself in hub.json)
    "lock": "lock = open(folder / 'launch.lock', 'a')\nfcntl.flock(lock, fcntl.LOCK_EX)",
    # a launcher's hub.json: its pid, which still runs
    "hub.json": "from surreal_redis.run_folder import RunFolder\nRunFolder(folder).announce('smoke', 'unix:///x.sock')",
}


@pytest.mark.parametrize("how", sorted(LIVE_LAUNCHERS))
@pytest.mark.parametrize("flag", [{"fresh": True}, {"resume": "latest"}, {}])
def test_a_folder_whose_launcher_lives_is_refused_and_left_alone(tmp_path, how, flag):
    folder = earlier_run(tmp_path)
    live = hold(LIVE_LAUNCHERS[how], tmp_path)
    try:
        before = sorted(p.name for p in folder.iterdir())
        with pytest.raises(LaunchError) as refused:
            make_launcher(tmp_path, "redis.url=redis://127.0.0.1:1/0", **flag).run()
        message = str(refused.value)
        assert f"run 'smoke' is live: its launcher (pid {live.pid})" in message, message
        assert "nothing was moved or deleted" in message and "surreal-redis stop --run smoke" in message
        assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke"]  # not moved aside
        assert sorted(p.name for p in folder.iterdir()) == before
        assert (folder / "mlflow_run_id").read_text() == "abc"
    finally:
        live.kill()
        live.wait()
    make_launcher(tmp_path, fresh=True)._claim_folder()  # once it is gone, --fresh moves it as before
    assert not folder.exists()


@pytest.mark.parametrize("flag", [{"fresh": True}, {"resume": "latest"}, {}])
def test_a_learner_alive_on_a_shared_redis_is_found_before_anything_is_moved_or_deleted(
        tmp_path, fake_redis, monkeypatch, flag):
    """A run on another host: no lock or hub.json here, but its learner reports in the shared Redis."""
    import time

    from surreal_redis.hub.run.control import RunControl
    from surreal_redis.launcher import supervisor as launcher_module

    folder = earlier_run(tmp_path)
    control = RunControl(fake_redis, "smoke")
    control.store_config("algo: ppo\n")
    control.write_learner_status({"state": "running", "time": time.time() - 3, "pid": 4242, "iteration": 7}, 60)
    keys = sorted(fake_redis.keys())
    monkeypatch.setattr(launcher_module, "connect", lambda url, settings=None: fake_redis)
    with pytest.raises(LaunchError) as refused:
        make_launcher(tmp_path, "redis.url=redis://shared:6379/0", **flag).run()
    message = str(refused.value)
    assert "run 'smoke' is live: its learner (pid 4242) reported 3s ago on redis://shared:6379/0" in message
    assert "nothing was moved or deleted" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke"]
    assert (folder / "mlflow_run_id").read_text() == "abc" and not (folder / "config.yaml").exists()
    assert sorted(fake_redis.keys()) == keys


def test_a_launcher_holds_its_folder_for_its_life_and_a_fresh_one_takes_the_new_folder(tmp_path, monkeypatch):
    """While a launch runs, a second one on the folder is refused; --fresh takes the lock of the
    new folder (the old one moved away with its lock)."""
    from surreal_redis.embedded import find_redis_server

    if find_redis_server() is None:
        pytest.skip("no redis-server")
    earlier_run(tmp_path)
    first = make_launcher(tmp_path, "eval.enabled=false", fresh=True)
    refusals = []

    def supervise(client):
        with pytest.raises(LaunchError) as refused:
            make_launcher(tmp_path, "redis.url=redis://127.0.0.1:1/0", fresh=True).run()
        refusals.append(str(refused.value))
        return 0

    monkeypatch.setattr(first, "_supervise", supervise)
    assert first.run() == 0
    assert len(refusals) == 1 and "is live" in refusals[0]
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("smoke.")]) == 1  # only the first one's move
    make_launcher(tmp_path, resume="latest").claim.lock_folder()  # released when it ended


# ---------------------------------------------------------------- the run's lease in a shared Redis

@pytest.mark.parametrize("flag", [{"fresh": True}, {"resume": "latest"}, {}])
def test_a_run_whose_lease_another_launch_holds_is_refused_before_anything_is_moved_or_deleted(
        tmp_path, fake_redis, monkeypatch, flag):
    """Another launch owns the run (its lease), from another folder, and its learner has not
    reported (starting, restarting, or reporting rarely): refused all the same."""
    from surreal_redis.hub.run.control import RunControl
    from surreal_redis.hub.run.lease import RunLease
    from surreal_redis.launcher import supervisor as launcher_module

    folder = earlier_run(tmp_path)
    RunControl(fake_redis, "smoke").store_config("algo: ppo\n")
    other = RunLease(fake_redis, "smoke", folder="/elsewhere/smoke")
    other.acquire()
    keys = {key: fake_redis.dump(key) for key in fake_redis.keys()}
    monkeypatch.setattr(launcher_module, "connect", lambda url, settings=None: fake_redis)
    with pytest.raises(LaunchError) as refused:
        make_launcher(tmp_path, "redis.url=redis://shared:6379/0", **flag).run()
    message = str(refused.value)
    assert "\n" not in message
    assert (f"run 'smoke' is live: its launch (pid {other.owner['pid']} on host {other.owner['host']}, folder "
            f"/elsewhere/smoke) holds the run's lease on redis://shared:6379/0") in message, message
    assert "nothing was moved or deleted" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke"]
    assert (folder / "mlflow_run_id").read_text() == "abc" and not (folder / "config.yaml").exists()
    assert {key: fake_redis.dump(key) for key in fake_redis.keys()} == keys  # its lease and keys untouched


def test_a_launch_holds_the_runs_lease_for_its_life_and_drops_an_earlier_runs_keys_under_it(
        tmp_path, fake_redis, monkeypatch):
    import json
    import os

    from surreal_redis.hub.run.control import RunControl
    from surreal_redis.keys import RunKeys
    from surreal_redis.launcher import supervisor as launcher_module

    RunControl(fake_redis, "smoke").store_config("algo: ppo\n")  # left by an earlier run, long gone
    monkeypatch.setattr(launcher_module, "connect", lambda url, settings=None: fake_redis)
    launcher = make_launcher(tmp_path, "redis.url=redis://shared:6379/0", "eval.enabled=false")
    seen = []

    def supervise(client):
        seen.append(json.loads(client.get(RunKeys("smoke").lease)))
        return 0

    monkeypatch.setattr(launcher, "_supervise", supervise)
    assert launcher.run() == 0
    assert seen[0]["pid"] == os.getpid() and seen[0]["folder"] == str(tmp_path / "smoke")
    assert fake_redis.get(RunKeys("smoke").lease) is None  # released at the exit


def test_a_launch_that_lost_its_lease_writes_nothing_to_the_run(tmp_path, fake_redis):
    """Its lease expired (the launcher was frozen or cut off longer than its TTL) and another
    launch took the run: stopping, it writes no stop request into the new owner's run."""
    from surreal_redis.hub.run.control import RunControl
    from surreal_redis.hub.run.lease import LeaseKeeper, RunLease

    launcher = make_launcher(tmp_path)
    launcher.claim._lease = LeaseKeeper(RunLease(fake_redis, "smoke"))
    launcher.claim._lease.lost.set()
    RunControl(fake_redis, "smoke").start()  # the new owner's run
    launcher._shutdown(fake_redis)
    assert RunControl(fake_redis, "smoke").stopping() == (False, "")


def test_the_learner_leaves_the_final_curves_to_the_launch_only_when_its_final_eval_redraws_them(tmp_path):
    flag = "--final-curves-by-launch"
    assert flag in make_launcher(tmp_path, "tracking.enabled=true", "eval.final_episodes=3")._learner_command()
    assert flag not in make_launcher(tmp_path, "tracking.enabled=true", "eval.final_episodes=0")._learner_command()
    assert flag not in make_launcher(tmp_path, "tracking.enabled=true", "eval.enabled=false")._learner_command()
    assert flag not in make_launcher(tmp_path, "tracking.enabled=false")._learner_command()
