"""What the learners of DDPG, SAC and CrossQ share: actor, critic (and a target critic, but for
CrossQ's), the z-filter, their optimizers, a sampled batch as tensors, their parameters and
checkpointed state."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import gymnasium as gym
import torch
from torch import nn

from surreal_redis.algos.base import ParamDict, Trainer
from surreal_redis.algos.networks import actor_params, adam, normalized_obs, resolve_device
from surreal_redis.algos.normalizer import ObservationNormalizer
from surreal_redis.chunks import TransitionBatch
from surreal_redis.codec import Tree


class ActorCriticSection(Protocol):
    """The settings of an algorithm's section that :class:`ActorCriticTrainer` reads."""

    @property
    def actor_lr(self) -> float: ...
    @property
    def critic_lr(self) -> float: ...
    @property
    def normalize_obs(self) -> bool: ...
    @property
    def obs_clip(self) -> float: ...
    @property
    def device(self) -> str: ...


class BatchTensors(NamedTuple):
    """A :class:`~surreal_redis.chunks.TransitionBatch` of B transitions on the learner's
    device: observation trees (leaves ``[B, ...]``) through the z-filter, float32 ``actions``
    ``[B, A]``, ``rewards``, ``discounts`` and importance ``weights`` ``[B]``."""

    obs: Tree
    next_obs: Tree
    actions: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor
    weights: torch.Tensor


class ActorCriticBase(Trainer):
    """An off-policy actor-critic learner's parts without a target critic (the ``update`` is the
    algorithm's own), from the freshly built ``actor`` and ``critic``; ``device`` overrides
    ``config.device`` (None: the config's), ``critic_weight_decay`` is Adam's L2 penalty on the
    critic (DDPG's ``critic_l2``).
    """

    def __init__(self, config: ActorCriticSection, obs_space: gym.Space, actor: nn.Module, critic: nn.Module,
                 device: str | torch.device | None = None, critic_weight_decay: float = 0.0) -> None:
        self.device = resolve_device(config.device if device is None else device)
        self.actor = actor.to(self.device)
        self.critic = critic.to(self.device)
        self.obs_normalizer = (ObservationNormalizer(obs_space, config.obs_clip).to(self.device)
                               if config.normalize_obs else None)
        self.actor_optimizer = adam(self.actor.parameters(), lr=config.actor_lr)
        self.critic_optimizer = adam(self.critic.parameters(), lr=config.critic_lr, weight_decay=critic_weight_decay)
        self.iteration = 0
        self._critic_params: list[torch.Tensor] = list(self.critic.parameters())

    @contextmanager
    def _critic_frozen(self) -> Iterator[None]:
        """The critic's parameters without gradients inside the block: an actor loss then
        backpropagates through the critic to the actions only and skips the critic's weight
        gradients, which nothing reads (the critic's next step starts from ``zero_grad``)."""
        for param in self._critic_params:
            param.requires_grad_(False)
        try:
            yield
        finally:
            for param in self._critic_params:
                param.requires_grad_(True)

    def observe_inserted(self, obs: Tree) -> None:
        """The z-filter takes in each inserted transition's observation once (OpenAI baselines'
        DDPG updates ``obs_rms`` in ``store_transition``): the statistics of the data, not of the
        sampled batches, which would weigh early data by how often the replay draws it."""
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(obs)  # numpy leaves, read only where the z-filter has statistics

    def _tensors(self, batch: TransitionBatch) -> BatchTensors:
        """``batch`` on the device, its observations through the z-filter (which only
        :meth:`observe_inserted` changes)."""

        def floats(values: Any) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.float32, device=self.device)

        return BatchTensors(normalized_obs(batch.obs, self.device, self.obs_normalizer),
                            normalized_obs(batch.next_obs, self.device, self.obs_normalizer),
                            floats(batch.actions), floats(batch.rewards), floats(batch.discounts),
                            floats(batch.weights))

    @staticmethod
    def _read_stats(stats: dict[str, torch.Tensor | float]) -> dict[str, float]:
        """An update's stats as floats: its scalar tensors read in one transfer (one host sync on a
        GPU instead of one per ``.item()``), the floats as they are."""
        names = [name for name, value in stats.items() if isinstance(value, torch.Tensor)]
        tensors = [stats[name].detach().reshape(()).float() for name in names]  # type: ignore[union-attr]
        read = dict(zip(names, torch.stack(tensors).tolist() if tensors else []))
        return {name: read[name] if name in read else float(value) for name, value in stats.items()}

    def actor_params(self) -> ParamDict:
        """The actor's weights (``actor.*``) and the z-filter's statistics (``obs_normalizer.*``)."""
        return actor_params(self.actor, self.obs_normalizer)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "iteration": self.iteration,
        }
        if self.obs_normalizer is not None:
            state["obs_normalizer"] = self.obs_normalizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.obs_normalizer is not None:
            self.obs_normalizer.load_state_dict(state["obs_normalizer"])
        self.iteration = int(state["iteration"])


class ActorCriticTrainer(ActorCriticBase):
    """:class:`ActorCriticBase` with a target critic ``critic_target``, a frozen copy of the critic
    the algorithm moves toward it (DDPG, SAC); it travels in the checkpoint."""

    def __init__(self, config: ActorCriticSection, obs_space: gym.Space, actor: nn.Module, critic: nn.Module,
                 device: str | torch.device | None = None, critic_weight_decay: float = 0.0) -> None:
        super().__init__(config, obs_space, actor, critic, device, critic_weight_decay)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), critic_target=self.critic_target.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critic_target.load_state_dict(state["critic_target"])
