"""The final eval on the run's curves: its score is the last point of ``curve/eval_return`` (and
``curve/final_eval_return``) in the learner's MLflow run, at the final checkpoint's env steps and
seconds, and ``curves.png`` is redrawn with it (:mod:`surreal_redis.plots`).

The learner's MLflow run is finished by then and its tracking process gone: a tracking process of
the launcher's own attaches to the run by the id the folder keeps (``mlflow_run_id``), leaving its
status as the learner left it. It starts with the final eval, so that MLflow's import and the
store (about 1.5 s of CPU) load while the eval plays; it logs to ``logs/final-eval.log``. Nothing
here fails the launch: a failure is logged and the summary goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from surreal_redis.config import ExperimentConfig
from surreal_redis.learner.curve import CurvePoint, point_records
from surreal_redis.plots import EVAL_CURVE, EVAL_CURVE_S, FINAL_EVAL
from surreal_redis.run_folder import RunFolder
from surreal_redis.tracking import BackgroundTracker, TrackerProcess, TrackingError

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 30.0  # the record and the redraw; past it the launch ends without waiting for them


class FinalCurve:
    """Adds one run's final eval to its MLflow run and ``curves.png``: :meth:`start` before the
    eval, :meth:`end` after it."""

    def __init__(self, config: ExperimentConfig, folder: RunFolder) -> None:
        self.config, self.folder = config, folder
        log_path = folder.log_file("final-eval")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 -- the child writes it until end()
        self._tracker = BackgroundTracker(partial(
            TrackerProcess, folder.path, config.run, config.run, config.tracking.tracking_uri, attach=True,
            stderr=self._log))

    @classmethod
    def start(cls, config: ExperimentConfig, folder: RunFolder) -> FinalCurve | None:
        """Start attaching to the run's MLflow run (returns at once); None when the run has none
        (tracking off, or no learner got as far as opening it)."""
        if not config.tracking.enabled or not folder.mlflow_run_id_file.is_file():
            return None
        return cls(config, folder)

    def end(self, score: float | None, status: Mapping[str, Any]) -> None:
        """Log ``score`` (None: the eval gave none, nothing logged) at the env steps and seconds of
        the learner's last report ``status`` (its final checkpoint's), redraw the curves (always:
        the learner leaves its final draw to this) and end the tracking process; blocks up to
        :data:`WRITE_TIMEOUT_S`."""
        try:
            if score is not None:
                point = CurvePoint(int(status["env_steps"]), float(status["elapsed_s"]), float(score))
                now_ms = int(time.time() * 1000)  # after every point the learner logged: the last eval
                self._tracker.log_points(point_records(point, EVAL_CURVE, EVAL_CURVE_S, now_ms)
                                         + [(FINAL_EVAL, point.value, point.env_steps, now_ms)])
            self._tracker.draw_curves(self.folder.curves)
            if not self._tracker.close(WRITE_TIMEOUT_S):
                log.warning("the final eval's MLflow record and curves were not written within %.0fs (see %s)",
                            WRITE_TIMEOUT_S, self.folder.log_file("final-eval"))
        except (TrackingError, KeyError, TypeError, ValueError) as exc:
            log.warning("the final eval is not in MLflow or curves.png (%s; see %s)", exc,
                        self.folder.log_file("final-eval"))
        finally:
            self._log.close()
