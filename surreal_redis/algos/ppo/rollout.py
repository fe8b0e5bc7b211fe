"""PPO's training data between the rollout pass and the gradient steps: the targets an update
trains towards, the rollout of B sequences, and its selection and merging along B."""

from __future__ import annotations

from typing import NamedTuple

import torch

from surreal_redis.algos.ppo.policy import LSTMState
from surreal_redis.codec import Tree
from surreal_redis.trees import tree_map


class Targets(NamedTuple):
    """What an update trains towards, time-major ``[T, B]``: the policy-gradient ``advantages``,
    the value targets ``returns``, and per-step ``diagnostics`` by name (``[T, B]`` each, e.g. a
    0/1 flag) whose means over the update's steps join its stats (PPO: none)."""

    advantages: torch.Tensor
    returns: torch.Tensor
    diagnostics: dict[str, torch.Tensor]
    proximal_logp: torch.Tensor | None = None
    """The log-probs the clipped surrogate's ratio is taken against; None: the agents' behaviour
    log-probs (PPO). APPO: the learner's own at the start of the update, the advantages carrying
    the importance weight of the lag."""


class _Rollout(NamedTuple):
    """Training data of B equal-length sequences, time-major ``[T, B, ...]`` (without an LSTM, N
    sequences of length 1: ``[1, N, ...]``)."""

    obs: Tree
    actions: torch.Tensor
    logp: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    ref_head: torch.Tensor  # policy head of the network at the update's start, [T, B, A] ([T, B, 0]: unread)
    episode_start: torch.Tensor
    diagnostics: dict[str, torch.Tensor]  # Targets.diagnostics, [T, B] each
    initial_state: LSTMState | None  # [B, H] each

    def select(self, idx: torch.Tensor) -> _Rollout:
        """The sequences ``idx`` (along B)."""
        state = None if self.initial_state is None else (self.initial_state[0][idx], self.initial_state[1][idx])
        fields = [tree_map(lambda v: v[:, idx], field) for field in self[:-1]]
        return _Rollout._make([*fields, state])


def _flatten_time(tree: Tree) -> Tree:
    """Leaves ``[T, B, ...]`` -> ``[T*B, ...]``."""
    return tree_map(lambda v: v.reshape(-1, *v.shape[2:]), tree)


def _merge_steps(rollouts: list[_Rollout]) -> _Rollout:
    """All steps of feed-forward rollouts as one ``[1, N]`` batch (views when there is one)."""
    def cat(*leaves: torch.Tensor) -> torch.Tensor:
        flat = [leaf.reshape(1, leaf.shape[0] * leaf.shape[1], *leaf.shape[2:]) for leaf in leaves]
        return flat[0] if len(flat) == 1 else torch.cat(flat, dim=1)
    fields = [tree_map(cat, *(r[i] for r in rollouts)) for i in range(len(_Rollout._fields) - 1)]
    return _Rollout._make([*fields, None])  # initial_state: none, the rollouts are feed-forward
