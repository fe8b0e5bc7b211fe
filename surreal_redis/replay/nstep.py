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
        num_steps = rewards.shape[0]
        ends = terminated | truncated
        last_steps, returns, discounts = [], [], []
        first_pending = num_steps
        for t in range(num_steps):
            ret, last = 0.0, None
            for j in range(t, min(t + self.n, num_steps)):
                ret += self.gamma ** (j - t) * float(rewards[j])
                if ends[j] or j == t + self.n - 1:
                    last = j
                    break
            if last is None:  # fewer than n steps seen and the episode goes on
                first_pending = t
                break
            last_steps.append(last)
            returns.append(ret)
            discounts.append(0.0 if terminated[last] else self.gamma ** (last - t + 1))
        if not last_steps:
            return None, first_pending

        # obs[last + 1] is the next episode's reset observation where an episode ended at `last`:
        # those rows take the true final observation instead
        rows_ended = [row for row, last in enumerate(last_steps) if last in final_obs]

        def gather_next(x: np.ndarray, *finals: np.ndarray) -> np.ndarray:
            out = x[np.asarray(last_steps) + 1]
            for row, final in zip(rows_ended, finals):
                out[row] = final
            return out

        next_obs = tree_map(gather_next, obs, *(final_obs[last_steps[row]] for row in rows_ended))
        batch = NStepBatch(
            obs=tree_map(lambda x: x[:first_pending], obs),
            actions=actions[:first_pending],
            rewards=np.asarray(returns, np.float32),
            next_obs=next_obs,
            discounts=np.asarray(discounts, np.float32),
        )
        return batch, first_pending


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
