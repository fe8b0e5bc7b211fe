"""The learner's process started ahead of the launch (:mod:`surreal_redis.launcher.preload`):
it runs the command it is handed, with its output in the log named, in the folder named; one
that is never handed a command exits without doing anything; one that died is replaced by a
normal start."""

import subprocess
import sys

import pytest

from surreal_redis.cli import command_of
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


def test_the_console_script_starts_the_learner_ahead_before_it_loads_click_and_redis(tmp_path):
    """``surreal-redis launch`` (:func:`surreal_redis.cli.run`) starts the preload first, and
    ``launch`` takes that process over (here a bad config: the launch refuses, it is discarded)."""
    code = ("import sys\n"
            "from surreal_redis.launcher import preload\n"
            "class Probe:\n"
            "    def discard(self): print('discarded')\n"
            "def start(role):\n"
            "    print(role, sorted(m for m in ('click', 'redis', 'torch') if m in sys.modules))\n"
            "    return Probe()\n"
            "preload.Preloaded.start = staticmethod(start)\n"
            "from surreal_redis.cli import run\n"
            "run(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", code, "--log-level", "WARNING", "launch", str(tmp_path / "no.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "no.yaml" in done.stderr
    assert done.stdout.splitlines() == ["learner []", "discarded"]  # once: launch used the entry's


@pytest.mark.parametrize(("args", "command"), [
    (["launch", "c.yaml"], "launch"),
    (["--log-level", "DEBUG", "launch", "c.yaml"], "launch"),
    (["--log-level=DEBUG", "launch"], "launch"),
    (["launch", "--help"], None),
    (["--version"], None),
    (["status", "--run", "launch"], "status"),
    ([], None),
])
def test_the_entry_reads_which_command_runs_past_the_group_options(args, command):
    assert command_of(args) == command


def test_the_entry_knows_every_group_option_that_takes_a_value():
    """:data:`GROUP_OPTIONS_WITH_VALUE` is the group's, copied so the entry needs no click."""
    from surreal_redis.cli import GROUP_OPTIONS_WITH_VALUE, main

    taking = {opt for param in main.params if not getattr(param, "is_flag", False) for opt in param.opts}
    assert set(GROUP_OPTIONS_WITH_VALUE) == taking
