"""Vectorized env steps -> encoded experience chunks (the agent side of the entry format).

Steps of N envs go into preallocated numpy buffers, one per leaf (``[N, T+1, ...]`` for
observations, ``[N, T, ...]`` for the rest), so a step costs a few array copies. When a chunk is
complete, every referenced observation leaf is encoded and hashed once; a frame repeated from
the neighbouring step (frame stacks) is recognised by comparing raw bytes, which is far cheaper
than encoding and hashing it again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from surreal_redis.codec import Tree, digest, encode_array, encode_tree
from surreal_redis.hub.wire import INITIAL_STATE, tree_leaves, tree_map

Row = list[tuple[int, bytes, str]]  # per referenced leaf of one obs row: (signature, raw bytes, digest)


class EncodedChunk(NamedTuple):
    """One env's chunk as stream fields (a, e, o, d), the digests it references, its step count."""

    fields: tuple[bytes, bytes, bytes, bytes]
    digests: list[str]
    steps: int


class _Layout(NamedTuple):
    num_envs: int
    template: Tree  # first obs tree; only its structure is used
    ref: list[int]  # leaf ordinal -> position among referenced leaves, -1 if inline
    sig: list[int]  # referenced leaves with equal (dtype, shape) share a signature
    extras: tuple[str, ...]


class ChunkBuffer:
    """Buffers the steps of N envs and encodes T-step chunks (T = ``flush_steps``).

    Observation leaves of at least ``dedup_min_bytes`` per env and step are referenced by digest
    (their encoded blobs are available from :meth:`blob` until :meth:`release`); others travel
    inline. Arrays of at least ``compress_min_bytes`` are lz4-compressed. A chunk may reference
    at most ``max_obs`` distinct digests.
    """

    def __init__(self, agent_id: int, flush_steps: int, dedup_min_bytes: int, compress_min_bytes: int,
                 max_obs: int) -> None:
        self.agent_id, self.flush_steps, self.max_obs = agent_id, flush_steps, max_obs
        self.dedup_min_bytes, self.compress_min_bytes = dedup_min_bytes, compress_min_bytes
        self.steps = 0  # steps stored in the current chunks
        self._layout: _Layout | None = None
        self._carry: list[Row] | None = None  # digests of obs row 0, per env
        self._blobs: dict[str, bytes] = {}  # digest -> encoded observation, until release()
        # digest -> (raw bytes, dtype, shape) of observations matched rather than encoded; bytes,
        # not views: the buffer rows are overwritten while the chunks are still being sent
        self._raw: dict[str, tuple[bytes, np.dtype, tuple[int, ...]]] = {}

    @property
    def num_envs(self) -> int:
        return 0 if self._layout is None else self._layout.num_envs

    def add(self, obs: Tree, actions: Any, rewards: Any, terminated: Any, truncated: Any,
            final_obs: Tree | None, extras: dict[str, Any] | None, policy_version: Any) -> list[EncodedChunk]:
        """Store one step (see :meth:`ExperienceSender.add` for the shapes). Returns the full
        chunks this step completed (its obs is their last row), else ``[]``."""
        leaves = [np.asarray(leaf) for leaf in tree_leaves(obs)]
        extras = extras or {}
        if self._layout is None:
            self._allocate(obs, leaves, actions, extras)
        layout = self._layout
        T = self.flush_steps
        if len(leaves) != len(self._obs):
            raise ValueError(f"obs has {len(leaves)} leaves, expected {len(self._obs)}")
        done: list[EncodedChunk] = []
        if self.steps == T:  # obs is obs_T of the full chunks, and obs_0 of the next ones
            self._store_obs(leaves, T)
            done = self._build_chunks(T)
            self.steps = 0
        t = self.steps
        self._store_obs(leaves, t)
        self._put(self._actions, t, actions, "actions")
        self._put(self._rewards, t, rewards, "rewards")
        self._put(self._terminated, t, terminated, "terminated")
        self._put(self._truncated, t, truncated, "truncated")
        if np.ndim(policy_version) == 0:
            self._versions[:, t] = policy_version
        else:
            self._put(self._versions, t, policy_version, "policy_version")
        if tuple(k for k in extras if k != INITIAL_STATE) != layout.extras:
            raise ValueError(f"extras keys {sorted(extras)} differ from the first step's {sorted(layout.extras)}")
        for name in layout.extras:
            self._put(self._extras[name], t, extras[name], f"extras[{name!r}]")
        if t == 0:
            state = extras.get(INITIAL_STATE)
            self._state = None if state is None else tree_map(state, lambda _i, x: np.array(x, copy=True))
        ended = np.flatnonzero(self._terminated[:, t] | self._truncated[:, t])
        if ended.size:
            if final_obs is None:
                raise ValueError(f"episodes of envs {ended.tolist()} ended but final_obs is None")
            final = [np.asarray(leaf) for leaf in tree_leaves(final_obs)]
            if [f.shape for f in final] != [leaf.shape for leaf in leaves]:
                raise ValueError("final_obs must have the structure and leaf shapes of obs")
            for env in ended.tolist():
                self._final[env][t] = [leaf[env].copy() for leaf in final]
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
        self.steps, self._carry = 0, None
        for finals in self._final:
            finals.clear()
        return done

    def blob(self, key: str) -> bytes:
        """The encoded observation of digest ``key`` from the chunks returned since :meth:`release`."""
        blob = self._blobs.get(key)
        if blob is None:
            raw, dtype, shape = self._raw[key]
            array = np.frombuffer(raw, dtype).reshape(shape)
            blob = self._blobs[key] = encode_array(array, self.compress_min_bytes)
        return blob

    def release(self) -> None:
        """Forget the blobs of the chunks returned so far (they were sent)."""
        self._blobs.clear()
        self._raw.clear()

    # ------------------------------------------------------------ buffers

    def _allocate(self, obs: Tree, leaves: list[np.ndarray], actions: Any, extras: dict[str, Any]) -> None:
        if not leaves or any(leaf.ndim < 1 for leaf in leaves):
            raise ValueError("every obs leaf needs a leading env dimension N")
        n = leaves[0].shape[0]
        if any(leaf.shape[0] != n for leaf in leaves):
            raise ValueError(f"obs leaves disagree on N: {[leaf.shape for leaf in leaves]}")
        ref, sig, sigs = [], [], {}
        for leaf in leaves:
            if leaf.nbytes // n >= self.dedup_min_bytes:
                ref.append(sum(r >= 0 for r in ref))
                sig.append(sigs.setdefault((leaf.dtype.str, leaf.shape[1:]), len(sigs)))
            else:
                ref.append(-1)
                sig.append(-1)
        T = self.flush_steps
        self._obs = [np.zeros((n, T + 1, *leaf.shape[1:]), leaf.dtype) for leaf in leaves]
        act = np.asarray(actions)
        self._actions = np.zeros((n, T, *act.shape[1:]), act.dtype)
        self._rewards = np.zeros((n, T), np.float32)
        self._terminated = np.zeros((n, T), bool)
        self._truncated = np.zeros((n, T), bool)
        self._versions = np.zeros((n, T), np.int64)
        names = tuple(k for k in extras if k != INITIAL_STATE)
        self._extras = {}
        for name in names:
            value = np.asarray(extras[name])
            self._extras[name] = np.zeros((n, T, *value.shape[1:]), value.dtype)
        self._final: list[dict[int, list[np.ndarray]]] = [{} for _ in range(n)]
        self._state: Tree | None = None
        self._layout = _Layout(n, obs, ref, sig, names)

    def _put(self, buffer: np.ndarray, t: int, value: Any, name: str) -> None:
        value = np.asarray(value)
        expected = buffer.shape[:1] + buffer.shape[2:]
        if value.shape != expected:
            raise ValueError(f"{name} has shape {value.shape}, expected {expected}")
        buffer[:, t] = value

    def _store_obs(self, leaves: list[np.ndarray], t: int) -> None:
        for i, (leaf, buffer) in enumerate(zip(leaves, self._obs)):
            if leaf.shape != buffer.shape[:1] + buffer.shape[2:]:
                raise ValueError(f"obs leaf {i} has shape {leaf.shape}, expected {buffer.shape[:1] + buffer.shape[2:]}")
            buffer[:, t] = leaf

    # ------------------------------------------------------------ chunks

    def _digest_leaf(self, array: np.ndarray, sig: int,
                     candidates: Row) -> tuple[int, bytes, str]:
        """(sig, raw bytes, digest); frames repeated from a neighbouring step (frame stacks) are
        found by comparing raw bytes, which is much cheaper than encoding and hashing them again."""
        raw = array.tobytes()
        for other in candidates:
            if other[0] == sig and other[1] == raw:
                self._raw.setdefault(other[2], (raw, array.dtype, array.shape))
                return other
        blob = encode_array(array, self.compress_min_bytes)
        key = digest(blob)
        self._blobs.setdefault(key, blob)
        return sig, raw, key

    def _build_chunks(self, steps: int) -> list[EncodedChunk]:
        """Stream fields and referenced digests of each env's chunk of ``steps`` steps (obs rows
        0..steps). Clears the per-chunk final observations; keeps obs row ``steps`` digests."""
        layout = self._layout
        refs = [i for i, r in enumerate(layout.ref) if r >= 0]
        carry: list[Row] = []
        chunks = []
        for env in range(layout.num_envs):
            # rows[t]: (signature, raw bytes, digest) of each referenced leaf of obs row t
            rows: list[Row] = []
            prev = self._carry[env] if self._carry is not None else []
            for t in range(steps + 1):
                if (t == 0 and prev) or not refs:
                    for i, entry in zip(refs, prev):
                        self._raw.setdefault(entry[2], (entry[1], self._obs[i].dtype, self._obs[i].shape[2:]))
                    rows.append(prev)
                    continue
                row: Row = []
                for i in refs:
                    row.append(self._digest_leaf(self._obs[i][env, t], layout.sig[i], prev + row))
                rows.append(row)
                prev = row
            finals = self._final[env]
            final_rows = {t: [self._digest_leaf(finals[t][i], layout.sig[i], rows[t]) for i in refs]
                          for t in sorted(finals) if t < steps}
            chunks.append(self._chunk_fields(env, steps, rows, final_rows))
            carry.append(rows[steps])
            finals.clear()
        self._carry = carry
        return chunks

    def _chunk_fields(self, env: int, steps: int, rows: list, final_rows: dict) -> EncodedChunk:
        layout = self._layout
        order: dict[str, int] = {}

        def indices(digests: list[str]) -> np.ndarray:
            return np.array([order.setdefault(d, len(order)) for d in digests], np.int32)

        obs = tree_map(layout.template, lambda i, _leaf: (
            indices([row[layout.ref[i]][2] for row in rows]) if layout.ref[i] >= 0
            else self._obs[i][env, : steps + 1]))
        payload: dict[str, Any] = {
            "obs": obs,
            "ref": np.array([i for i, r in enumerate(layout.ref) if r >= 0], np.int32),
            "actions": self._actions[env, :steps],
            "rewards": self._rewards[env, :steps],
            "terminated": self._terminated[env, :steps],
            "truncated": self._truncated[env, :steps],
            "policy_version": self._versions[env, :steps],
            "extras": {name: buffer[env, :steps] for name, buffer in self._extras.items()},
        }
        if self._state is not None:
            payload["extras"][INITIAL_STATE] = tree_map(self._state, lambda _i, x: x[env])
        if final_rows:
            ts = sorted(final_rows)
            finals = self._final[env]
            payload["final_t"] = np.array(ts, np.int32)
            payload["final_obs"] = tree_map(layout.template, lambda i, _leaf: (
                indices([final_rows[t][layout.ref[i]][2] for t in ts]) if layout.ref[i] >= 0
                else np.stack([finals[t][i] for t in ts])))
        data = encode_tree(payload, self.compress_min_bytes)
        digests = list(order)
        if len(digests) > self.max_obs:
            raise ValueError(f"a chunk references {len(digests)} observation leaves, more than the "
                             f"{self.max_obs} one insert takes: lower sender.flush_steps (now {self.flush_steps})")
        fields = (str(self.agent_id).encode(), str(env).encode(), ",".join(digests).encode(), data)
        return EncodedChunk(fields, digests, steps)
