"""Where off-policy replays keep their transitions: :class:`TransitionStorage`, a preallocated numpy
ring of (n-step) transitions, and :class:`Replay`, which holds one and picks the slots a batch
samples (as Reverb's and TorchRL's samplers sit over their storage).

The first :meth:`TransitionStorage.insert` fixes the layout (tree structure, leaf shapes, dtypes).
Each observation leaf is stored one of two ways:

- **dense** (under ``dedup_min_bytes`` per item, e.g. CartPole's 4 floats): ring arrays
  ``[capacity, ...]`` for ``obs`` and ``next_obs``, as in SB3's ReplayBuffer.
- **pooled** (images, each frame of a frame stack): a :class:`_FramePool` per (dtype, shape) holds
  each distinct array once (blake2b digest, reference-counted), and the rings hold pool slots. A
  4-frame Atari stream shares 3 of 4 frames between neighbouring observations and all 4 between a
  ``next_obs`` and the next ``obs``, so the pool holds about one frame per transition (plus K per
  episode start) instead of SB3's 8.

Overwritten transitions release their frames; a frame no longer referenced frees its slot. The pool starts at ``capacity + 64`` slots (numpy allocates pages
lazily, so unused slots cost no resident memory) and grows by half when a stream shares less.
"""

from __future__ import annotations

import abc
import hashlib
import threading
from typing import NamedTuple

import numpy as np

from surreal_redis.chunks import TransitionBatch
from surreal_redis.trees import Path, Structure, Tree, tree_leaves_with_paths, tree_structure, tree_unflatten


class _FramePool:
    """Content-addressed, reference-counted store of arrays of one dtype and shape."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, slots: int) -> None:
        self.frames = np.empty((slots, *shape), dtype=dtype)
        self._refcount = np.zeros(slots, dtype=np.int64)
        self._slot_of: dict[bytes, int] = {}
        self._digest_of: list[bytes | None] = [None] * slots
        self._free: list[int] = []
        self._high_water = 0  # slots below it have been used at least once

    def __len__(self) -> int:
        return len(self._slot_of)  # distinct frames held

    def acquire(self, items: np.ndarray) -> np.ndarray:
        """Store ``items`` ``[M, *shape]`` (content already held is reused); +1 reference each.

        Returns int64 ``[M]`` slot indices into :attr:`frames`.
        """
        items = np.ascontiguousarray(items)
        slots = np.empty(len(items), dtype=np.int64)
        for i, item in enumerate(items):
            key = hashlib.blake2b(item, digest_size=16).digest()
            slot = self._slot_of.get(key)
            if slot is None:
                slot = self._take_slot()
                self.frames[slot] = item
                self._slot_of[key] = slot
                self._digest_of[slot] = key
            slots[i] = slot
        np.add.at(self._refcount, slots, 1)
        return slots

    def release(self, slots: np.ndarray) -> None:
        """-1 reference for each of ``slots``; frames left unreferenced free their slot."""
        np.subtract.at(self._refcount, slots, 1)
        for slot in np.unique(slots[self._refcount[slots] == 0]).tolist():
            del self._slot_of[self._digest_of[slot]]
            self._digest_of[slot] = None
            self._free.append(slot)

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        if self._high_water == len(self.frames):
            self._grow(len(self.frames) + max(1, len(self.frames) // 2))
        self._high_water += 1
        return self._high_water - 1

    def _grow(self, slots: int) -> None:
        frames = np.empty((slots, *self.frames.shape[1:]), dtype=self.frames.dtype)
        frames[: len(self.frames)] = self.frames
        self.frames = frames
        self._refcount = np.concatenate([self._refcount, np.zeros(slots - len(self._refcount), np.int64)])
        self._digest_of.extend([None] * (slots - len(self._digest_of)))


class _LeafSpec(NamedTuple):
    shape: tuple[int, ...]  # per transition, without the batch axis
    dtype: np.dtype
    pooled: bool


def _name(path: Path) -> str:  # for messages: ("pixels", 0) -> "pixels/0"
    return "/".join(map(str, path))


class TransitionStorage:
    """Ring of ``capacity`` transitions; the oldest are overwritten first. Not thread-safe: the
    :class:`Replay` holding it locks around every call, so hub reader threads may insert while the
    learner samples.

    Observation leaves of at least ``dedup_min_bytes`` per transition are pooled.
    """

    def __init__(self, capacity: int, dedup_min_bytes: int) -> None:
        self.capacity = capacity
        self.dedup_min_bytes = dedup_min_bytes
        self._size = 0
        self._next = 0  # ring position of the next insert
        self._structure: Structure = None  # of the first obs; leaves are rebuilt in _specs order
        self._specs: dict[Path, _LeafSpec] = {}
        self._pools: dict[tuple[str, tuple[int, ...]], _FramePool] = {}
        # per leaf path: dense [capacity, ...] values, or pooled [capacity] int64 pool slots
        self._obs: dict[Path, np.ndarray] = {}
        self._next_obs: dict[Path, np.ndarray] = {}
        self._actions: np.ndarray | None = None
        self._rewards = np.zeros(capacity, dtype=np.float32)
        self._discounts = np.zeros(capacity, dtype=np.float32)

    def __len__(self) -> int:
        return self._size

    @property
    def num_frames(self) -> int:
        """Distinct pooled observation arrays held (frames, images), over all pools."""
        return sum(len(pool) for pool in self._pools.values())

    @property
    def nbytes(self) -> int:
        """Bytes of allocated storage (pools at their allocated size, rings, index arrays)."""
        arrays = [self._rewards, self._discounts, *self._obs.values(), *self._next_obs.values()]
        arrays += [pool.frames for pool in self._pools.values()]
        if self._actions is not None:
            arrays.append(self._actions)
        return sum(a.nbytes for a in arrays)

    def insert(self, obs: Tree, actions: np.ndarray, rewards: np.ndarray, next_obs: Tree,
               discounts: np.ndarray) -> np.ndarray:
        """Add B transitions; returns their int64 ``[B]`` slots (0 <= slot < capacity).

        Shapes: ``obs`` and ``next_obs`` trees (dicts, tuples of frames, arrays) with leaves
        ``[B, ...]``; ``actions`` ``[B, ...]``; ``rewards``, ``discounts`` ``[B]`` (float32, see
        :class:`~surreal_redis.chunks.TransitionBatch`). B must not exceed :attr:`capacity`.
        """
        flat_obs = {path: np.asarray(leaf) for path, leaf in tree_leaves_with_paths(obs)}
        flat_next = {path: np.asarray(leaf) for path, leaf in tree_leaves_with_paths(next_obs)}
        actions = np.asarray(actions)
        batch = int(np.shape(rewards)[0]) if np.ndim(rewards) == 1 else -1
        if batch < 0 or np.shape(discounts) != (batch,):
            raise ValueError(f"rewards and discounts must both be [B]; got shapes "
                             f"{np.shape(rewards)} and {np.shape(discounts)}")
        if not 1 <= batch <= self.capacity:
            raise ValueError(f"insert of {batch} transitions: need 1 <= B <= capacity ({self.capacity})")
        action_ring = self._actions if self._actions is not None else self._allocate(obs, flat_obs, actions)
        self._check("obs", flat_obs, batch)
        self._check("next_obs", flat_next, batch)
        if actions.shape != (batch, *action_ring.shape[1:]):
            raise ValueError(f"actions shape {actions.shape} does not match "
                             f"[{batch}, {', '.join(map(str, action_ring.shape[1:]))}]")

        indices = (self._next + np.arange(batch)) % self.capacity
        self._release(indices[indices < self._size])
        for path, spec in self._specs.items():
            for ring, flat in ((self._obs, flat_obs), (self._next_obs, flat_next)):
                values = flat[path]
                if spec.pooled:
                    values = self._pool(spec).acquire(values.astype(spec.dtype, copy=False))
                ring[path][indices] = values
        action_ring[indices] = actions
        self._rewards[indices] = rewards
        self._discounts[indices] = discounts
        self._next = int(indices[-1] + 1) % self.capacity
        self._size = min(self._size + batch, self.capacity)
        return indices

    def check_can_sample(self, batch_size: int) -> None:
        """ValueError for a ``batch_size`` below 1 or an empty storage."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay")

    def gather(self, indices: np.ndarray, weights: np.ndarray) -> TransitionBatch:
        """The transitions in slots ``indices`` ``[B]``, with importance ``weights`` ``[B]``."""
        # np.take copies rows as ring[indices] does, in about a third of its time (a 256-row batch of
        # a 1M-slot ring: ~3 against ~9 us per leaf), with the same IndexError for a bad slot.
        def tree(ring: dict[Path, np.ndarray]) -> Tree:
            leaves = []
            for path, spec in self._specs.items():
                values = np.take(ring[path], indices, axis=0)
                leaves.append(np.take(self._pool(spec).frames, values, axis=0) if spec.pooled else values)
            return tree_unflatten(self._structure, leaves)

        if self._actions is None:
            raise ValueError("cannot gather from a replay that holds no transition yet")
        return TransitionBatch(
            obs=tree(self._obs),
            actions=np.take(self._actions, indices, axis=0),
            rewards=np.take(self._rewards, indices),
            next_obs=tree(self._next_obs),
            discounts=np.take(self._discounts, indices),
            weights=weights,
            indices=indices,
        )

    def _pool(self, spec: _LeafSpec) -> _FramePool:
        return self._pools[(spec.dtype.str, spec.shape)]

    def _allocate(self, obs: Tree, flat_obs: dict[Path, np.ndarray], actions: np.ndarray) -> np.ndarray:
        """Rings for the layout of the first insert; returns the actions ring."""
        structure = tree_structure(obs)  # first: ValueError for a key that is not a string
        capacity = self.capacity
        specs = {}
        for path, leaf in flat_obs.items():
            if leaf.ndim == 0:
                raise ValueError(f"obs leaf {_name(path)!r} has no batch axis (shape ())")
            specs[path] = _LeafSpec(tuple(leaf.shape[1:]), leaf.dtype, leaf[0].nbytes >= self.dedup_min_bytes)
        for path, spec in specs.items():
            if spec.pooled:
                key = (spec.dtype.str, spec.shape)
                if key not in self._pools:
                    self._pools[key] = _FramePool(spec.shape, spec.dtype, capacity + 64)
                self._obs[path] = np.zeros(capacity, dtype=np.int64)
                self._next_obs[path] = np.zeros(capacity, dtype=np.int64)
            else:
                self._obs[path] = np.zeros((capacity, *spec.shape), dtype=spec.dtype)
                self._next_obs[path] = np.zeros((capacity, *spec.shape), dtype=spec.dtype)
        self._specs = specs
        self._structure = structure
        self._actions = np.zeros((capacity, *actions.shape[1:]), dtype=actions.dtype)
        return self._actions

    def _check(self, name: str, flat: dict[Path, np.ndarray], batch: int) -> None:
        if flat.keys() != self._specs.keys():
            raise ValueError(f"{name} leaves {[_name(p) for p in flat]} do not match the stored layout "
                             f"{[_name(p) for p in self._specs]}")
        for path, leaf in flat.items():
            expected = (batch, *self._specs[path].shape)
            if leaf.shape != expected:
                raise ValueError(f"{name} leaf {_name(path)!r} has shape {leaf.shape}, expected {expected}")

    def _release(self, indices: np.ndarray) -> None:
        if len(indices) == 0:
            return
        for path, spec in self._specs.items():
            if spec.pooled:
                pool = self._pool(spec)
                pool.release(self._obs[path][indices])
                pool.release(self._next_obs[path][indices])


class Replay(abc.ABC):
    """An off-policy replay: a :class:`TransitionStorage` it holds, and the rule that picks the
    slots a batch samples. Thread-safe (one lock). Non-blocking: :meth:`insert` overwrites the
    oldest transitions when full; ``sample`` raises on an empty replay (gate it with a rate limiter).
    """

    def __init__(self, storage: TransitionStorage) -> None:
        self.storage = storage
        self._lock = threading.RLock()

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def __len__(self) -> int:
        return len(self.storage)

    @property
    def num_frames(self) -> int:
        """See :attr:`TransitionStorage.num_frames`."""
        return self.storage.num_frames

    @property
    def nbytes(self) -> int:
        """See :attr:`TransitionStorage.nbytes`."""
        return self.storage.nbytes

    def insert(self, obs: Tree, actions: np.ndarray, rewards: np.ndarray, next_obs: Tree,
               discounts: np.ndarray) -> np.ndarray:
        """Add B transitions (see :meth:`TransitionStorage.insert`); returns their int64 ``[B]`` slots."""
        with self._lock:
            return self.storage.insert(obs, actions, rewards, next_obs, discounts)

    @abc.abstractmethod
    def sample(self, batch_size: int, rng: np.random.Generator) -> TransitionBatch:
        """``batch_size`` transitions with their importance weights ``[B]`` and slots ``[B]``.
        Raises ValueError when the replay is empty. Never blocks."""

    @abc.abstractmethod
    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """The learner's TD errors ``[B]`` of the slots ``indices`` ``[B]`` of a sampled batch."""
