"""When the run stops, the launcher stops agents and eval at once (SIGTERM), while the learner
writes its final checkpoint and MLflow run, instead of after the learner exited: eval waits
eval.every_s between evals and would otherwise hold the launch open. Eval starts after the
learner's first publish."""

import subprocess
import sys
import time

import pytest

from surreal_redis.config import load_config
from surreal_redis.hub.run.control import RunControl
from surreal_redis.launcher import Launcher
from surreal_redis.launcher.children import Child
from surreal_redis.runtime import StopFlag


def sleeper(tmp_path, name: str, seconds: float) -> Child:
    return Child(name, [sys.executable, "-c", f"import time; time.sleep({seconds})"], tmp_path / f"{name}.log", 0)


def end_all(launcher: Launcher, children: list[Child]) -> None:
    """What a test's launcher left running: its final eval's processes and its children."""
    launcher.finale.close()
    for child in children:
        if child.alive:
            child.process.kill()
            child.process.wait()


def test_agents_and_eval_stop_while_the_learner_finishes(tmp_path, fake_redis, monkeypatch):
    config = load_config("smoke", [f"experiment.root={tmp_path}"])
    launcher = Launcher(config, StopFlag(install_handlers=False))
    children = [sleeper(tmp_path, "learner", 3), sleeper(tmp_path, "agent-0", 60), sleeper(tmp_path, "eval-0", 60)]
    monkeypatch.setattr(launcher, "_children", lambda: children)
    monkeypatch.setattr(launcher, "_wait_for_parameters", lambda client, learner: True)
    RunControl(fake_redis, config.run).request_stop("target reached")
    started = time.monotonic()
    try:
        assert launcher._supervise(fake_redis) == 0  # the learner (3 s) exited 0
        assert launcher.ending == "target reached"
        assert time.monotonic() - started < 30
        for child in children[1:]:  # already gone when the launcher's shutdown begins
            assert child.process.poll() is not None, child.name
            assert child.process.returncode == -15, child.name
    finally:
        end_all(launcher, children)


def test_eval_starts_after_the_first_parameters(tmp_path, fake_redis, monkeypatch):
    """Learner and agents start at once; eval only once the learner published (its torch import
    would compete with theirs for the first update)."""
    config = load_config("smoke", [f"experiment.root={tmp_path}"])
    launcher = Launcher(config, StopFlag(install_handlers=False))
    children = [sleeper(tmp_path, "learner", 3), sleeper(tmp_path, "agent-0", 60), sleeper(tmp_path, "eval-0", 60)]
    monkeypatch.setattr(launcher, "_children", lambda: children)
    started_when_published: list[list[bool]] = []

    def published(client, learner):
        started_when_published.append([child.process is not None for child in children])
        return True

    monkeypatch.setattr(launcher, "_wait_for_parameters", published)
    RunControl(fake_redis, config.run).request_stop("target reached")
    try:
        launcher._supervise(fake_redis)
        assert started_when_published == [[True, True, False]]
        assert children[2].process is not None  # started after the publish
        assert launcher.finale._standby is not None  # so is the final eval's process, made ready ahead
    finally:
        end_all(launcher, children)


def test_the_final_eval_begins_once_the_learner_reports_its_stop_not_at_its_exit(tmp_path, fake_redis, monkeypatch):
    """The learner reports "stopped" at its final checkpoint, then closes its MLflow run (a
    tenth of a second to seconds): the final eval plays meanwhile, not after the learner's exit."""
    from tests.unit.test_final_eval import write_checkpoint

    config = load_config("smoke", [f"experiment.root={tmp_path}"])
    launcher = Launcher(config, StopFlag(install_handlers=False), progress=lambda line: None)
    children = [sleeper(tmp_path, "learner", 3), sleeper(tmp_path, "agent-0", 60)]
    monkeypatch.setattr(launcher, "_children", lambda: children)
    monkeypatch.setattr(launcher, "_wait_for_parameters", lambda client, learner: True)
    monkeypatch.setattr(launcher.finale, "standby", lambda: None)
    begun: list[tuple[int, bool]] = []

    def begin(path, iteration):
        begun.append((iteration, children[0].alive))
        process = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE)
        launcher.finale._begun = (process, iteration, tmp_path / "final-eval.log")

    monkeypatch.setattr(launcher.finale, "_begin", begin)
    write_checkpoint(config, 7)
    control = RunControl(fake_redis, config.run)
    control.write_learner_status({"state": "running", "iteration": 6}, ttl_s=60)
    control.request_stop("target reached")
    try:
        launcher.stop.wait(0.3)
        assert begun == []  # no final checkpoint reported yet
        control.write_learner_status({"state": "stopped", "iteration": 7}, ttl_s=60)
        assert launcher._supervise(fake_redis) == 0
        assert begun == [(7, True)]  # once, while the learner still ran
    finally:
        end_all(launcher, children)


def test_no_final_eval_begins_after_a_signal(tmp_path, fake_redis, monkeypatch):
    from tests.unit.test_final_eval import write_checkpoint

    config = load_config("smoke", [f"experiment.root={tmp_path}"])
    launcher = Launcher(config, StopFlag(install_handlers=False), progress=lambda line: None)
    learner = sleeper(tmp_path, "learner", 1)
    monkeypatch.setattr(launcher.finale, "_begin", lambda path, iteration: pytest.fail("began after a signal"))
    write_checkpoint(config, 7)
    RunControl(fake_redis, config.run).write_learner_status({"state": "stopped", "iteration": 7}, ttl_s=60)
    learner.start()
    launcher.stop.set("signal SIGINT")
    assert launcher._wait_learner(fake_redis, learner) == 0


def test_a_learner_finishing_before_the_launchers_next_try_still_shows_redis_came_back(
        tmp_path, fake_redis, monkeypatch, caplog):
    """The path between an outage and the end: Redis returns (empty) and the learner finishes while
    the launcher's backoff still waits. The first call that answers says Redis is back and writes
    the run's state again; no later round of the loop has to."""
    import redis

    config = load_config("smoke", [f"experiment.root={tmp_path}"])
    launcher = Launcher(config, StopFlag(install_handlers=False), progress=lambda line: None)
    done = tmp_path / "learner-may-finish"
    learner = Child("learner", [sys.executable, "-c", "import os, time\n"
                                f"while not os.path.exists({str(done)!r}): time.sleep(0.02)"],
                    tmp_path / "learner.log", 0)
    children = [learner, sleeper(tmp_path, "agent-0", 60)]
    monkeypatch.setattr(launcher, "_children", lambda: children)
    monkeypatch.setattr(launcher, "_wait_for_parameters", lambda client, learner: True)
    real_stopping, failures = RunControl.stopping, []

    def stopping(control):
        if len(failures) < 3:  # three failed rounds; on the last the learner exits, Redis back empty
            failures.append(1)
            if len(failures) == 3:
                done.touch()
                learner.process.wait(30)
                fake_redis.flushall()
            raise redis.ConnectionError("down")
        return real_stopping(control)

    monkeypatch.setattr(RunControl, "stopping", stopping)
    try:
        with caplog.at_level("INFO"):
            assert launcher._supervise(fake_redis) == 0
        assert launcher.ending == "the learner finished"
        assert "launcher: Redis reachable again" in caplog.text
        assert RunControl(fake_redis, config.run).stored_config() is not None  # written again
    finally:
        end_all(launcher, children)


# ---------------------------------------------------------------- exit codes and a second signal

def test_an_interrupted_run_exits_130_and_a_requested_stop_0(tmp_path, fake_redis, monkeypatch):
    """Scripts tell an interrupted run from a finished one by its exit code (the shell's 128 + SIGINT)."""
    codes = {}
    for reason in ("signal SIGINT", "signal SIGTERM", "stop requested"):
        config = load_config("smoke", [f"experiment.root={tmp_path / reason.replace(' ', '_')}",
                                       "eval.final_episodes=0"])
        launcher = Launcher(config, StopFlag(install_handlers=False), progress=lambda line: None)
        monkeypatch.setattr(launcher, "_prepare", lambda: fake_redis)

        def supervise(client, launcher=launcher, reason=reason):
            launcher.stop.set(reason)
            launcher.ending = reason
            return 0

        monkeypatch.setattr(launcher, "_supervise", supervise)
        codes[reason] = launcher.run()
    assert codes == {"signal SIGINT": 130, "signal SIGTERM": 130, "stop requested": 0}


def with_stop_flag(*lines: str) -> subprocess.CompletedProcess:
    """Python ``lines`` run in a process of their own after ``flag = StopFlag()`` (its handlers
    installed; ``atexit``, ``logging``, ``os``, ``signal``, ``sys`` and ``time`` imported)."""
    code = "\n".join(["import atexit, logging, os, signal, sys, time",
                      "from surreal_redis.runtime import StopFlag",
                      "logging.basicConfig(stream=sys.stdout, format='%(message)s', level=logging.INFO)",
                      "flag = StopFlag()", *lines])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_second_signal_exits_130_after_saying_what_its_callback_reports():
    done = with_stop_flag("flag.on_second_signal(lambda name: f'updates 5-9 not saved ({name})')",
                          "os.kill(os.getpid(), signal.SIGINT)",
                          "time.sleep(0.1)",
                          "print('first', bool(flag), flush=True)",
                          "os.kill(os.getpid(), signal.SIGINT)",
                          "time.sleep(5)",
                          "print('not reached')")
    assert done.returncode == 130, done.stderr
    assert done.stdout.splitlines()[-2:] == ["first True", "second SIGINT: exiting now; updates 5-9 not saved (SIGINT)"]


def test_signals_after_the_finish_leave_the_chosen_exit_code():
    """Once the launch is done and its code chosen, a late Ctrl-C changes nothing. Without
    ``finish`` the interpreter's shutdown, which puts the handler back to the default action, let
    a second Ctrl-C end the launch killed by SIGINT (-2) instead of 130; here the late signals
    come from an atexit hook, after the handler would have exited 130 at once."""
    done = with_stop_flag("os.kill(os.getpid(), signal.SIGINT)",
                          "time.sleep(0.1)",
                          "flag.finish()",
                          "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT),"
                          " os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.1)))",
                          "print('finished', bool(flag), flush=True)",
                          "sys.exit(7)")
    assert done.returncode == 7, done.stderr
    assert done.stdout.splitlines()[-1] == "finished True"


def test_the_first_signal_after_a_stop_set_by_code_still_stops_cleanly():
    """A process already stopping on the run's control state (or its own limit) and then sent
    SIGTERM (the launcher's, an orchestrator's) finishes its clean stop instead of exiting at once."""
    done = with_stop_flag("flag.set('run stopping (stop requested)')",
                          "os.kill(os.getpid(), signal.SIGTERM)",
                          "time.sleep(0.2)",
                          "print('clean stop', flag.reason, flush=True)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "clean stop run stopping (stop requested)"


def test_the_launchers_second_signal_says_which_updates_are_not_saved(tmp_path, fake_redis):
    from surreal_redis.launcher.final_eval import not_saved
    from surreal_redis.launcher.supervisor import INTERRUPTED_EXIT  # noqa: F401  (the code it exits with)
    from tests.unit.test_final_eval import write_checkpoint

    config = load_config("smoke", [f"experiment.root={tmp_path}"])
    launcher = Launcher(config, StopFlag(install_handlers=False))
    launcher.folder.path.mkdir(parents=True)
    status = {"iteration": 9, "state": "running", "time": time.time()}
    assert not_saved(config, launcher.folder, status) == ("no checkpoint is saved: updates 1-9 are lost; "
                                                          "the MLflow run is marked KILLED once the learner is gone")
    write_checkpoint(config, 4)
    assert not_saved(config, launcher.folder, status) == ("the learner's final checkpoint is not saved: updates 5-9 "
                                                          "are lost (the latest checkpoint is update 4); "
                                                          "the MLflow run is marked KILLED once the learner is gone")
    status.update(iteration=4, state="stopped")
    assert not_saved(config, launcher.folder, status).startswith("the learner's final checkpoint (update 4) is saved; ")
    assert not_saved(config, launcher.folder, {}).startswith("the learner reported no update (nothing to save); ")


def test_a_tracking_process_whose_learner_dies_marks_the_run_killed(tmp_path):
    """A learner killed at once (a second Ctrl-C, SIGKILL) never finishes its MLflow run: its
    tracking process, whose stdin then closes, marks it KILLED instead of leaving it RUNNING."""
    from mlflow.tracking import MlflowClient

    from surreal_redis.tracking import TrackerProcess

    store = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    tracker = TrackerProcess(tmp_path, "exp", "run-a", store)
    tracker.log_metrics({"loss": 0.5}, 3)
    tracker.process.stdin.close()  # what the learner's death does
    assert tracker.process.wait(timeout=60) == 0
    run = MlflowClient(tracking_uri=store).get_run(tracker.run_id)
    assert run.info.status == "KILLED" and run.data.metrics["loss"] == 0.5
