"""MLflow tracking for a run, written by the learner (agents and eval report through Redis).
The default store is ``<dir>/mlflow.db`` in the experiment folder (docs: Usage);
``MLFLOW_TRACKING_URI`` overrides it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from surreal_redis.run_folder import RunFolder
from surreal_redis.runtime import die_with_parent

log = logging.getLogger(__name__)

_MAX_PARAM_CHARS = 6000
_BATCH = 100  # MLflow accepts at most 100 params / 1000 metrics per log_batch


def default_tracking_uri(experiment_dir: Path) -> str:
    """``MLFLOW_TRACKING_URI``, else the SQLite store in the run folder (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{_store(experiment_dir)}"


def _store(experiment_dir: Path) -> Path:
    return RunFolder(Path(experiment_dir).resolve()).mlflow_store


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/surreal-redis`` (default ``~/.cache/surreal-redis``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "surreal-redis"


def seed_store(store: Path) -> bool:
    """Start a new SQLite store at ``store`` as a copy of an empty one made once per MLflow version
    and kept in :func:`cache_dir`: MLflow builds a new store's schema by running its whole chain of
    database migrations, seconds of CPU, where the copy takes milliseconds. False (the store is
    left to MLflow, the reason logged) when ``store`` exists or the cache cannot be written."""
    import mlflow
    from mlflow.tracking import MlflowClient

    if store.exists():
        return False
    template = cache_dir() / f"mlflow-{mlflow.__version__}.db"
    try:
        if not template.exists():
            template.parent.mkdir(parents=True, exist_ok=True)
            building = template.with_name(f"{template.name}.{os.getpid()}.tmp")
            MlflowClient(tracking_uri=f"sqlite:///{building}").search_experiments()  # runs the migrations
            os.replace(building, template)  # whole: a launch beside this one copies it complete or not at all
            log.info("empty MLflow %s store made for later runs to copy: %s", mlflow.__version__, template)
        store.parent.mkdir(parents=True, exist_ok=True)
        copying = store.with_name(f"{store.name}.tmp")
        shutil.copyfile(template, copying)
        # MLflow's "Default" experiment keeps its artifacts under the folder the store was made
        # in, here the cache: point it into the run's folder, as a store made there would
        with contextlib.closing(sqlite3.connect(copying)) as db, db:
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                       (str(store.parent / "mlruns" / "0"),))
        os.replace(copying, store)
    except (OSError, sqlite3.Error) as exc:
        log.warning("MLflow store not copied from %s (%s); MLflow builds its own", template, exc)
        return False
    return True


class Tracker:
    """One MLflow run: params once, metrics on the learner-step axis, artifacts.

    The run's id is kept in ``<experiment_dir>/mlflow_run_id``; a tracker opened on a folder that
    has one continues that run (a restarted or resumed learner). With ``attach`` it only adds to
    the folder's run, whose status it leaves as the learner left it (the launcher's final eval);
    TrackingError when the folder or the store has none. Calls block on the tracking store.
    """

    def __init__(self, experiment_dir: Path, experiment_name: str, run_name: str,
                 tracking_uri: str | None = None, attach: bool = False) -> None:
        from mlflow.tracking import MlflowClient  # heavy import, only in the processes that track

        self.experiment_dir = Path(experiment_dir)
        folder = RunFolder(self.experiment_dir)
        self.tracking_uri = tracking_uri or default_tracking_uri(self.experiment_dir)
        if self.tracking_uri == f"sqlite:///{_store(self.experiment_dir)}":
            seed_store(_store(self.experiment_dir))
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self._curves: Any = None  # a plots.CurvesFile, made at the first draw_curves
        if attach:
            self.run_id = self._attach(folder)
            self.experiment_id = self.client.get_run(self.run_id).info.experiment_id
            return
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is None:
            artifacts = folder.mlflow_artifacts.resolve().as_uri()
            experiment_id = self.client.create_experiment(experiment_name, artifact_location=artifacts)
        else:
            experiment_id = experiment.experiment_id
        id_file = folder.mlflow_run_id_file
        run_id = id_file.read_text().strip() if id_file.exists() else None
        if run_id and self._continue(run_id):
            log.info("continuing MLflow run %s", run_id)
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id)
        self.run_id = run_id
        self.experiment_id = experiment_id

    def _attach(self, folder: RunFolder) -> str:
        """The id of the run ``folder`` names, checked to be in the store."""
        from mlflow.exceptions import MlflowException

        if not folder.mlflow_run_id_file.is_file():
            raise TrackingError(f"{folder.mlflow_run_id_file}: no MLflow run to add to")
        run_id = folder.mlflow_run_id_file.read_text().strip()
        try:
            self.client.get_run(run_id)
        except MlflowException as exc:
            raise TrackingError(f"MLflow run {run_id} of {folder.mlflow_run_id_file} is not in "
                                f"{self.tracking_uri} ({exc.message})") from None
        return run_id

    def _continue(self, run_id: str) -> bool:
        """Mark ``run_id`` running again; False (logged) when the store does not have it."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_run(run_id, status="RUNNING")
        except MlflowException as exc:
            log.warning("MLflow run %s of %s not found in %s (%s); starting a new one", run_id,
                        RunFolder(self.experiment_dir).mlflow_run_id_file, self.tracking_uri, exc)
            return False
        return True

    def log_params(self, params: Mapping[str, object]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params  # params are immutable once logged
        items = [Param(k, str(v)[:_MAX_PARAM_CHARS]) for k, v in sorted(params.items()) if k not in existing]
        for start in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + _BATCH])

    def log_metrics(self, metrics: Mapping[str, float | int | None], step: int) -> None:
        """Log finite numeric values; None and NaN/inf entries are left out."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, int(step)) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def log_points(self, records: Sequence[Sequence[Any]]) -> None:
        """Log ``(key, value, step, timestamp ms)`` records, each with its own step and timestamp
        (the learner's curve points, :mod:`surreal_redis.learner.curve`); non-finite values are
        left out."""
        from mlflow.entities import Metric

        items = [Metric(str(key), float(value), int(stamp), int(step)) for key, value, step, stamp in records
                 if value is not None and math.isfinite(float(value))]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def log_artifact(self, path: Path, artifact_path: str | None = None, missing_ok: bool = False) -> None:
        """Copy ``path`` into the run's artifacts. ``missing_ok``: a file gone by the time of the
        copy is skipped with a warning (a checkpoint pruned meanwhile: the final eval keeps the
        best ones, and a newer best may replace the one the learner's stop asked for)."""
        try:
            self.client.log_artifact(self.run_id, str(path), artifact_path)
        except FileNotFoundError:
            if not missing_ok or Path(path).exists():
                raise
            log.warning("%s was removed before MLflow copied it (pruned meanwhile); not logged", path)

    def draw_curves(self, path: Path) -> None:
        """Redraw the run's return curves from this store into ``path`` (:mod:`surreal_redis.plots`);
        a failure is logged, never raised."""
        from surreal_redis.plots import CurvesFile

        if self._curves is None:
            self._curves = CurvesFile(self.client, self.run_id, self.client.get_run(self.run_id).info.run_name)
        self._curves.redraw(Path(path))

    def finish(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED, FAILED or KILLED."""
        self.client.set_terminated(self.run_id, status=status)


class TrackingError(RuntimeError):
    """An MLflow call made by a :class:`BackgroundTracker`'s thread or in a
    :class:`TrackerProcess` failed (the cause is chained, or named in the message)."""


class TrackerProcess:
    """A :class:`Tracker` in a child process (``python -m surreal_redis.tracking``), with the same
    calls: each one blocks until the child has written it. MLflow's heavy import and store set-up
    (pandas, pyarrow, sqlalchemy, alembic) and every write then run outside the learner's process
    and its GIL.

    Calls and replies are JSON lines over the child's stdin and stdout; its log goes to this
    process's stderr. The child ignores Ctrl-C and SIGTERM (the caller finishes the run) and ends
    when its stdin closes, as when this process dies; a run not finished by then is marked KILLED.
    A failed call raises :class:`TrackingError` with the child's error; so does any call after
    the child died. ``attach``: :class:`Tracker`'s (the child also loads matplotlib while it
    waits for the first call, and never marks the run).
    """

    def __init__(self, experiment_dir: Path, experiment_name: str, run_name: str,
                 tracking_uri: str | None = None, attach: bool = False, stderr: BinaryIO | None = None) -> None:
        """``stderr``: where the child logs (None: this process's stderr)."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "surreal_redis.tracking", str(experiment_dir), experiment_name, run_name,
             tracking_uri or "", "attach" if attach else ""], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, preexec_fn=die_with_parent)
        self.run_id: str = self._reply()

    def _reply(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise TrackingError(f"the MLflow tracking process exited with code {self.process.wait()} "
                                "(its log is above)")
        reply = json.loads(line)
        if not reply["ok"]:
            raise TrackingError(f"MLflow tracking failed in its process: {reply['error']}")
        return reply["value"]

    def _call(self, method: str, *args: object) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps({"method": method, "args": args}).encode() + b"\n")
            self.process.stdin.flush()
        except OSError as exc:  # the child is gone: its exit code says more
            raise TrackingError(f"the MLflow tracking process exited with code {self.process.wait()}") from exc
        self._reply()

    def log_params(self, params: Mapping[str, object]) -> None:
        self._call("log_params", {key: str(value) for key, value in params.items()})

    def log_metrics(self, metrics: Mapping[str, float | int | None], step: int) -> None:
        self._call("log_metrics", {key: None if value is None else float(value) for key, value in metrics.items()},
                   int(step))

    def log_points(self, records: Sequence[Sequence[Any]]) -> None:
        self._call("log_points", [[str(k), float(v), int(step), int(stamp)] for k, v, step, stamp in records])

    def log_artifact(self, path: Path, artifact_path: str | None = None, missing_ok: bool = False) -> None:
        self._call("log_artifact", str(path), artifact_path, missing_ok)

    def draw_curves(self, path: Path) -> None:
        self._call("draw_curves", str(path))

    def finish(self, status: str = "FINISHED") -> None:
        """Mark the run, then close the child's stdin and wait for it to exit."""
        self._call("finish", status)
        self.close()

    def close(self) -> None:
        """Close the child's stdin and wait for it to exit (an attached one: the run unmarked)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        if self.process.wait() != 0:
            raise TrackingError(f"the MLflow tracking process exited with code {self.process.returncode}")


SERVED = ("log_params", "log_metrics", "log_points", "log_artifact", "draw_curves", "finish")


def serve(argv: list[str], requests: BinaryIO, replies: BinaryIO) -> int:
    """The child side of :class:`TrackerProcess`: open the Tracker ``argv`` names (experiment
    dir, experiment name, run name, tracking URI or '', 'attach' or ''), then run each request line
    ``{"method", "args"}`` (a method of :data:`SERVED`) from ``requests`` and answer
    ``{"ok": true, "value"}`` or ``{"ok": false, "error"}`` on ``replies``, until ``requests``
    ends. Returns the exit code (1 when the tracker could not open)."""

    def answer(ok: bool, value: object = None, error: str = "") -> None:
        replies.write(json.dumps({"ok": ok, "value": value, "error": error}).encode() + b"\n")
        replies.flush()

    experiment_dir, experiment_name, run_name, tracking_uri, *mode = argv
    attach = mode == ["attach"]
    try:
        tracker = Tracker(Path(experiment_dir), experiment_name, run_name, tracking_uri or None, attach=attach)
    except Exception as exc:  # reported to the learner, which raises it as a TrackingError
        log.exception("MLflow tracking could not open")
        answer(False, error=f"{type(exc).__name__}: {exc}")
        return 1
    finished = attach  # an attached run keeps the status its learner gave it
    # the first draw then costs its drawing only: the learner's stop (or a final eval) waits for it
    threading.Thread(target=_warm_up_drawing, name="matplotlib-warm-up", daemon=True).start()
    try:
        answer(True, tracker.run_id)
        for line in requests:
            try:
                request = json.loads(line)
                if request["method"] not in SERVED:
                    raise ValueError(f"no such tracking call {request['method']!r} (served: {', '.join(SERVED)})")
                getattr(tracker, request["method"])(*request["args"])
            except Exception as exc:
                log.exception("MLflow call failed: %.200s", line)
                answer(False, error=f"{type(exc).__name__}: {exc}")
            else:
                finished = finished or request["method"] == "finish"
                answer(True)
    except BrokenPipeError:  # the learner died while a reply was on its way
        log.warning("the learner stopped reading MLflow replies")
    if not finished:
        # The learner is gone without finishing its run (killed: a second Ctrl-C, SIGKILL, a crash);
        # left alone it would stay RUNNING forever. A learner restarted on the folder continues it.
        log.warning("the learner exited without closing MLflow run %s; marking it KILLED", tracker.run_id)
        tracker.finish("KILLED")
    return 0


def _warm_up_drawing() -> None:
    """``plots.warm_up`` (matplotlib loaded ahead of the first draw); a failure is logged."""
    try:
        from surreal_redis.plots import warm_up

        warm_up()
    except Exception as exc:  # the first draw says it again, or succeeds
        log.warning("matplotlib not loaded ahead (%s: %s)", type(exc).__name__, exc)


class BackgroundTracker:
    """A :class:`Tracker` (or :class:`TrackerProcess`) opened and written by a thread of its own,
    so that MLflow's store set-up and each write stay off the caller's thread.

    ``open_tracker`` builds the Tracker in that thread, at once, or with ``deferred`` at
    :meth:`open` (the learner's first update: MLflow's start-up, seconds of CPU, then takes none
    from the learner's). The ``log_*`` calls return at once and run in call order (queued until
    it opened); :meth:`finish` blocks until every call before it and the finish itself
    are written (the launcher kills a learner that takes longer than its stop grace). An MLflow
    error is raised, as :class:`TrackingError`, by the next call made after it happened and by
    :meth:`finish`, as a Tracker would have raised it.
    """

    def __init__(self, open_tracker: Callable[[], Tracker | TrackerProcess], deferred: bool = False) -> None:
        self._calls: queue.Queue[Callable[[Tracker | TrackerProcess], None] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._draws: dict[str, int] = {}  # path -> the number of the latest draw_curves call
        self._thread = threading.Thread(target=self._work, args=(open_tracker,), name="mlflow", daemon=True)
        if not deferred:
            self.open()

    def open(self) -> None:
        """Start opening the tracker (not blocking); nothing when it already started."""
        if self._thread.ident is None:
            self._thread.start()

    def _work(self, open_tracker: Callable[[], Tracker | TrackerProcess]) -> None:
        try:
            tracker = open_tracker()
            while (call := self._calls.get()) is not None:
                call(tracker)
        except BaseException as exc:  # kept and raised in the caller's thread by its next call
            self._error = exc

    def _submit(self, call: Callable[[Tracker | TrackerProcess], None]) -> None:
        self._raise_error()
        self._calls.put(call)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise TrackingError(f"MLflow tracking failed: {self._error!r}") from self._error

    def log_params(self, params: Mapping[str, object]) -> None:
        params = dict(params)
        self._submit(lambda tracker: tracker.log_params(params))

    def log_metrics(self, metrics: Mapping[str, float | int | None], step: int) -> None:
        metrics = dict(metrics)
        self._submit(lambda tracker: tracker.log_metrics(metrics, step))

    def log_points(self, records: Sequence[Sequence[Any]]) -> None:
        records = list(records)
        self._submit(lambda tracker: tracker.log_points(records))

    def log_artifact(self, path: Path, artifact_path: str | None = None, missing_ok: bool = False) -> None:
        self._submit(lambda tracker: tracker.log_artifact(path, artifact_path, missing_ok))

    def draw_curves(self, path: Path) -> None:
        """Queued like the other calls, but a draw still queued when a later one of the same
        ``path`` is made is skipped: a tracker behind the learner draws the latest state once,
        not every state it missed."""
        number = self._draws[str(path)] = self._draws.get(str(path), 0) + 1
        self._submit(lambda tracker: tracker.draw_curves(path) if self._draws[str(path)] == number else None)

    def finish(self, status: str = "FINISHED") -> None:
        """Blocks until every call before and the finish are written (see the class docstring)."""
        self._submit(lambda tracker: tracker.finish(status))
        self._calls.put(None)
        self.open()  # a learner that stopped before its first update still writes its run
        self._thread.join()
        self._raise_error()

    def close(self, timeout_s: float | None = None) -> bool:
        """Like :meth:`finish`, but the run is not marked (an attached tracker's end): blocks until
        every call before is written and a :class:`TrackerProcess` exited, at most ``timeout_s``
        seconds. False when they were not done by then (they go on in the daemon thread)."""
        self._submit(lambda tracker: tracker.close() if isinstance(tracker, TrackerProcess) else None)
        self._calls.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        self._raise_error()
        return True


if __name__ == "__main__":
    # the child of a TrackerProcess: the learner that started it finishes the run, then closes stdin
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s mlflow-tracker %(name)s: %(message)s")
    # replies get the pipe; whatever a library prints goes to stderr (the learner's log), never
    # into the reply stream
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    code = serve(sys.argv[1:], sys.stdin.buffer, replies)
    # every call was committed before its reply: skip the interpreter's slow teardown, which the
    # learner's stop would wait for
    logging.shutdown()
    os._exit(code)
