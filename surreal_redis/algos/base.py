"""What every algorithm offers the processes: an agent-side policy and a learner-side trainer.

No torch here: an agent acting with numpy never loads it. Parameters travel from trainer to
policy as a flat ``dict[str, np.ndarray]`` (actor weights and observation-normalizer statistics,
never optimizer state).
"""

from __future__ import annotations

import abc
import enum
from typing import Any, NamedTuple

import numpy as np

from surreal_redis.chunks import SkippedSteps
from surreal_redis.codec import ParamDict, Tree


class ActMode(str, enum.Enum):
    TRAINING = "training"
    EVAL_DETERMINISTIC = "eval_deterministic"
    EVAL_STOCHASTIC = "eval_stochastic"


class ActionOutput(NamedTuple):
    """Actions for a batch of N envs (``[N, ...]``) and per-step extras sent with the experience
    (e.g. ``logp`` and ``value`` for PPO, each ``[N]``)."""

    actions: np.ndarray
    extras: dict[str, Tree]  # arrays; a recurrent policy's initial_state is a tree of them


class AgentPolicy(abc.ABC):
    """Agent-side policy: acts on a batch of observations (every leaf ``[N, ...]``, N envs) with the
    latest parameters; subclasses may override the hooks (e.g. per-agent exploration)."""

    version: int = -1
    """Parameter version currently loaded (-1 before the first load)."""

    @abc.abstractmethod
    def load_params(self, params: ParamDict, version: int) -> None:
        """Replace the actor weights (and normalizer statistics) with ``params``."""

    @abc.abstractmethod
    def act(self, obs: Tree, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        """Choose actions for N observations. Does not block on I/O."""

    def initial_state(self, num_envs: int) -> dict[str, np.ndarray]:
        """Recurrent state at an episode start (empty for feed-forward policies)."""
        return {}

    # hooks (no-ops by default)
    def before_act(self, obs: Tree, mode: ActMode) -> None:  # noqa: B027
        pass

    def after_act(self, obs: Tree, output: ActionOutput, mode: ActMode) -> None:  # noqa: B027
        pass

    def on_episode_start(self, env_index: int) -> None:  # noqa: B027
        pass

    def on_episode_end(self, env_index: int, episode_return: float, length: int) -> None:  # noqa: B027
        pass


class Trainer(abc.ABC):
    """Learner-side trainer. ``update`` consumes data and returns scalar stats for logging: a bare
    name (``policy_loss``) is logged as ``losses/<name>``, a name with a group (``losses/q_values``,
    ``charts/alpha``) as it is.

    Its ``update`` is the one of the algorithm's regime, as the learner's feed calls it
    (:mod:`surreal_redis.replay.feeds`): on-policy ``update(chunks) -> stats``,
    off-policy ``update(batch) -> (stats, td_errors [B])``.
    """

    iteration: int = 0
    """Number of gradient updates done so far."""
    wire_dtype: str = "float32"
    """What the float32 parameters of :meth:`actor_params` travel to the agents as
    (``hub.publisher.dtype``, set by the learner): a trainer that compares its outputs with the
    agents' (APPO's ``rho_clipped_fraction``) takes the rounding into account."""

    def observe_inserted(self, obs: Tree) -> None:  # noqa: B027  (only a trainer with statistics cares)
        """Off-policy: the observations (leaves ``[B, ...]``) of B transitions just inserted into
        replay, each transition once, before any update samples them (refilled ones never come
        here). Running statistics of the data (DDPG's and SAC's z-filter) take them in; the
        default does nothing."""

    def schedule_done(self) -> str:
        """Why the next update would learn nothing, e.g. a learning rate annealed to 0 ("" while
        it would): the learner stops the run before it. Default: ""."""
        return ""

    def skipped(self, steps: list[SkippedSteps]) -> None:  # noqa: B027  (a trainer with per-stream state overrides it)
        """On-policy: the steps of chunks the feed dropped (:class:`~surreal_redis.chunks.SkippedSteps`:
        stream, rewards, episode ends), each where it falls in its env stream among the chunks
        :meth:`update` gets; a trainer that carries state along a stream (PPO's reward scaler)
        carries it through them. Default: nothing."""

    @abc.abstractmethod
    def actor_params(self) -> ParamDict:
        """What agents need: actor weights and normalizer statistics, as CPU numpy arrays."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (networks, optimizers, normalizer, counters)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
