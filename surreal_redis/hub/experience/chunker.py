"""Vectorized env steps -> encoded experience chunks (the agent side of the entry format).

Steps of N envs go into preallocated numpy buffers (``[N, T+1, ...]`` for inline observation
leaves, ``[N, T, ...]`` for the rest), so a step costs a few array copies. Referenced observation
leaves are not buffered: each is identified as it arrives. A frame repeated from the previous
step (a frame stack shifting by one, an unchanged screen) is recognised by the XXH3-128 of its raw
bytes, hashed in place, which is far cheaper than encoding and hashing it again; a stack that
shifted in every env at once is recognised by one hash of each leaf's N frames. Any other frame
is encoded and hashed with blake2b, the digest stored and checked across agents; the XXH3 match
is only made among one agent's own frames (docs/benchmarks.md, Hub).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import xxhash

from surreal_redis.chunks import INITIAL_STATE
from surreal_redis.codec import DTYPE_BY_NAME, Tree, digest, encode_raw
from surreal_redis.hub.experience import payload as pl
from surreal_redis.trees import tree_leaves, tree_map, tree_structure

# one referenced leaf of one obs row: (its frame class, XXH3-128 of its raw bytes, digest, encoded blob);
# leaves of one class (dtype and shape) may share a Frame
Frame = tuple[int, int, str, bytes]
Row = list[Frame]  # the referenced leaves of one obs row, in leaf order


class EncodedChunk(NamedTuple):
    """One env's chunk as stream fields (a, e, o, d), the digests it references, its step count."""

    fields: tuple[bytes, bytes, bytes, bytes]
    digests: list[str]
    steps: int


class _StepSpec(NamedTuple):
    """What every step must look like (fixed by the first one), and how its obs leaves travel."""

    num_envs: int
    example_obs: Tree  # the first obs; only its structure is used
    leaf_specs: list[pl.Leaf]  # per obs leaf: wire dtype, shape without N, referenced or inline
    inline: list[int]  # ordinals of the obs leaves that travel inline
    referenced: list[int]  # ordinals of the obs leaves referenced by digest
    frame_class: list[int]  # per obs leaf: referenced leaves of equal (dtype, shape) share one; -1 inline
    extras_names: tuple[str, ...]
    extras_keys: frozenset[str]  # what a step's extras may hold: these, and optionally INITIAL_STATE
    extras_keys_with_state: frozenset[str]
    action_spec: tuple[np.dtype, tuple[int, ...]]


def _wire_dtype(dtype: np.dtype, what: str) -> np.dtype:
    """The little-endian allow-listed dtype an array travels as; ValueError for others."""
    wire = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).byteorder != "|" else np.dtype(dtype)
    if wire not in DTYPE_BY_NAME.values():
        raise ValueError(f"{what} has dtype {dtype}, which cannot travel (allowed: {', '.join(DTYPE_BY_NAME)})")
    return wire


def _as_wire(leaves: list[np.ndarray], spec: _StepSpec) -> list[np.ndarray]:
    """The referenced leaves in their wire dtype (little-endian), C-contiguous (each env's row is
    then one buffer to hash and compress in place); no copy when they already are."""
    out = list(leaves)
    for i in spec.referenced:
        leaf = out[i]
        if leaf.dtype != spec.leaf_specs[i].dtype or not leaf.flags.c_contiguous:
            out[i] = np.ascontiguousarray(leaf, spec.leaf_specs[i].dtype)
    return out


_identity = xxhash.xxh3_128_intdigest  # of a C-contiguous frame's raw bytes, read in place


class ChunkBuffer:
    """Buffers the steps of N envs and encodes T-step chunks (T = ``flush_steps``; the size
    settings are :class:`~surreal_redis.hub.experience.sender.SenderConfig`'s). Referenced blobs
    are available from :meth:`blob` until :meth:`release`. A chunk may reference at most
    ``max_obs`` (<= 256) distinct digests.
    """

    def __init__(self, agent_id: int, flush_steps: int, dedup_min_bytes: int, compress_min_bytes: int,
                 max_obs: int) -> None:
        if not 1 <= max_obs <= 256:
            raise ValueError(f"max_obs must be in 1..256 (digest indices are uint8), got {max_obs}")
        self.agent_id, self.flush_steps, self.max_obs = agent_id, flush_steps, max_obs
        self.dedup_min_bytes, self.compress_min_bytes = dedup_min_bytes, compress_min_bytes
        self.steps = 0  # steps stored in the current chunks
        self._spec: _StepSpec | None = None  # set by the first add()
        self._state: Tree | None = None  # the recurrent state at step 0 of the current chunks
        self._carry = False  # whether row 0 of the current chunks holds the previous chunks' last row
        self._sent: dict[str, Frame] = {}  # digest -> its reference, for every chunk returned since release()

    @property
    def num_envs(self) -> int:
        return 0 if self._spec is None else self._spec.num_envs

    def add(self, obs: Tree, actions: Any, rewards: Any, terminated: Any, truncated: Any,
            final_obs: Tree | None, extras: dict[str, Any] | None, policy_version: Any) -> list[EncodedChunk]:
        """Store one step (see :meth:`ExperienceSender.add` for the shapes). Returns the full
        chunks this step completed (its obs is their last row), else ``[]``."""
        leaves = [np.asarray(leaf) for leaf in tree_leaves(obs)]
        extras = extras or {}
        spec = self._spec if self._spec is not None else self._allocate(obs, leaves, actions, extras)
        T = self.flush_steps
        if len(leaves) != len(spec.leaf_specs):
            raise ValueError(f"obs has {len(leaves)} leaves, expected {len(spec.leaf_specs)}")
        done: list[EncodedChunk] = []
        if self.steps == T:  # obs is obs_T of the full chunks, and obs_0 of the next ones
            self._store_obs(leaves, T)
            done = self._build_chunks(T)
            self.steps = 0
            for rows in self._rows:
                rows[0] = rows[T]
            self._leaf_hashes[0] = self._leaf_hashes[T]
            self._carry = True
        t = self.steps
        if t or not self._carry:
            self._store_obs(leaves, t)
        else:  # the obs is row T of the chunks just built: only inline leaves need copying
            self._store_obs(leaves, t, inline_only=True)
        self._put(self._actions, t, actions, "actions")
        self._put(self._rewards, t, rewards, "rewards")
        self._put(self._terminated, t, terminated, "terminated")
        self._put(self._truncated, t, truncated, "truncated")
        if isinstance(policy_version, (int, np.integer)) or np.ndim(policy_version) == 0:
            self._versions[:, t] = policy_version
        else:
            self._put(self._versions, t, policy_version, "policy_version")
        if extras.keys() != spec.extras_keys and extras.keys() != spec.extras_keys_with_state:
            raise ValueError(f"extras keys {sorted(extras)} differ from the first step's {sorted(spec.extras_names)}")
        for name in spec.extras_names:
            self._put(self._extras[name], t, extras[name], f"extras[{name!r}]")
        if t == 0:
            state = extras.get(INITIAL_STATE)
            self._state = None if state is None else tree_map(lambda x: np.array(x, copy=True), state)
        ends = self._terminated[:, t] | self._truncated[:, t]
        if ends.any():
            ended = np.flatnonzero(ends)
            if final_obs is None:
                raise ValueError(f"episodes of envs {ended.tolist()} ended but final_obs is None")
            final = [np.asarray(leaf) for leaf in tree_leaves(final_obs)]
            if [f.shape for f in final] != [leaf.shape for leaf in leaves]:
                raise ValueError("final_obs must have the structure and leaf shapes of obs")
            final = _as_wire(final, spec)
            for env in ended.tolist():
                row = self._digest_row(final, env, self._rows[env][t])
                self._final[env][t] = (row, {i: final[i][env].copy() for i in spec.inline})
        self.steps += 1
        return done

    def finish(self, next_obs: Tree | None) -> list[EncodedChunk]:
        """Encode the partial chunks; ``next_obs`` completes their last step, without it that step
        is left out. The next :meth:`add` starts new chunks."""
        steps = self.steps
        if next_obs is not None and steps:
            self._store_obs([np.asarray(leaf) for leaf in tree_leaves(next_obs)], steps)
        elif steps:
            steps -= 1
        done = self._build_chunks(steps) if steps > 0 else []
        self.steps, self._carry = 0, False
        for finals in getattr(self, "_final", ()):  # absent before the first add() allocates
            finals.clear()
        return done

    def blob(self, key: str) -> bytes:
        """The encoded observation of digest ``key`` from the chunks returned since :meth:`release`."""
        return self._sent[key][3]

    def release(self) -> None:
        """Forget the blobs of the chunks returned so far (they were sent)."""
        self._sent.clear()

    # ------------------------------------------------------------ buffers

    def _step_spec(self) -> _StepSpec:
        if self._spec is None:
            raise RuntimeError("no step added yet: the first add() fixes the chunk layout")
        return self._spec

    def _allocate(self, obs: Tree, leaves: list[np.ndarray], actions: Any,
                  extras: dict[str, Any]) -> _StepSpec:
        if not leaves or any(leaf.ndim < 1 for leaf in leaves):
            raise ValueError("every obs leaf needs a leading env dimension N")
        n = leaves[0].shape[0]
        if any(leaf.shape[0] != n for leaf in leaves):
            raise ValueError(f"obs leaves disagree on N: {[leaf.shape for leaf in leaves]}")
        specs: list[pl.Leaf] = []
        frame_class: list[int] = []
        classes: dict[tuple[str, tuple[int, ...]], int] = {}
        for i, leaf in enumerate(leaves):
            dtype = _wire_dtype(leaf.dtype, f"obs leaf {i}")
            referenced = leaf.nbytes // max(n, 1) >= self.dedup_min_bytes
            specs.append(pl.Leaf(dtype, leaf.shape[1:], referenced))
            frame_class.append(classes.setdefault((dtype.str, leaf.shape[1:]), len(classes)) if referenced else -1)
        inline = [i for i, leaf_spec in enumerate(specs) if not leaf_spec.ref]
        referenced = [i for i, leaf_spec in enumerate(specs) if leaf_spec.ref]
        T = self.flush_steps
        # inline leaves only; referenced leaves live in self._rows as Frames
        self._obs = {i: np.zeros((n, T + 1, *specs[i].shape), specs[i].dtype) for i in inline}
        self._rows: list[list[Row]] = [[[] for _ in range(T + 1)] for _ in range(n)]
        # per obs row: XXH3-128 of each referenced leaf ([N, ...], all envs' frames at once)
        self._leaf_hashes: list[list[int]] = [[] for _ in range(T + 1)]
        act = np.asarray(actions)
        self._actions = np.zeros((n, T, *act.shape[1:]), _wire_dtype(act.dtype, "actions"))
        self._rewards = np.zeros((n, T), "<f4")
        self._terminated = np.zeros((n, T), bool)
        self._truncated = np.zeros((n, T), bool)
        self._versions = np.zeros((n, T), "<i8")
        names = tuple(k for k in extras if k != INITIAL_STATE)
        self._extras = {}
        for name in names:
            value = np.asarray(extras[name])
            self._extras[name] = np.zeros((n, T, *value.shape[1:]), _wire_dtype(value.dtype, f"extras[{name!r}]"))
        # env -> step -> (referenced row, {inline leaf ordinal: copy}) of the true final observation
        self._final: list[dict[int, tuple[Row, dict[int, np.ndarray]]]] = [{} for _ in range(n)]
        self._state = None
        self._spec = _StepSpec(n, obs, specs, inline, referenced, frame_class, names, frozenset(names),
                               frozenset((*names, INITIAL_STATE)), (self._actions.dtype, act.shape[1:]))
        # what _put checks each step against: [N, ...] without the time axis, per buffer
        buffers = (self._actions, self._rewards, self._terminated, self._truncated, self._versions,
                   *self._extras.values())
        self._row_shapes = {id(b): b.shape[:1] + b.shape[2:] for b in buffers}
        self._payloads: dict[Any, pl.Layout] = {}
        return self._spec

    def _payload_layout(self) -> pl.Layout:
        """The payload layout of the current chunks (one per recurrent-state signature)."""
        spec, state = self._step_spec(), self._state
        key = None
        if state is not None:
            key = (repr(tree_structure(state)), tuple((x.dtype.str, x.shape[1:]) for x in tree_leaves(state)))
        found = self._payloads.get(key)
        if found is None:
            extras = [(name, buffer.dtype, buffer.shape[2:]) for name, buffer in self._extras.items()]
            example = None if state is None else tree_map(lambda x: x[0], state)
            found = self._payloads[key] = pl.Layout.create(spec.example_obs, spec.leaf_specs, spec.action_spec,
                                                           extras, example)
        return found

    def _put(self, buffer: np.ndarray, t: int, value: Any, name: str) -> None:
        shape = value.shape if isinstance(value, np.ndarray) else np.shape(value)
        if shape != self._row_shapes[id(buffer)]:
            raise ValueError(f"{name} has shape {shape}, expected {self._row_shapes[id(buffer)]}")
        buffer[:, t] = value

    def _store_obs(self, leaves: list[np.ndarray], t: int, inline_only: bool = False) -> None:
        """Copy the inline leaves into row ``t`` and identify the referenced ones (row ``t`` of
        ``self._rows``, compared with row ``t - 1``)."""
        spec = self._step_spec()
        n = spec.num_envs
        for i, (leaf, leaf_spec) in enumerate(zip(leaves, spec.leaf_specs)):
            if leaf.shape != (n, *leaf_spec.shape):
                raise ValueError(f"obs leaf {i} has shape {leaf.shape}, expected {(n, *leaf_spec.shape)}")
        for i, buffer in self._obs.items():
            buffer[:, t] = leaves[i]
        if spec.referenced and not inline_only:
            leaves = _as_wire(leaves, spec)
            # A frame stack shifts by one leaf per step: one hash of each whole [N, ...] leaf finds
            # the leaves that shifted in every env at once, without a look per env.
            referenced, frame_class = spec.referenced, spec.frame_class
            hashes = self._leaf_hashes[t] = [_identity(leaves[i].data) for i in referenced]
            last = self._leaf_hashes[t - 1] if t else []
            shifted = [pos + 1 < len(last) and h == last[pos + 1]
                       and frame_class[i] == frame_class[referenced[pos + 1]]
                       for pos, (i, h) in enumerate(zip(referenced, hashes))]
            for env, rows in enumerate(self._rows):
                rows[t] = self._digest_row(leaves, env, rows[t - 1] if t else [], shifted)

    # ------------------------------------------------------------ chunks

    def _digest_row(self, leaves: list[np.ndarray], env: int, prev: Row, shifted: list[bool] | None = None) -> Row:
        """The references of env ``env``'s referenced leaves (C-contiguous, :func:`_as_wire`). A
        frame whose XXH3-128 matches a candidate of its class (leaf k+1 or k of ``prev``, or the
        previous leaf of this row) shares its Frame; any other is encoded and hashed.
        ``shifted[k]``: referenced leaf k is known to equal leaf k+1 of ``prev`` (for every env)."""
        spec = self._step_spec()
        frame_class, specs = spec.frame_class, spec.leaf_specs
        row: Row = []
        last = len(prev) - 1
        found: Frame
        for pos, i in enumerate(spec.referenced):
            if shifted is not None and shifted[pos]:
                row.append(prev[pos + 1])
                continue
            frame = leaves[i][env]
            key = _identity(frame)
            kind = frame_class[i]
            if pos < last and (found := prev[pos + 1])[1] == key and found[0] == kind:
                row.append(found)
            elif prev and (found := prev[pos])[1] == key and found[0] == kind:
                row.append(found)
            elif pos and (found := row[-1])[1] == key and found[0] == kind:
                row.append(found)
            else:
                leaf_spec = specs[i]
                blob = encode_raw(frame, leaf_spec.dtype, leaf_spec.shape, self.compress_min_bytes)
                row.append((kind, key, digest(blob), blob))
        return row

    def _build_chunks(self, steps: int) -> list[EncodedChunk]:
        """Stream fields and referenced digests of each env's chunk of ``steps`` steps (obs rows
        0..steps). Clears the per-chunk final observations."""
        payload = self._payload_layout()
        ended_all = self._terminated[:, :steps] | self._truncated[:, :steps]
        chunks = []
        for env in range(self._step_spec().num_envs):
            ended = np.flatnonzero(ended_all[env]).tolist()  # add() holds a final obs for each
            chunks.append(self._chunk_fields(payload, env, steps, ended))
            self._final[env].clear()
        return chunks

    def _chunk_fields(self, payload: pl.Layout, env: int, steps: int, ended: list[int]) -> EncodedChunk:
        spec = self._step_spec()
        rows = self._rows[env][: steps + 1]
        finals = self._final[env]
        final_rows = [finals[t][0] for t in ended]
        order: dict[str, int] = {}
        sent = self._sent
        indices: dict[tuple[int, int], list[int]] = {}  # (group, referenced leaf) -> digest indices
        # Numbered in order of first use, leaf by leaf, so the leaves of a frame stack index
        # consecutive ranges (the receiver then shares one array of frames between them).
        for group, source in ((pl.OBS, rows), (pl.FINAL, final_rows)):
            for pos, i in enumerate(spec.referenced):
                column = indices[group, i] = []
                for row in source:
                    frame = row[pos]
                    index = order.get(frame[2])
                    if index is None:
                        index = order[frame[2]] = len(order)
                        sent[frame[2]] = frame
                    column.append(index)
        digests = list(order)
        if len(digests) > self.max_obs:
            raise ValueError(f"a chunk references {len(digests)} observation leaves, more than the "
                             f"{self.max_obs} one insert takes: lower sender.flush_steps (now {self.flush_steps})")
        versions = self._versions[env, :steps]
        one_version = bool((versions == versions[0]).all())
        state = [] if self._state is None else tree_leaves(self._state)  # STATE slots exist only with a state
        per_step = {pl.ACTIONS: self._actions, pl.REWARDS: self._rewards, pl.TERMINATED: self._terminated,
                    pl.TRUNCATED: self._truncated}

        def array(slot: pl.Slot) -> np.ndarray:
            group, i = slot.group, slot.index
            if (group, i) in indices:
                return np.array(indices[group, i], pl.INDEX_DTYPE)
            if group == pl.OBS:
                return self._obs[i][env, : steps + 1]
            if group == pl.FINAL:
                if not ended:
                    return np.zeros((0, *slot.shape), slot.dtype)
                return np.ascontiguousarray(np.stack([finals[t][1][i] for t in ended]), slot.dtype)
            if group == pl.VERSION:
                return versions[:1] if one_version else versions
            if group == pl.EXTRAS:
                return self._extras[payload.extras[i][0]][env, :steps]
            if group == pl.STATE:
                return np.ascontiguousarray(state[i][env], slot.dtype)
            return per_step[group][env, :steps]

        data = pl.encode(payload, steps, len(ended), array, one_version, self.compress_min_bytes)
        fields = (str(self.agent_id).encode(), str(env).encode(), ",".join(digests).encode(), data)
        return EncodedChunk(fields, digests, steps)
