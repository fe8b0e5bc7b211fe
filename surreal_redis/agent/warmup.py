"""An off-policy agent's random warm-up (``off_policy.random_steps``): uniform random actions for
its first env steps, as stable-baselines3 and CleanRL act for their ``learning_starts`` steps, so
that the first updates learn from a replay spread over the whole action space rather than around
the initial policy's actions.

The agents share the run's warm-up: each acts at random for its first
``ceil(random_steps / agent.num_agents)`` env steps, counted over its envs in whole vector steps.
None does once it holds parameters from a learner that has updated (their ``iteration`` above
0): an agent restarted in a running run, or any agent of a learner resumed from a checkpoint,
acts with the policy from its first step. Only agents call it: evals never act at random.

The actions are drawn from the agent's own warm-up stream (:func:`~surreal_redis.seeds.agent_warmup_seed`)
and sent as the behaviour actions; they carry no extras, which an off-policy update of the
built-in algorithms does not read (an algorithm whose chunks need extras gets no warm-up).
"""

from __future__ import annotations

import logging
import math
from typing import cast

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActionOutput
from surreal_redis.config import ExperimentConfig
from surreal_redis.seeds import agent_warmup_seed

log = logging.getLogger(__name__)


def _uniform_space(space: gym.Space) -> bool:
    """Whether :class:`RandomWarmup` can draw from ``space``: a float Box with finite bounds, or Discrete."""
    if isinstance(space, gym.spaces.Discrete):
        return True
    return (isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)
            and bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))))


class RandomWarmup:
    """Uniform random actions for ``num_envs`` envs (one vector step a call) while ``left`` env
    steps remain; ``left`` 0: off (the agent acts with its policy)."""

    def __init__(self, action_space: gym.Space, num_envs: int, steps: int, seed: int | None,
                 name: str = "agent") -> None:
        if steps < 0 or num_envs < 1:
            raise ValueError(f"need steps >= 0 and num_envs >= 1, got {steps} and {num_envs}")
        if steps and not _uniform_space(action_space):
            raise ValueError(f"random warm-up needs a float Box with finite bounds or a Discrete action space, "
                             f"got {action_space}")
        self.space, self.num_envs, self.left, self.name = action_space, num_envs, steps, name
        self.rng = np.random.default_rng(seed)

    def act(self) -> ActionOutput:
        """Actions ``[num_envs, ...]`` uniform over the action space (the space's dtype), no extras."""
        self.left = max(0, self.left - self.num_envs)
        space = self.space
        actions: np.ndarray
        if isinstance(space, gym.spaces.Discrete):
            start = int(space.start)
            actions = self.rng.integers(start, start + int(space.n), size=self.num_envs)
        else:  # a float Box with finite bounds (checked at start): float32 rounding stays within them
            box = cast(gym.spaces.Box, space)
            actions = self.rng.uniform(box.low, box.high, size=(self.num_envs, *box.shape))
        return ActionOutput(actions.astype(space.dtype), {})

    def loaded(self, iteration: int) -> None:
        """The agent loaded parameters of learner update ``iteration``: past 0, the warm-up is over."""
        if iteration > 0 and self.left:
            log.info("%s: random warm-up over with %d env steps left (parameters of update %d)", self.name,
                     self.left, iteration)
            self.left = 0


def agent_warmup(config: ExperimentConfig, agent_id: int, action_space: gym.Space, num_envs: int) -> RandomWarmup:
    """Agent ``agent_id``'s warm-up: its share of ``off_policy.random_steps`` for an off-policy
    algorithm, none (``left`` 0) for an on-policy one, or for an off-policy one whose chunks carry
    extras or whose action space has no uniform distribution (a warning says so)."""
    spec = config.algorithm
    steps = 0 if spec.on_policy else math.ceil(config.off_policy.warmup_steps / max(1, config.agent.num_agents))
    if steps:
        needs = spec.chunk_needs(config.algo_config, action_space)
        reason = ("its chunks carry extras" if needs.extras or needs.initial_state is not None
                  else None if _uniform_space(action_space) else f"action space {action_space}")
        if reason is not None:
            log.warning("agent %d: no random warm-up (off_policy.random_steps) for algo %s: %s", agent_id,
                        spec.name, reason)
            steps = 0
    if steps:
        log.info("agent %d: uniform random actions for its first %d env steps (off_policy.random_steps)",
                 agent_id, steps)
    return RandomWarmup(action_space, num_envs, steps, agent_warmup_seed(config.experiment.seed, agent_id),
                        f"agent {agent_id}")
