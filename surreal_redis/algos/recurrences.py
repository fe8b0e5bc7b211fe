"""Vectorized numpy forms of the learner's step-by-step recursions over many env streams.

:class:`~surreal_redis.algos.normalizer.RewardScaler` runs, for every step of every chunk, the
discounted return ``G_t = decay_t * G_{t-1} + r_t`` and then a one-sample Welford update of the
return statistics. A Python loop over the steps of an 8192-step update costs ~15 ms; these do the
same work in a few whole-array passes (float64, equal to the loop up to rounding).
"""

from __future__ import annotations

import numpy as np

__all__ = ["linear_recurrence", "running_moments"]


def linear_recurrence(decay: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """``y`` with ``y[0] = inputs[0]`` and ``y[t] = decay[t] * y[t-1] + inputs[t]``, both ``[N]``
    float64 (``decay[t] = 0`` starts a new sequence at t). A Hillis-Steele scan: about log2(N)
    passes over the arrays, stopping once every sequence is covered (the decay products are 0)."""
    if decay.shape != inputs.shape or decay.ndim != 1:
        raise ValueError(f"linear_recurrence needs two [N] arrays, got {decay.shape} and {inputs.shape}")
    a = decay.astype(np.float64, copy=True)
    y = inputs.astype(np.float64, copy=True)
    shift = 1
    while shift < len(y) and np.any(a[shift:]):
        # compose each element with the one `shift` before it: (a2, y2) o (a1, y1) = (a2 a1, a2 y1 + y2)
        y[shift:] = y[shift:] + a[shift:] * y[:-shift]
        a[shift:] = a[shift:] * a[:-shift]
        shift *= 2
    return y


def running_moments(samples: np.ndarray, count: float, mean: float,
                    var: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts, means and population variances after each sample of ``samples`` ``[N]`` joins statistics
    that held ``count`` samples of ``mean`` and ``var``: entry k equals k+1 one-sample Welford
    steps from there. Cumulative sums of the deviations from ``mean`` (float64), so no
    cancellation beyond what the samples' own spread brings. Returns ``(counts, means, vars)``, ``[N]`` each."""
    deviation = samples.astype(np.float64) - mean
    counts = count + np.arange(1, len(samples) + 1, dtype=np.float64)
    sums = np.cumsum(deviation)
    # sum of squared deviations from the running mean: prior M2 + sum d^2 - n (mean_n - mean)^2
    m2 = var * count + np.cumsum(deviation * deviation) - sums * sums / counts
    return counts, mean + sums / counts, np.maximum(m2, 0.0) / counts
