"""Capturing a learner's update with ``torch.compile``: on CUDA ``mode="reduce-overhead"`` (the
compiled graphs replayed as CUDA graphs, one launch instead of one per small kernel), elsewhere
inductor's default mode. ``torch._dynamo`` (~1 s of CPU to import) is imported only when a
capture is asked for.

A compiled function is compiled on its first call; :class:`Capture` runs that first call as a
warm-up without side effects the caller cannot undo (losses and gradients, before any optimizer
step), so an exception while compiling falls back to the eager update with one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

CompileSetting = bool | Literal["auto"]


def capture_wanted(setting: CompileSetting, device: torch.device) -> bool:
    """Whether an algorithm's ``compile`` setting captures its update on ``device``: true or false
    as set; ``auto`` on CUDA only (on one CPU thread the compiled SAC update measured no faster
    than the eager one, PPO's minibatch step 0.8x of it, each after 5-40 s of compiling at start:
    docs/benchmarks.md)."""
    if setting == "auto":
        return device.type == "cuda"
    if not isinstance(setting, bool):
        raise ValueError(f"compile must be true, false or 'auto', got {setting!r}")
    return setting


class Capture:
    """Compiled versions of a learner's pure step functions (tensors in, tensors out, no module
    state changed but autograd's), with the eager functions as the fallback.

    ``backend``: torch.compile's (``inductor``, the default, is the one that captures; tests use
    ``aot_eager`` to check the mechanism quickly, or a backend function)."""

    def __init__(self, functions: dict[str, Callable[..., Any]], device: torch.device,
                 backend: str | Callable[..., Any] = "inductor") -> None:
        self.device = device
        self.eager = dict(functions)
        options: dict[str, Any] = {"backend": backend}
        if backend == "inductor" and device.type == "cuda":
            options["mode"] = "reduce-overhead"
        self.compiled: dict[str, Callable[..., Any]] = {}
        self.active = True
        self.warmed = False
        try:
            self.compiled = {name: torch.compile(fn, **options) for name, fn in functions.items()}
        except Exception as error:  # noqa: BLE001 - an unknown backend or a broken install: eager
            self._fall_back(error)

    def _fall_back(self, error: Exception) -> None:
        self.active = False
        logger.warning("compiling the update failed, running it eagerly: %s: %s",
                       type(error).__name__, str(error).splitlines()[0] if str(error) else "")

    def __getitem__(self, name: str) -> Callable[..., Any]:
        """The compiled function ``name``, or the eager one after a fallback."""
        return self.compiled[name] if self.active else self.eager[name]

    def scalars(self, *values: float) -> tuple[Any, ...]:
        """``values`` as 0-d float32 tensors on the device while the capture is active (a Python
        float would be compiled in as a constant, and recompiled each time it moves), else as is."""
        if not self.active:
            return values
        return tuple(torch.tensor(value, dtype=torch.float32, device=self.device) for value in values)

    def step_begin(self) -> None:
        """Marks a new update (CUDA graphs may then reuse the previous update's output memory: read
        an update's outputs before the next one starts)."""
        if self.active and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()

    def warm_up(self, run: Callable[[], None], undo: Callable[[], None]) -> None:
        """Once: ``run()`` (which calls the compiled functions, compiling them), then ``undo()``
        (drops the gradients it made). An exception in ``run`` logs one warning and makes this
        capture eager for good."""
        if self.warmed or not self.active:
            return
        self.warmed = True
        try:
            run()
        except Exception as error:  # noqa: BLE001 - any compiler failure means: run eagerly
            self._fall_back(error)
        finally:
            undo()
