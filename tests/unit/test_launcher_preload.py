"""The learner's process started ahead of the launch (:mod:`surreal_redis.launcher.preload`):
it runs the command it is handed, with its output in the log named, in the folder named; one
that is never handed a command exits without doing anything; one that died is replaced by a
normal start."""

import subprocess
import sys

from surreal_redis.launcher.children import CLI, Child
from surreal_redis.launcher.preload import Preloaded


def test_a_preloaded_process_runs_the_command_it_is_handed_in_its_log_and_folder(tmp_path):
    preloaded = Preloaded.start("learner")
    assert preloaded is not None
    process = preloaded.hand_over(["learner", "--help"], tmp_path / "learner.log", tmp_path)
    assert process is preloaded.process and preloaded.used
    assert process.wait(timeout=120) == 0
    assert "Run the learner" in (tmp_path / "learner.log").read_text()
    preloaded.discard()  # handed over: nothing to do, and the process is not touched
    assert process.returncode == 0


def test_a_preloaded_process_never_handed_a_command_exits_without_running_one(tmp_path):
    preloaded = Preloaded.start("learner")
    assert preloaded is not None
    preloaded.process.stdin.close()  # the launch ended: its stdin closes
    assert preloaded.process.wait(timeout=120) == 0
    preloaded.discard()  # gone already: nothing to do
    assert list(tmp_path.iterdir()) == []


def test_a_child_whose_preloaded_process_died_starts_afresh(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    dead.wait()
    child = Child("learner", [*CLI, "learner", "--help"], tmp_path / "logs" / "learner.log", 0,
                  preloaded=Preloaded("learner", dead))
    child.start()
    assert child.process is not dead and child.preloaded is None
    assert child.process.wait(timeout=120) == 0
    assert "Run the learner" in child.log_path.read_text()


def test_an_unknown_role_is_refused():
    done = subprocess.run([sys.executable, "-m", "surreal_redis.cli.preload", "agent"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr
