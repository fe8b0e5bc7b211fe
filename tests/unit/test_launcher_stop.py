"""When the run stops, the launcher stops agents and eval at once (SIGTERM), while the learner
writes its final checkpoint and MLflow run, instead of after the learner exited: eval waits
eval.every_s between evals and would otherwise hold the launch open. Eval starts after the
learner's first publish."""

import sys
import time

from surreal_redis.config import load_config
from surreal_redis.hub.run.control import RunControl
from surreal_redis.launcher import Child, Launcher
from surreal_redis.runtime import StopFlag


def sleeper(tmp_path, name: str, seconds: float) -> Child:
    return Child(name, [sys.executable, "-c", f"import time; time.sleep({seconds})"], tmp_path / f"{name}.log", 0)


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
        for child in children:
            if child.alive:
                child.process.kill()
                child.process.wait()


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
    finally:
        for child in children:
            if child.alive:
                child.process.kill()
                child.process.wait()
