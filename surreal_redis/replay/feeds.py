"""The learner's two regimes behind one face: what happens to each chunk, when to read more, how to train.

- :class:`OnPolicyFeed` (PPO): chunks queue in a :class:`~surreal_redis.replay.fifo.FIFOReplay`;
  every ``steps_per_update`` env steps make one update; chunks too stale for the published
  parameters are dropped and counted.
- :class:`OffPolicyFeed` (DDPG, SAC): chunks become n-step transitions in a uniform or prioritized
  replay; updates are owed at the replay ratio (:class:`OffPolicyConfig`). Reading pauses while
  updates are owed, so the backlog builds up in Redis and agents wait on ``hub.sender.max_lag``.

The learner process and the in-process loops of :mod:`surreal_redis.testing` drive both the same way.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from surreal_redis.chunks import Chunk, SkippedSteps, TransitionBatch
from surreal_redis.replay import ReplayConfig, make_replay
from surreal_redis.replay.fifo import FIFOReplay, FIFOReplayConfig
from surreal_redis.replay.nstep import NStepBatch, NStepBuilder
from surreal_redis.replay.rate_limiter import RateLimiterConfig
from surreal_redis.trees import Tree


class StopSignal(Protocol):
    """``threading.Event`` and :class:`~surreal_redis.runtime.StopFlag` both fit."""

    def is_set(self) -> bool: ...


class OnPolicyTrainer(Protocol):
    def update(self, chunks: list[Chunk]) -> dict[str, float]:
        """One update on ``chunks``, returning its stats: its fixed number of epochs (PPO's and
        APPO's ``update_epochs``), however soon the next batch arrives."""
        ...

    def skipped(self, steps: list[SkippedSteps]) -> None:
        """The steps of chunks the feed dropped, each where it falls in its env stream among the
        chunks of the updates (:meth:`surreal_redis.algos.base.Trainer.skipped`)."""
        ...


class OffPolicyTrainer(Protocol):
    def update(self, batch: TransitionBatch) -> tuple[dict[str, float], np.ndarray]:
        """Returns the stats and the batch's TD errors ``[B]`` (new priorities)."""
        ...

    def observe_inserted(self, obs: Tree) -> None:
        """The observations (leaves ``[B, ...]``) of B transitions just inserted into replay, each
        transition once (its running statistics, e.g. the z-filter, take them in)."""
        ...


TrainerT = TypeVar("TrainerT", contravariant=True)


class ExperienceUse(NamedTuple):
    """Env steps an on-policy feed took in: ``used`` by an update, ``dropped`` (stale, or over
    capacity) or ``held`` for the next update."""

    used: int
    dropped: int
    held: int


class Feed(abc.ABC, Generic[TrainerT]):
    """What the learner does with experience, whatever the regime. Not thread-safe: one caller."""

    @abc.abstractmethod
    def ingest(self, chunk: Chunk) -> None:
        """Take one received chunk (the caller acks it afterwards: it is stored now)."""

    @abc.abstractmethod
    def wants_data(self) -> bool:
        """Whether the learner should read more experience before training again."""

    @abc.abstractmethod
    def train(self, algo: TrainerT, stop: StopSignal) -> Iterator[dict[str, float]]:
        """Run the updates the data in hand allows, yielding each update's stats (the caller may
        publish between them); ends early once ``stop`` is set. CPU/GPU-bound, no I/O."""

    def has_updates(self) -> bool:
        """Whether an update can run on the data in hand now: the learner then reads more without
        waiting for it. False here: a feed that says nothing is waited on as before."""
        return False

    def on_publish(self, version: int) -> None:  # noqa: B027  (only the on-policy feed cares)
        """The learner published parameter version ``version``."""

    def steps_needed(self, ahead: int = 0) -> int | None:
        """Env steps the next ``1 + ahead`` updates still need beyond those held (>= 0); None for a
        feed that takes whatever comes (off-policy: agents produce freely, nothing is granted)."""
        return None

    def use(self) -> ExperienceUse | None:
        """What became of the env steps taken in; None off-policy, where a replay samples each many times."""
        return None

    def refill(self, chunks: Iterable[Chunk]) -> int:
        """After a restart: store the hub's retained experience; returns the transitions stored. A
        feed with no use for old data never iterates ``chunks`` (a lazy reader never touches Redis)."""
        return 0

    @abc.abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters and sizes for the ``system/replay_*`` metrics."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps to resume the feed's random choices and counts (not its data)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027
        """Inverse of :meth:`state_dict`."""


class OnPolicyFeed(Feed[OnPolicyTrainer]):
    """One update per ``steps_per_update`` env steps, each chunk used by one update, in order.

    Sample reuse does not depend on arrival: each update runs the trainer's fixed number of
    epochs, so each sample takes part in that many gradient passes however fast the agents
    produce; an update starts as soon as one batch is held (it never waits for more data than it
    uses), and the agents' lead is bounded by backpressure (``hub.sender.max_lag``) and the FIFO's
    ``max_policy_lag``."""

    def __init__(self, fifo: FIFOReplayConfig, steps_per_update: int) -> None:
        if steps_per_update < 1:
            raise ValueError(f"steps_per_update must be >= 1, got {steps_per_update}")
        self.fifo = FIFOReplay(fifo)
        self.steps_per_update = steps_per_update

    def ingest(self, chunk: Chunk) -> None:
        self.fifo.insert(chunk)

    def wants_data(self) -> bool:
        return True

    def train(self, algo: OnPolicyTrainer, stop: StopSignal) -> Iterator[dict[str, float]]:
        # the steps of dropped chunks reach the trainer in stream order around the updates
        while len(self.fifo) >= self.steps_per_update and not stop.is_set():
            chunks = self.fifo.take(self.steps_per_update)
            before, after = self.fifo.skipped()
            if before:
                algo.skipped(before)
            yield algo.update(chunks)
            if after:
                algo.skipped(after)
        before, _ = self.fifo.skipped()  # dropped ahead of every chunk held: nothing follows them
        if before:
            algo.skipped(before)

    def on_publish(self, version: int) -> None:
        self.fifo.set_learner_version(version)  # chunks of older policies than allowed are dropped

    def steps_needed(self, ahead: int = 0) -> int:
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        return max(0, (1 + ahead) * self.steps_per_update - len(self.fifo))

    def use(self) -> ExperienceUse:
        stats = self.fifo.stats()
        return ExperienceUse(used=stats["taken_steps"], dropped=stats["dropped_stale_steps"] + stats["dropped_full_steps"],
                             held=len(self.fifo))

    def stats(self) -> dict[str, int]:
        return dict(self.fifo.stats(), size=len(self.fifo))


@dataclass(frozen=True)
class OffPolicyConfig:
    """What every off-policy algorithm shares (YAML ``off_policy``): the batch, the n-step returns,
    the replay and its selector, when updates start and how many each transition earns."""

    batch_size: int = 256
    """transitions per update."""
    n_step: int = 1
    """rewards summed before bootstrapping (see :mod:`surreal_redis.replay.nstep`)."""
    learning_starts: int = 1000
    """transitions in replay before the first update."""
    random_steps: int | None = None
    """env steps (all agents together) that agents act uniformly at random within the action
    bounds before acting with the policy, as SB3's and CleanRL's ``learning_starts`` warm-up; null
    means ``learning_starts``, 0 none. Each agent acts at random for its first
    ``ceil(random_steps / agent.num_agents)`` env steps (whole vector steps), and never once it
    holds parameters from a learner that has updated (a restarted agent, a resumed learner).
    Evals never act at random."""
    updates_per_step: float | None = None
    """updates owed per transition inserted once the replay can be sampled (the replay ratio);
    null means 1.0, or the rate limiter's ratio when ``rate_limiter.samples_per_insert`` is set
    (setting both is an error)."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """capacity, layout and selector of the replay."""
    rate_limiter: RateLimiterConfig = field(default_factory=RateLimiterConfig)
    """when sampling is allowed (Reverb's rules); with ``samples_per_insert`` it sets the replay
    ratio: ``samples_per_insert / batch_size`` updates per transition, counted from the first
    update: its ``min_size_to_sample`` is then raised to ``max(learning_starts, batch_size)``, so
    the transitions before that earn no backlog of updates."""
    max_train_s: float | None = 0.5
    """seconds one :meth:`OffPolicyFeed.train` call may run before handing back to reading; null
    runs every owed update."""
    pause_reading_at: int = 64
    """reading pauses while at least this many updates are owed."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.n_step < 1 or self.learning_starts < 0 or self.pause_reading_at < 1:
            raise ValueError(f"need batch_size >= 1, n_step >= 1, learning_starts >= 0 and pause_reading_at >= 1, "
                             f"got {self.batch_size}, {self.n_step}, {self.learning_starts}, {self.pause_reading_at}")
        if self.random_steps is not None and self.random_steps < 0:
            raise ValueError(f"random_steps must be >= 0 or null (null: learning_starts), got {self.random_steps}")
        if self.updates_per_step is not None and not self.updates_per_step > 0:
            raise ValueError(f"updates_per_step must be > 0 or null, got {self.updates_per_step}")
        if self.updates_per_step is not None and self.rate_limiter.samples_per_insert is not None:
            raise ValueError(f"updates_per_step ({self.updates_per_step}) and rate_limiter.samples_per_insert "
                             f"({self.rate_limiter.samples_per_insert}) both set the replay ratio: set one")
        if self.max_train_s is not None and self.max_train_s < 0:
            raise ValueError(f"max_train_s must be >= 0 or null, got {self.max_train_s}")

    @property
    def warmup_steps(self) -> int:
        """``random_steps``, or ``learning_starts`` where it is null."""
        return self.learning_starts if self.random_steps is None else self.random_steps

    @property
    def limiter_sets_ratio(self) -> bool:
        """Whether the rate limiter, not ``updates_per_step``, decides how many updates are owed."""
        return self.rate_limiter.samples_per_insert is not None


class OffPolicyFeed(Feed[OffPolicyTrainer]):
    """The off-policy feed: chunks -> n-step transitions -> replay -> sampled batches, at a set replay ratio.

    Only transitions ingested (not refilled) earn updates: with ``updates_per_step`` those after the
    last :meth:`train` call that found the replay too small; with the rate limiter those past its
    ``min_size_to_sample`` (at least ``learning_starts``). Refilled transitions were trained on
    before a restart: they fill the replay and count for neither, and the limiter's counts come
    back with :meth:`load_state_dict`. Each ingested transition's observation goes to the
    trainer once (``observe_inserted``, at the next :meth:`train` call). Sampling uses the feed's
    own generator (``seed``), which :meth:`state_dict` keeps with the limiter's counts.
    """

    def __init__(self, config: OffPolicyConfig, gamma: float, seed: int = 0) -> None:
        self.config = config
        self.replay = make_replay(config.replay)
        self.nstep = NStepBuilder(config.n_step, gamma)
        limits = config.rate_limiter
        if config.limiter_sets_ratio:  # Reverb's ratio counts from min_size_to_sample: the first update
            limits = dataclasses.replace(limits, min_size_to_sample=max(limits.min_size_to_sample, self.ready_size))
        self.limiter = limits.make()
        self.rng = np.random.default_rng(seed)
        self.transitions = 0  # inserted by ingest()
        self.updates = 0  # run by train()
        self._credited_from = 0  # transitions before the replay could be sampled earn no updates
        self._observed: list[Tree] = []  # observations ingested since the last train(), for the trainer

    @property
    def ready_size(self) -> int:
        """Transitions the replay holds before the first update: ``learning_starts`` and one batch."""
        return max(self.config.learning_starts, self.config.batch_size)

    def ingest(self, chunk: Chunk) -> None:
        batch = self._insert(chunk)
        if batch is not None:
            self.limiter.record_insert(batch.size)
            self._observed.append(batch.obs)
            self.transitions += batch.size

    def refill(self, chunks: Iterable[Chunk]) -> int:
        """Store the retained chunks in the replay. They earn no updates, count as no inserts for
        the rate limiter and reach no running statistics: all that happened before the restart."""
        stored = 0
        for chunk in chunks:
            batch = self._insert(chunk)
            stored += 0 if batch is None else batch.size
        return stored

    def _insert(self, chunk: Chunk) -> NStepBatch | None:
        """The n-step transitions ``chunk`` completes, stored in the replay (None if none)."""
        batch = self.nstep.add(chunk)  # the last n-1 steps of an unfinished episode wait for more
        if batch is None or not batch.size:
            return None
        self.replay.insert(*batch)
        return batch

    def ready(self) -> bool:  # the replay holds ``learning_starts`` and one batch
        return len(self.replay) >= self.ready_size

    def owed_updates(self) -> int:
        """Updates the data in hand allows now: by the rate limiter's allowance when it sets the
        replay ratio, else ``updates_per_step`` per transition credited."""
        if not self.ready():
            return 0
        if self.config.limiter_sets_ratio:
            return self.limiter.sample_allowance() // self.config.batch_size
        ratio = 1.0 if self.config.updates_per_step is None else self.config.updates_per_step
        return int((self.transitions - self._credited_from) * ratio) - self.updates

    def wants_data(self) -> bool:
        if not self.ready() or not self.limiter.can_sample(self.config.batch_size):
            return True
        return self.owed_updates() < self.config.pause_reading_at

    def has_updates(self) -> bool:
        # max_train_s 0 runs no update (tests pile updates up with it): then waiting stays, no spin
        return (self.config.max_train_s != 0 and self.owed_updates() > 0
                and self.limiter.can_sample(self.config.batch_size))

    def train(self, algo: OffPolicyTrainer, stop: StopSignal) -> Iterator[dict[str, float]]:
        observed, self._observed = self._observed, []
        for obs in observed:  # each inserted transition once, before any update samples it
            algo.observe_inserted(obs)
        if not self.ready():
            self._credited_from = self.transitions
            return
        batch_size = self.config.batch_size
        deadline = None if self.config.max_train_s is None else time.monotonic() + self.config.max_train_s
        while (self.owed_updates() > 0 and self.limiter.can_sample(batch_size) and not stop.is_set()
               and (deadline is None or time.monotonic() < deadline)):
            batch = self.replay.sample(batch_size, self.rng)
            stats, td_errors = algo.update(batch)
            self.replay.update_priorities(batch.indices, td_errors)
            self.limiter.record_sample(batch_size)
            self.updates += 1
            yield stats

    def stats(self) -> dict[str, int]:
        return {"size": len(self.replay), "inserted_transitions": self.transitions, "updates": self.updates,
                "owed_updates": self.owed_updates()}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "limiter": self.limiter.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; a state without the limiter's counts (older checkpoints)
        leaves them at zero: the ratio starts again once ``min_size_to_sample`` new transitions are in."""
        self.rng.bit_generator.state = state["rng"]
        if "limiter" in state:
            self.limiter.load_state_dict(state["limiter"])
