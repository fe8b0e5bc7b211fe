"""Checkpoints on disk: periodic (every N updates, at most one per ``min_interval_s``), the last
``keep_last`` kept, plus the best ``keep_best`` by eval score (a score queue); written atomically
(temporary file + rename). Restore the latest, the best, or a given iteration, from this or another
experiment folder.

Files are ``torch.save`` archives read back with ``weights_only=True`` (PyTorch's restricted
unpickler: tensors, numbers, strings and containers only), so a tampered file cannot run code.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")


@dataclass(frozen=True)
class CheckpointConfig:
    every_updates: int = 100
    min_interval_s: float = 30.0
    keep_last: int = 3
    keep_best: int = 2

    def __post_init__(self) -> None:
        if self.every_updates < 1:
            raise ValueError(f"every_updates must be >= 1, got {self.every_updates}")
        if self.keep_last < 1 or self.keep_best < 0:
            raise ValueError(f"need keep_last >= 1 and keep_best >= 0, got {self.keep_last}, {self.keep_best}")
        if self.min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {self.min_interval_s}")


class CheckpointError(RuntimeError):
    """No such checkpoint, or a file that is not a readable checkpoint (the message names it)."""


class CheckpointManager:
    """Writes and finds checkpoints in ``directory`` (``<experiment>/checkpoints``).

    ``best.json`` holds the score queue: ``[[score, iteration], ...]``, best first.
    """

    def __init__(self, directory: Path, config: CheckpointConfig) -> None:
        self.directory = Path(directory)
        self.config = config
        self._last_save: float | None = None

    # ---------------------------------------------------------------- writing
    def due(self, iteration: int) -> bool:
        """Whether a periodic checkpoint should be written at this update count."""
        if iteration <= 0 or iteration % self.config.every_updates:
            return False
        return self._last_save is None or time.monotonic() - self._last_save >= self.config.min_interval_s

    def save(self, state: dict[str, Any], iteration: int) -> Path:
        """Write ``state`` atomically (fsynced) as iteration ``iteration``; prune old periodic ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(iteration)
        tmp = path.with_suffix(".tmp")
        import torch  # here, not at the top: the launcher and the CLI use this module without torch

        torch.save(state, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        self._last_save = time.monotonic()
        log.info("checkpoint %s written", path)
        self._prune()
        return path

    def record_score(self, iteration: int, score: float) -> bool:
        """Enter an eval score for the checkpoint at ``iteration`` (it must exist); returns True
        when it joins the best-k queue (then the file is protected from pruning)."""
        if self.config.keep_best == 0 or not self.path_for(iteration).exists():
            return False
        queue = [entry for entry in self.best() if entry[1] != iteration]
        queue.append((float(score), int(iteration)))
        queue.sort(key=lambda entry: (-entry[0], -entry[1]))
        kept = queue[: self.config.keep_best]
        tmp = self.directory / "best.tmp"
        tmp.write_text(json.dumps([list(e) for e in kept]))
        os.replace(tmp, self.directory / "best.json")
        self._prune()
        return (float(score), int(iteration)) in kept

    # ---------------------------------------------------------------- reading
    def path_for(self, iteration: int) -> Path:
        return self.directory / f"ckpt-{int(iteration):010d}.pt"

    def iterations(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))

    def best(self) -> list[tuple[float, int]]:
        path = self.directory / "best.json"
        if not path.exists():
            return []
        try:
            return [(float(s), int(i)) for s, i in json.loads(path.read_text())]
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{path} is not a valid score queue: {exc}") from None

    def resolve(self, which: str | int = "latest") -> Path:
        """Path of ``"latest"``, ``"best"`` or a given iteration; CheckpointError if absent."""
        iterations = self.iterations()
        if which == "latest":
            if not iterations:
                raise CheckpointError(f"no checkpoint in {self.directory}")
            return self.path_for(iterations[-1])
        if which == "best":
            best = self.best()
            if not best:
                raise CheckpointError(f"no scored checkpoint in {self.directory}")
            return self.path_for(best[0][1])
        try:
            iteration = int(which)
        except ValueError:
            raise CheckpointError(f"checkpoint selector {which!r} must be latest, best or an iteration") from None
        if iteration not in iterations:
            raise CheckpointError(f"no checkpoint for iteration {iteration} in {self.directory} (have {iterations})")
        return self.path_for(iteration)

    @staticmethod
    def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
        """Read a checkpoint file with the restricted (weights-only) unpickler."""
        path = Path(path)
        if not path.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        import torch  # see save()

        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as exc:  # torch raises many types for corrupt/unsafe files
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint {path} does not hold a state dict")
        return state

    # ---------------------------------------------------------------- internals
    def _prune(self) -> None:
        iterations = self.iterations()
        keep = set(iterations[-self.config.keep_last :]) | {i for _, i in self.best()}
        for iteration in iterations:
            if iteration not in keep:
                self.path_for(iteration).unlink(missing_ok=True)
