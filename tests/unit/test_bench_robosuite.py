"""bench/robosuite_lift.py's bookkeeping, in the dev venv (its launches need .venv-robosuite):
the progress it reads back from a run's MLflow store and the spread over seeds."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench(request):
    sys.path.insert(0, str(BENCH))
    request.addfinalizer(lambda: sys.path.remove(str(BENCH)))
    return importlib.import_module("robosuite_lift")


def test_progress_is_the_last_flush_of_the_store(bench, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.create_run(client.create_experiment("e"))
    for step, steps in ((1, 400.0), (2, 800.0), (3, 1200.0)):
        client.log_metric(run.info.run_id, "charts/env_steps", steps, step=step)
    (tmp_path / "mlflow_run_id").write_text(run.info.run_id)
    assert bench.last_progress(tmp_path) == (1200, 3)


def test_a_store_without_env_steps_is_an_error_naming_the_run(bench, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.create_run(client.create_experiment("e"))
    (tmp_path / "mlflow_run_id").write_text(run.info.run_id)
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        bench.last_progress(tmp_path)


def test_spread_over_seeds(bench):
    assert bench.spread([1.0, 2.0, 3.0]) == {"mean": 2.0, "std": 0.82, "min": 1.0, "max": 3.0}
    assert bench.spread([5.0])["std"] == 0.0
