"""The layout of one run's folder on disk (``experiment.root / experiment.name``), as
:mod:`surreal_redis.keys` is the layout of its keys in Redis: nothing else builds these paths.

```
<run>/
  config.yaml        the resolved experiment config the launch wrote for its children
  checkpoints/       ckpt-<iteration>.pt, latest/best-k bookkeeping (CheckpointManager)
  logs/<child>.log   one log per child process (learner, agent-K, eval, final-eval, tracking)
  mlflow.db          the MLflow store (SQLite), artifacts under mlartifacts/
  mlflow_run_id      the learner's MLflow run, for ``plot`` and a resumed run
  curves.png         the run's learning curves
  hub.json           while a launch lives: run name, Redis URL, pid (``status``/``stop`` find it)
  launch.lock        flock held by the live launch
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from surreal_redis.checkpoint import CheckpointConfig, CheckpointManager

CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
MLFLOW_STORE_FILE = "mlflow.db"
MLFLOW_ARTIFACTS_DIR = "mlartifacts"
MLFLOW_RUN_ID_FILE = "mlflow_run_id"
CURVES_FILE = "curves.png"
HUB_FILE = "hub.json"
LOCK_FILE = "launch.lock"


@dataclass(frozen=True)
class RunFolder:
    """Every path of one run's folder. Building one touches nothing on disk."""

    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def logs_dir(self) -> Path:
        return self.path / LOGS_DIR

    def log_file(self, child: str) -> Path:
        """``logs/<child>.log``: ``child`` is a process name such as ``learner`` or ``agent-3``."""
        return self.logs_dir / f"{child}.log"

    @property
    def mlflow_store(self) -> Path:
        return self.path / MLFLOW_STORE_FILE

    @property
    def mlflow_artifacts(self) -> Path:
        return self.path / MLFLOW_ARTIFACTS_DIR

    @property
    def mlflow_run_id_file(self) -> Path:
        return self.path / MLFLOW_RUN_ID_FILE

    @property
    def curves(self) -> Path:
        return self.path / CURVES_FILE

    @property
    def hub_file(self) -> Path:
        return self.path / HUB_FILE

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    def checkpoints(self, config: CheckpointConfig) -> CheckpointManager:
        """The run's checkpoint manager (``checkpoints/``), kept as ``config`` says."""
        return CheckpointManager(self.checkpoints_dir, config)
