"""The phases of a PPO-family learner update, timed from outside the trainer for
``bench/learner_step.py --phases``: how much of an update its gradient steps are."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from surreal_redis.algos.ppo.trainer import PPOTrainer
from surreal_redis.chunks import Chunk


def synchronize(device: torch.device) -> None:
    """Waits for ``device``'s queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PHASES = ("reward_scale", "decode", "no_grad_pass", "targets", "gradient", "z_filter")
"""The parts of a PPO-family update that :class:`PhaseClock` times; the rest of it is ``other``."""


class PhaseClock:
    """Seconds in each of :data:`PHASES` of a PPO-family trainer's updates while installed (``with``):
    its methods wrapped on the instance only (the class, and so its behaviour, unchanged; CUDA
    work synchronized around each phase). ``reward_scale``: the reward scaler's ``scale_chunks``;
    ``decode``: ``_rollout`` up to its first network pass (chunks stacked into tensors);
    ``no_grad_pass``: the rest of ``_rollout`` (values, the chunk-end and final-observation
    bootstraps, APPO's log-probs) less ``targets``: ``_targets`` (GAE, V-trace); ``gradient``:
    ``_minibatch_step`` (minibatch forward, backward, clipping, optimizer step); ``z_filter``:
    ``_update_obs_normalizer``."""

    def __init__(self, algo: PPOTrainer) -> None:
        self.algo = algo
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._pass_started: float | None = None
        self._installed: list[tuple[object, str]] = []

    def now(self) -> float:
        synchronize(self.algo.device)
        return time.perf_counter()

    def _timed(self, phase: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = self.now()
            out = call(*args, **kwargs)
            self.seconds[phase] += self.now() - started
            return out
        return timed

    def _rollout(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, self._pass_started = self.now(), None
            out = call(*args, **kwargs)
            ended = self.now()
            passed = ended if self._pass_started is None else self._pass_started
            self.seconds["decode"] += passed - started
            self.seconds["no_grad_pass"] += ended - passed  # targets included: taken out in shares()
            return out
        return timed

    def _features(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def marked(*args: Any, **kwargs: Any) -> Any:
            if self._pass_started is None:
                self._pass_started = self.now()
            return call(*args, **kwargs)
        return marked

    def __enter__(self) -> PhaseClock:
        algo = self.algo
        wraps: list[tuple[object, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
            (algo, "_rollout", self._rollout), (algo, "_features_no_grad", self._features),
            (algo, "_targets", functools.partial(self._timed, "targets")),
            (algo, "_minibatch_step", functools.partial(self._timed, "gradient")),
            (algo, "_update_obs_normalizer", functools.partial(self._timed, "z_filter"))]
        if algo.reward_scaler is not None:
            wraps.append((algo.reward_scaler, "scale_chunks", functools.partial(self._timed, "reward_scale")))
        for owner, name, wrap in wraps:
            setattr(owner, name, wrap(getattr(owner, name)))
            self._installed.append((owner, name))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name in self._installed:
            delattr(owner, name)  # the class's method again
        self._installed.clear()

    def shares(self, total_s: float) -> dict[str, Any]:
        """Milliseconds per phase (and ``other``) over ``total_s`` of the updates timed, their
        shares, ``non_gradient_share`` (all but ``gradient``) and ``no_grad_pass_share``."""
        seconds = dict(self.seconds, no_grad_pass=self.seconds["no_grad_pass"] - self.seconds["targets"])
        seconds["other"] = max(0.0, total_s - sum(seconds.values()))
        return {"phase_s": {phase: round(s, 5) for phase, s in seconds.items()},
                "phase_share": {phase: round(s / total_s, 4) for phase, s in seconds.items()},
                "non_gradient_share": round(1 - seconds["gradient"] / total_s, 4),
                "no_grad_pass_share": round(seconds["no_grad_pass"] / total_s, 4)}


def time_phases(algo: PPOTrainer, chunks: list[Chunk], repeats: int) -> dict[str, Any]:
    """:meth:`PhaseClock.shares` of ``repeats`` more updates on ``chunks`` (after the plain timing,
    which runs without the clock); ``phase_s`` per update."""
    clock = PhaseClock(algo)
    with clock:
        started = clock.now()
        for _ in range(repeats):
            algo.update(chunks)
        total = clock.now() - started
    out = clock.shares(total)
    out["phase_s"] = {phase: round(s / repeats, 5) for phase, s in out["phase_s"].items()}
    return out
