"""MLflow tracking for a run. Only the learner (and launcher) write to MLflow; agents and eval
report through Redis.

The default store is a SQLite file inside the experiment folder (``<dir>/mlflow.db``, artifacts
under ``<dir>/mlartifacts``), so ``mlflow ui --backend-store-uri sqlite:///<dir>/mlflow.db``
opens it; ``MLFLOW_TRACKING_URI`` overrides it.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

_MAX_PARAM_CHARS = 6000
_BATCH = 100  # MLflow accepts at most 100 params / 1000 metrics per log_batch


def default_tracking_uri(experiment_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(experiment_dir).resolve()}/mlflow.db"


class Tracker:
    """One MLflow run: params once, metrics on the learner-step axis, artifacts.

    The run's id is kept in ``<experiment_dir>/mlflow_run_id``; a tracker opened on a folder that
    has one continues that run (a learner restarted before its first checkpoint, or resumed: the
    folder holds one run only, the launcher moves earlier ones aside). Calls block on the tracking
    store (a local SQLite write takes a few ms).
    """

    def __init__(self, experiment_dir: Path, experiment_name: str, run_name: str,
                 tracking_uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient  # heavy import, only in the processes that track

        self.experiment_dir = Path(experiment_dir)
        self.tracking_uri = tracking_uri or default_tracking_uri(self.experiment_dir)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is None:
            artifacts = (self.experiment_dir / "mlartifacts").resolve().as_uri()
            experiment_id = self.client.create_experiment(experiment_name, artifact_location=artifacts)
        else:
            experiment_id = experiment.experiment_id
        id_file = self.experiment_dir / "mlflow_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        if run_id and self._continue(run_id):
            log.info("continuing MLflow run %s", run_id)
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id)
        self.run_id = run_id
        self.experiment_id = experiment_id

    def _continue(self, run_id: str) -> bool:
        """Mark ``run_id`` running again; False (logged) when the store does not have it."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_run(run_id, status="RUNNING")
        except MlflowException as exc:
            log.warning("MLflow run %s of %s not found in %s (%s); starting a new one", run_id,
                        self.experiment_dir / "mlflow_run_id", self.tracking_uri, exc)
            return False
        return True

    def log_params(self, params: Mapping[str, object]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:_MAX_PARAM_CHARS]) for k, v in sorted(params.items())]
        existing = self.client.get_run(self.run_id).data.params
        items = [p for p in items if p.key not in existing]  # params are immutable once logged
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

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED, FAILED or KILLED."""
        self.client.set_terminated(self.run_id, status=status)


class TrackingError(RuntimeError):
    """An MLflow call made by a :class:`BackgroundTracker`'s thread failed (the cause is chained)."""


class BackgroundTracker:
    """A :class:`Tracker` opened and written by a thread of its own, so that MLflow's import and
    store set-up (seconds on 2 cores: the learner trained nothing meanwhile) and each write stay
    off the caller's thread.

    ``open_tracker`` builds the Tracker in that thread. The ``log_*`` calls return at once and run
    in call order; :meth:`finish` blocks until every call before it and the finish itself are
    written (the launcher kills a learner that takes longer than its stop grace). An MLflow error is raised, as :class:`TrackingError`, by the next
    call made after it happened and by :meth:`finish`, as a Tracker would have raised it.
    """

    def __init__(self, open_tracker: Callable[[], Tracker]) -> None:
        self._calls: queue.Queue[Callable[[Tracker], None] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(open_tracker,), name="mlflow", daemon=True)
        self._thread.start()

    def _work(self, open_tracker: Callable[[], Tracker]) -> None:
        try:
            tracker = open_tracker()
            while (call := self._calls.get()) is not None:
                call(tracker)
        except BaseException as exc:  # kept and raised in the caller's thread by its next call
            self._error = exc

    def _submit(self, call: Callable[[Tracker], None]) -> None:
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

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._submit(lambda tracker: tracker.log_artifact(path, artifact_path))

    def finish(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED, FAILED or KILLED once everything before is written; blocks until
        then. TrackingError when a call failed."""
        self._submit(lambda tracker: tracker.finish(status))
        self._calls.put(None)
        self._thread.join()
        self._raise_error()
