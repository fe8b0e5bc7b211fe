"""MLflow off the learner's thread and process: BackgroundTracker runs every call in order in its
own thread, TrackerProcess runs MLflow in a child process,
finish() returns only once all is written, an MLflow error surfaces in the caller; a learner
stopping with tracking keeps the latest and the best checkpoint in the run, and its run is
complete (FINISHED, metrics and params there) when _finish returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from surreal_redis.learner.loop import Learner
from surreal_redis.runtime import StopFlag
from surreal_redis.tracking import BackgroundTracker, Tracker, TrackerProcess, TrackingError, seed_store

from .test_learner import ppo_config, received, send_steps


class Recorder:
    """Stands in for a Tracker: records calls and the thread they ran in; ``fail_on`` raises."""

    def __init__(self, fail_on: str = "", gate: threading.Event | None = None) -> None:
        self.calls: list[tuple] = []
        self.threads: set[str] = set()
        self.fail_on, self.gate = fail_on, gate

    def _record(self, *call) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        if call[0] == self.fail_on:
            raise ValueError(f"store refused {call[0]}")
        self.calls.append(call)

    def log_params(self, params):
        self._record("params", params)

    def log_metrics(self, metrics, step):
        self._record("metrics", metrics, step)

    def log_artifact(self, path, artifact_path=None, missing_ok=False):
        self._record("artifact", path, artifact_path)

    def log_points(self, records):
        self._record("points", records)

    def draw_curves(self, path):
        self._record("draw", path)

    def finish(self, status="FINISHED"):
        self._record("finish", status)


def test_calls_return_at_once_and_run_in_order_in_another_thread():
    gate = threading.Event()  # the store is "opening" until set: nothing can be written yet
    recorder = Recorder(gate=gate)
    tracker = BackgroundTracker(lambda: recorder)
    metrics = {"loss": 1.0}
    tracker.log_params({"a": 1})
    tracker.log_metrics(metrics, 3)
    metrics["loss"] = 2.0  # the caller's dict may change after the call: what was passed is logged
    tracker.log_artifact(Path("x.pt"), "checkpoints")
    assert recorder.calls == []
    gate.set()
    tracker.finish("KILLED")
    assert recorder.calls == [("params", {"a": 1}), ("metrics", {"loss": 1.0}, 3),
                              ("artifact", Path("x.pt"), "checkpoints"), ("finish", "KILLED")]
    assert recorder.threads == {"mlflow"}


def test_a_tracker_behind_draws_once_the_latest_state_and_keeps_every_point():
    gate = threading.Event()  # a store slower than the learner: its calls queue up
    recorder = Recorder(gate=gate)
    tracker = BackgroundTracker(lambda: recorder)
    for number in range(3):
        tracker.log_points([("curve/train_return", float(number), number, number)])
        tracker.draw_curves(Path("curves.png"))  # at each checkpoint
    tracker.draw_curves(Path("other.png"))
    tracker.log_metrics({"final": 1.0}, 9)
    tracker.draw_curves(Path("curves.png"))  # at the stop, after the final metrics
    gate.set()
    tracker.finish()
    assert recorder.calls == [("points", [("curve/train_return", float(n), n, n)]) for n in range(3)] + [
        ("draw", Path("other.png")), ("metrics", {"final": 1.0}, 9), ("draw", Path("curves.png")), ("finish", "FINISHED")]


def test_a_deferred_tracker_opens_when_told_or_at_its_finish():
    """The learner's tracker opens at its first update (MLflow's start-up takes none of the
    learner's); calls made before are queued and written once it is open, and a learner that
    stops before any update still writes its run."""
    for told in (True, False):
        opened: list[bool] = []
        recorder = Recorder()

        def open_tracker(recorder=recorder, opened=opened):
            opened.append(True)
            return recorder

        tracker = BackgroundTracker(open_tracker, deferred=True)
        tracker.log_params({"a": 1})
        time.sleep(0.05)  # an eager tracker would have opened and written by now
        assert opened == [] and recorder.calls == []
        if told:
            tracker.open()
            tracker.open()  # once
        tracker.finish()
        assert opened == [True] and recorder.calls == [("params", {"a": 1}), ("finish", "FINISHED")]


def test_a_failed_call_is_raised_by_the_next_call_and_by_finish():
    recorder = Recorder(fail_on="metrics")
    tracker = BackgroundTracker(lambda: recorder)
    tracker.log_metrics({"loss": 1.0}, 1)
    tracker._thread.join(10)  # the thread ends at the error
    with pytest.raises(TrackingError, match="store refused metrics") as raised:
        tracker.log_params({"a": 1})
    assert isinstance(raised.value.__cause__, ValueError)
    with pytest.raises(TrackingError):
        tracker.finish()
    assert recorder.calls == []


def test_a_tracker_that_cannot_open_is_raised_by_finish():
    def refuse():
        raise OSError("no such store")

    tracker = BackgroundTracker(refuse)
    with pytest.raises(TrackingError, match="no such store"):
        tracker.finish()


def test_learner_finish_completes_the_mlflow_run_with_the_latest_and_best_checkpoints(fake_redis, tmp_path):
    from mlflow.tracking import MlflowClient

    config = ppo_config(tmp_path, "tracking.enabled=true", "checkpoint.min_interval_s=0", "checkpoint.keep_last=3")
    learner = Learner.from_config(config, fake_redis, StopFlag(install_handlers=False))
    assert isinstance(learner.tracker, BackgroundTracker)  # opening meanwhile
    learner.start()
    for _ in range(3):  # three updates, a checkpoint after each (checkpoint.every_updates=1)
        send_steps(fake_redis, config, learner, 32)
        learner.iterate(received(learner))
    assert learner.algo.iteration == 3
    learner.checkpoints.record_score(2, 10.0)  # the best one is not the latest
    learner._finish("FINISHED")
    client = MlflowClient(tracking_uri=f"sqlite:///{config.experiment_dir.resolve()}/mlflow.db")
    run = client.get_run((config.experiment_dir / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FINISHED"
    assert run.data.params and run.data.metrics
    kept = sorted(item.path for item in client.list_artifacts(run.info.run_id, "checkpoints"))
    assert kept == ["checkpoints/best.json", "checkpoints/ckpt-0000000002.pt", "checkpoints/ckpt-0000000003.pt"]
    assert len(list(learner.checkpoints.directory.glob("ckpt-*.pt"))) == 3  # the folder keeps the rest


def _store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path.resolve()}/mlflow.db"


def test_tracker_process_writes_the_run_and_reports_errors_by_name(tmp_path):
    """A real child process and SQLite store: params, metrics, an artifact and the end status
    land in MLflow; a failed call raises the child's error and the next calls still work; Ctrl-C
    and SIGTERM meant for the learner's terminal or launcher do not end the child."""
    from mlflow.tracking import MlflowClient

    tracker = TrackerProcess(tmp_path, "exp", "run-a", _store(tmp_path))
    assert (tmp_path / "mlflow_run_id").read_text() == tracker.run_id
    # its calls at the learner's priority (the learner's stop waits for the last ones); its
    # start-up ran in a thread at the lowest (runtime.lower_thread_priority)
    assert os.getpriority(os.PRIO_PROCESS, tracker.process.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    tracker.log_params({"ppo.lr": 0.0003, "env.id": "CartPole-v1"})
    tracker.log_metrics({"loss": np.float32(0.5), "skipped": None, "nan": float("nan")}, 7)
    with pytest.raises(TrackingError, match="FileNotFoundError: .*nowhere.pt"):
        tracker.log_artifact(tmp_path / "nowhere.pt", "checkpoints")
    # a checkpoint the final eval pruned between the learner's stop listing it and the copy
    tracker.log_artifact(tmp_path / "pruned.pt", "checkpoints", missing_ok=True)
    with pytest.raises(TrackingError, match="no such tracking call 'delete_run'"):
        tracker._call("delete_run", tracker.run_id)
    for signum in (signal.SIGINT, signal.SIGTERM):
        tracker.process.send_signal(signum)
    artifact = tmp_path / "best.json"
    artifact.write_text("{}")
    tracker.log_artifact(artifact, "checkpoints")
    tracker.finish("KILLED")
    assert tracker.process.returncode == 0
    run = MlflowClient(tracking_uri=_store(tmp_path)).get_run(tracker.run_id)
    assert run.info.status == "KILLED" and run.info.run_name == "run-a"
    assert run.data.params == {"ppo.lr": "0.0003", "env.id": "CartPole-v1"} and run.data.metrics == {"loss": 0.5}
    client = MlflowClient(tracking_uri=_store(tmp_path))
    assert [item.path for item in client.list_artifacts(tracker.run_id, "checkpoints")] == ["checkpoints/best.json"]
    again = TrackerProcess(tmp_path, "exp", "run-a", _store(tmp_path))  # the folder's run continues
    assert again.run_id == tracker.run_id
    again.process.kill()
    again.process.wait()
    with pytest.raises(TrackingError, match="exited with code -9"):
        again.log_metrics({"loss": 1.0}, 8)


def test_a_tracker_process_that_cannot_open_its_store_says_why(tmp_path):
    (tmp_path / "a-file").write_text("")  # no store can be made below a file
    with pytest.raises(TrackingError, match="MLflow tracking failed in its process: .*a-file"):
        TrackerProcess(tmp_path / "run", "exp", "run-a", f"sqlite:///{tmp_path}/a-file/mlflow.db")


def test_the_tracker_process_ends_with_the_process_that_started_it(tmp_path):
    """A learner killed with -9 closes the child's stdin: the child exits instead of lingering."""
    code = ("import os, sys; from pathlib import Path\n"
            "from surreal_redis.tracking import TrackerProcess\n"
            f"tracker = TrackerProcess(Path({str(tmp_path)!r}), 'exp', 'r', {_store(tmp_path)!r})\n"
            "print(tracker.process.pid, flush=True); os._exit(0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    pid = int(result.stdout.split()[0])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and b"Z" not in Path(f"/proc/{pid}/stat").read_bytes().split(b")")[1][:3]:
        assert time.monotonic() < deadline, "the tracker process outlived its parent"
        time.sleep(0.1)


def test_a_new_local_store_is_a_copy_of_one_made_once(tmp_path, monkeypatch):
    """The first run on a machine makes the empty store (MLflow's migrations) in the cache, later
    runs copy it; each copy is a whole MLflow store, its Default experiment's artifacts inside its
    own run folder. A cache that cannot be written leaves the store to MLflow."""
    import sqlite3

    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    template = tmp_path / "cache" / "surreal-redis" / f"mlflow-{mlflow.__version__}.db"
    first = Tracker(tmp_path / "a", "exp", "run-a")
    made = template.stat().st_mtime_ns
    second = Tracker(tmp_path / "b", "exp", "run-b")
    assert template.stat().st_mtime_ns == made and not list(template.parent.glob("*.tmp"))
    for tracker, folder in ((first, tmp_path / "a"), (second, tmp_path / "b")):
        tracker.log_metrics({"loss": 0.5}, 1)
        tracker.finish()
        client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
        assert client.get_run(tracker.run_id).data.metrics == {"loss": 0.5}
        assert client.get_experiment("0").artifact_location == str(folder / "mlruns" / "0")
    with sqlite3.connect(template) as db:  # the template holds no run
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)
    assert seed_store(tmp_path / "a" / "mlflow.db") is False  # an existing store is left alone

    (tmp_path / "blocked").write_text("")  # no cache can be made below a file
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert seed_store(tmp_path / "c" / "mlflow.db") is False and not (tmp_path / "c" / "mlflow.db").exists()
    third = Tracker(tmp_path / "c", "exp", "run-c")  # MLflow builds this one
    third.finish()
    assert MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/c/mlflow.db").get_run(third.run_id).info.status == "FINISHED"
