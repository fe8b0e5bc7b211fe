"""The one declaration an algorithm makes: :class:`AlgorithmSpec` (docs/adding-an-algorithm.md).

Config loading, ``default-config``, the CLI, the chunk check, the agents' policy and the learner's
trainer and feed all read an algorithm from its spec; nothing else in the package names an
algorithm. A spec is torch-free: its functions import the torch modules only when they build
something, so an agent acting with numpy never loads torch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

from surreal_redis.algos.base import AgentPolicy, Trainer

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")

Backend = Literal["numpy", "torch"]


@dataclass(frozen=True)
class ChunkNeeds:
    """What every chunk must carry for the learner's update, beyond observations, actions,
    rewards and flags (see :class:`~surreal_redis.learner.chunk_check.ChunkCheck`)."""

    extras: tuple[str, ...] = ()
    """Per-step extras by name: ``logp`` and ``value`` are ``[T]``, ``raw_action``
    ``[T, *action_shape]``, any other name ``[T, ...]``."""
    initial_state: Mapping[str, tuple[int, ...]] | None = None
    """Recurrent state in ``extras["initial_state"]``: leaf name -> shape without the time axis;
    None when the policy has none."""


@dataclass(frozen=True)
class PolicyRequest:
    """What an agent, eval or rollout asks of an algorithm's policy builder."""

    num_envs: int
    """N, the env batch size of every ``act`` call."""
    agent_id: int = 0
    """This agent's place among the ``num_agents`` training agents (per-agent exploration)."""
    num_agents: int = 1
    seed: int | None = None
    """Seeds the policy's sampling and noise (None: fresh entropy)."""
    backend: Backend = "torch"
    """What the network runs on, already resolved (``numpy`` only when the spec's
    ``numpy_unsupported`` returned None for the section)."""


def no_chunk_needs(section: Any, action_space: gym.Space) -> ChunkNeeds:
    return ChunkNeeds()


def numpy_never(section: Any) -> str:
    return f"{type(section).__name__} (no numpy policy)"


def no_check(config: Any) -> None:
    return None


def section_as_is(config: Any) -> Any:
    return config.algo_config


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm, declared once."""

    name: str
    """The ``algo:`` value and the YAML key of its section (lower case, digits, ``_``)."""
    config_class: type[Any]
    """Its section, a frozen dataclass that imports no torch (``__post_init__`` checks it)."""
    on_policy: bool
    """Trains on chunks in order (FIFO feed, grants), else on replay samples."""
    make_trainer: Callable[[Any, gym.Space, gym.Space, int], Trainer]
    """``(section, obs_space, action_space, seed) -> Trainer`` (its ``update`` as :class:`Trainer`
    says), on CUDA when the section's device says so."""
    make_policy: Callable[[Any, gym.Space, gym.Space, PolicyRequest], AgentPolicy]
    """``(section, obs_space, action_space, PolicyRequest) -> AgentPolicy``."""
    chunk_needs: Callable[[Any, gym.Space], ChunkNeeds] = field(default=no_chunk_needs)
    """``(section, action_space) -> ChunkNeeds``: what the update reads from chunks."""
    numpy_unsupported: Callable[[Any], str | None] = field(default=numpy_never)
    """``section -> None`` when agents can act with numpy for this section, else a short reason
    (``agent.inference: auto`` then picks torch)."""
    check: Callable[[Any], None] = field(default=no_check)
    """``config -> None``: rules across the whole :class:`~surreal_redis.config.ExperimentConfig`
    (the algorithm's section against the learner's, the hub's...), run when the config is built;
    raises ValueError naming the keys. A section's rules about itself belong in its own
    ``__post_init__``."""
    for_run: Callable[[Any], Any] = field(default=section_as_is)
    """``config -> section``: the section the run's learner trains with, given the whole
    :class:`~surreal_redis.config.ExperimentConfig` (PPO: an annealing schedule derived from
    ``stop.max_env_steps``); called where the learner builds its trainer and where ``launch``
    starts the run, so it may log a one-line warning about the run (the console sees it). Default:
    the section as it is."""
    summary: str = ""
    """One line for ``default-config`` and the docs."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"algorithm name {self.name!r} must match {NAME_PATTERN.pattern}")
        if not (dataclasses.is_dataclass(self.config_class) and isinstance(self.config_class, type)
                and self.config_class.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            raise ValueError(f"algorithm {self.name!r}: config_class must be a frozen dataclass, "
                             f"got {self.config_class!r}")
        fields = {f.name for f in dataclasses.fields(self.config_class)}
        if not self.on_policy and "gamma" not in fields:
            raise ValueError(f"algorithm {self.name!r} is off-policy: {self.config_class.__name__} needs a "
                             "gamma field (the n-step returns' discount)")
        for name in ("make_trainer", "make_policy", "chunk_needs", "numpy_unsupported", "check", "for_run"):
            if not callable(getattr(self, name)):
                raise ValueError(f"algorithm {self.name!r}: {name} must be callable")
