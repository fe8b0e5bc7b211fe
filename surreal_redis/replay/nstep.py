"""N-step transitions for off-policy replay, built from the chunks each env stream sends.

For step t of an episode, with m = min(n, steps from t to the episode's last step, inclusive):

    R_t      = sum_{k<m} gamma^k r_{t+k}
    next_obs = obs_{t+m}, or the true final observation when the episode ended at step t+m-1
    discount = 0 if the episode terminated at step t+m-1, else gamma^m

so the critic target is ``R_t + discount * Q'(next_obs, mu'(next_obs))``: truncated episodes are
bootstrapped from their true final observation, terminated ones are not, the last n-1 steps of an
episode give shorter-horizon transitions instead of being dropped, and no transition reaches across
an episode boundary (SURREAL's sender, Fan et al. 2018, dropped tails and mixed episodes).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from surreal_redis.chunks import Chunk
from surreal_redis.trees import Tree, tree_leaves_with_paths, tree_map

logger = logging.getLogger(__name__)


class NStepBatch(NamedTuple):
    """B n-step transitions, in the argument order of ``replay.insert(*batch)``: ``obs``, ``next_obs``
    trees with leaves ``[B, ...]``; ``actions`` ``[B, ...]``; ``rewards`` float32 ``[B]`` (discounted
    sums); ``discounts`` float32 ``[B]`` (gamma**m, or 0 after a termination)."""

    obs: Tree
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: Tree
    discounts: np.ndarray

    @property
    def size(self) -> int:
        return int(self.rewards.shape[0])


class _Pending(NamedTuple):
    """The last k < n steps of a stream's unfinished episode, waiting for more rewards."""

    obs: Tree  # leaves [k+1, ...]: the k steps' observations, then the one that followed them
    actions: np.ndarray  # [k, ...]
    rewards: np.ndarray  # [k]


class NStepBuilder:
    """Turns the chunks of many env streams into n-step transitions.

    Chunks of one stream ``(agent_id, env_index)`` must be added in the order they were recorded.
    Steps whose n-step return needs rewards from the stream's next chunk are kept until it arrives.
    If that chunk does not continue the stream (its first observation differs from the last one
    seen, e.g. the agent restarted), the kept steps are emitted as truncated at the last observation
    seen, so nothing is lost and no two episodes are mixed. Not thread-safe: add from one thread.

    ``n``: steps summed before bootstrapping (1 = one-step TD); ``gamma``: the discount factor.
    """

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.n = n
        self.gamma = gamma
        self._pending: dict[tuple[int, int], _Pending] = {}

    def add(self, chunk: Chunk) -> NStepBatch | None:
        """Add the next chunk of its stream; return the transitions now complete (None if none)."""
        key = (chunk.agent_id, chunk.env_index)
        pending = self._pending.pop(key, None)
        batches = []
        if pending is not None and not _same_tree(tree_map(lambda x: x[-1], pending.obs),
                                                  tree_map(lambda x: x[0], chunk.obs)):
            logger.warning("stream (agent %d, env %d) does not continue its last chunk; emitting its "
                           "%d waiting steps as truncated", *key, pending.rewards.shape[0])
            batches.append(self._flush(pending))
            pending = None

        obs, actions, rewards = chunk.obs, chunk.actions, chunk.rewards
        terminated, truncated, final_obs = chunk.terminated, chunk.truncated, chunk.final_obs
        if pending is not None:
            k = pending.rewards.shape[0]
            obs = tree_map(lambda p, c: np.concatenate([p[:-1], c]), pending.obs, obs)
            actions = np.concatenate([pending.actions, actions])
            rewards = np.concatenate([pending.rewards, rewards])
            terminated = np.concatenate([np.zeros(k, bool), terminated])
            truncated = np.concatenate([np.zeros(k, bool), truncated])
            final_obs = {t + k: value for t, value in final_obs.items()}

        batch, first_pending = self._transitions(obs, actions, rewards, terminated, truncated, final_obs)
        if first_pending < rewards.shape[0]:
            rest = (tree_map(lambda x: x[first_pending:].copy(), field) for field in (obs, actions, rewards))
            self._pending[key] = _Pending(*rest)
        if batch is not None:
            batches.append(batch)
        return _concat(batches) if batches else None

    def _flush(self, pending: _Pending) -> NStepBatch:  # bootstraps from the obs after the last step
        k = pending.rewards.shape[0]
        truncated = np.zeros(k, bool)
        truncated[-1] = True
        batch, _ = self._transitions(pending.obs, pending.actions, pending.rewards,
                                     np.zeros(k, bool), truncated, {})
        assert batch is not None
        return batch

    def _transitions(self, obs: Tree, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
                     truncated: np.ndarray, final_obs: dict[int, Tree]) -> tuple[NStepBatch | None, int]:
        """The complete n-step transitions of L consecutive steps (``obs`` leaves ``[L+1, ...]``), and
        the index of the first step that must wait for more (L if none must)."""
        last_steps, first_pending = self._last_steps(terminated | truncated)
        if not first_pending:
            return None, first_pending
        returns, discounts = self._returns(rewards, terminated, last_steps)

        # obs[last + 1] is the next episode's reset observation where an episode ended at `last`:
        # those rows take the true final observation instead
        rows_ended = np.flatnonzero(np.isin(last_steps, list(final_obs))).tolist() if final_obs else []

        def gather_next(x: np.ndarray, *finals: np.ndarray) -> np.ndarray:
            out = x[last_steps + 1]
            for row, final in zip(rows_ended, finals):
                out[row] = final
            return out

        next_obs = tree_map(gather_next, obs, *(final_obs[last_steps[row]] for row in rows_ended))
        batch = NStepBatch(
            obs=tree_map(lambda x: x[:first_pending], obs),
            actions=actions[:first_pending],
            rewards=returns.astype(np.float32),
            next_obs=next_obs,
            discounts=discounts.astype(np.float32),
        )
        return batch, first_pending

    def _last_steps(self, ends: np.ndarray) -> tuple[np.ndarray, int]:
        """Per step t of L (``ends`` bool ``[L]``: the episode ends at that step), the last step its
        n-step transition sums: the first end in [t, t + n), else t + n - 1; and the first step that
        must wait for more (L if none must: a step waits when its window runs past L with no end).
        Returns (int64 ``[first_pending]``, first_pending)."""
        num_steps = ends.shape[0]
        steps = np.arange(num_steps)
        # the first end at or after each step (L where none follows)
        next_end = np.minimum.accumulate(np.where(ends, steps, num_steps)[::-1])[::-1]
        last = np.minimum(next_end, steps + self.n - 1)
        waiting = np.flatnonzero(last >= num_steps)
        first_pending = int(waiting[0]) if len(waiting) else num_steps
        return last[:first_pending], first_pending

    def _returns(self, rewards: np.ndarray, terminated: np.ndarray, last_steps: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """float64 ``[T]`` discounted sums of rewards t..last_steps[t], and the discounts to their
        bootstrap (0 where the episode terminated at the last step). Summed in step order, one
        step of every window at a time, as a per-transition loop would: the same float64 values."""
        count = last_steps.shape[0]
        starts = np.arange(count)
        powers = [self.gamma ** k for k in range(self.n + 1)]  # Python floats, as the scalar loop's
        values = np.asarray(rewards, np.float64)
        returns = np.zeros(count)
        for k in range(self.n):
            taking = starts + k <= last_steps
            if not taking.any():
                break
            returns[taking] += powers[k] * values[starts[taking] + k]
        discounts = np.asarray(powers)[last_steps - starts + 1]
        discounts[np.asarray(terminated, bool)[last_steps]] = 0.0
        return returns, discounts


def _concat(batches: list[NStepBatch]) -> NStepBatch:
    if len(batches) == 1:
        return batches[0]
    return NStepBatch(*(tree_map(lambda *xs: np.concatenate(xs), *fields) for fields in zip(*batches)))


def _same_tree(a: Tree, b: Tree) -> bool:
    """Exact equality of two observation trees (bytes, so NaN equals NaN)."""
    flat_a, flat_b = dict(tree_leaves_with_paths(a)), dict(tree_leaves_with_paths(b))
    if flat_a.keys() != flat_b.keys():
        return False
    pairs = [(np.asarray(flat_a[key]), np.asarray(flat_b[key])) for key in flat_a]
    return all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in pairs)
