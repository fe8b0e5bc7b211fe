"""The unit of experience that crosses from agents, through the hub, into replay."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from surreal_redis.codec import Tree
from surreal_redis.trees import tree_map

INITIAL_STATE = "initial_state"  # the extras key of a recurrent policy's state at a chunk's start


class Chunk(NamedTuple):
    """T consecutive steps of one environment (T = ``sender.flush_steps``, the last chunk of a run
    may be shorter).

    Shapes (T steps; ``...`` is the leaf's own shape):

    - ``obs``: tree whose leaves are ``[T+1, ...]``. ``obs[t]`` is what the policy saw before
      action t; ``obs[t+1]`` is what it saw next, i.e. the reset observation of a new episode
      when the episode ended at step t.
    - ``actions``: ``[T, ...]``; ``rewards``: float32 ``[T]``; ``terminated``, ``truncated``:
      bool ``[T]`` (kept apart: truncated episodes are bootstrapped).
    - ``final_obs``: step index t -> true last observation of the episode that ended at step t
      (present for every t where ``terminated[t] or truncated[t]``); leaves have no time axis.
    - ``policy_version``: int64 ``[T]``, the parameter version that chose each action.
    - ``extras``: algorithm data, each ``[T, ...]`` (e.g. ``logp``, ``value``), plus optional
      ``"initial_state"`` entries (RNN state at the chunk start, no time axis).

    Chunks from :class:`~surreal_redis.hub.experience.receiver.ExperienceReceiver` may hold read-only
    arrays: observation leaves stored by digest (frames) are views of one shared table, so the
    same frame costs its memory once. Copy before writing into them.
    """

    agent_id: int
    env_index: int
    obs: Tree
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, Tree]
    policy_version: np.ndarray
    extras: dict[str, Any]

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    def next_obs(self, t: int) -> Tree:
        """The observation that followed action t (the true final one if the episode ended)."""
        if t in self.final_obs:
            return self.final_obs[t]
        return tree_map(lambda leaf: leaf[t + 1], self.obs)


class SkippedSteps(NamedTuple):
    """What a chunk dropped by the on-policy feed leaves of its env stream: its ``rewards`` ``[T]``
    and ``ends`` ``[T]`` (bool: terminated or truncated at that step), for a trainer that carries
    state along each stream (:meth:`surreal_redis.algos.base.Trainer.skipped`)."""

    agent_id: int
    env_index: int
    rewards: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, chunk: Chunk) -> SkippedSteps:
        return cls(chunk.agent_id, chunk.env_index, np.asarray(chunk.rewards), chunk.terminated | chunk.truncated)


class TransitionBatch(NamedTuple):
    """A batch of (n-step) transitions sampled from an off-policy replay.

    Shapes (B = batch size): ``obs`` and ``next_obs`` trees with leaves ``[B, ...]``;
    ``actions`` ``[B, ...]``; ``rewards`` float32 ``[B]`` (discounted n-step sums);
    ``discounts`` float32 ``[B]`` = gamma**n_taken * (1 - terminated), i.e. 0 when the episode
    terminated inside the n steps and gamma**k when it was truncated or went on (bootstrap);
    ``weights`` float32 ``[B]`` importance weights (ones for uniform replay); ``indices`` int64
    ``[B]`` replay slots, for ``update_priorities``.
    """

    obs: Tree
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: Tree
    discounts: np.ndarray
    weights: np.ndarray
    indices: np.ndarray
