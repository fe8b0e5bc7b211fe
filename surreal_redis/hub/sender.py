"""Agent side of the experience path: vectorized steps -> chunks -> one pipeline per flush.

Each env's steps fill preallocated numpy buffers; every ``flush_steps`` steps all envs' chunks go
out in one pipeline: ``SET obs:<digest> NX EX`` for observation leaves not uploaded before, then
``insert.lua`` calls (at most 64 chunks and 256 obs keys each), which write all-or-nothing and are
idempotent per (sender uuid, seq). The entry format is in :mod:`surreal_redis.hub.wire`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import redis

from surreal_redis.codec import Tree, digest, encode_array, encode_tree
from surreal_redis.connection import CONNECTION_ERRORS, Backoff
from surreal_redis.hub.wire import (
    INITIAL_STATE,
    Batch,
    Outcome,
    classify_reply,
    read_backlog,
    split_batches,
    tree_leaves,
    tree_map,
)
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SenderConfig:
    """Experience sender settings. Sizes in bytes, times in seconds.

    ``flush_steps``: steps per chunk (T). Observation leaves of at least ``dedup_min_bytes`` per
    env and step are stored once under ``obs:<digest>`` (others travel inline); leaves (and payload
    arrays) of at least ``compress_min_bytes`` are lz4-compressed. ``lru_size``: digests remembered
    as uploaded. ``obs_ttl_s``: lifetime of an uploaded observation no insert referenced (a crashed
    agent leaks nothing). ``seen_ttl_s``: how long the last seq of this sender is remembered.
    ``max_lag``: wait before sending while the learner has more unread entries than this on our
    shard (None or 0: never wait). ``max_wait_s``: give up (HubUnavailableError) after retrying an
    insert refused for OOM or connection errors this long; ``backpressure_timeout_s``: likewise
    for waiting on the learner (None: wait as long as it takes).
    """

    flush_steps: int = 32
    dedup_min_bytes: int = 1024
    compress_min_bytes: int = 2048
    lru_size: int = 65536
    obs_ttl_s: int = 600
    seen_ttl_s: int = 3600
    max_lag: int | None = None
    max_chunks_per_insert: int = 64
    max_obs_per_insert: int = 256
    retry_base_s: float = 0.05
    retry_cap_s: float = 2.0
    max_wait_s: float = 120.0
    backpressure_timeout_s: float | None = None

    def __post_init__(self) -> None:
        positive = ("flush_steps", "dedup_min_bytes", "compress_min_bytes", "lru_size", "obs_ttl_s",
                    "seen_ttl_s", "max_chunks_per_insert", "max_obs_per_insert", "max_wait_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"sender.{name} must be > 0, got {getattr(self, name)!r}")
        if not 1 <= self.max_chunks_per_insert <= 64:
            raise ValueError(f"sender.max_chunks_per_insert must be in 1..64, got {self.max_chunks_per_insert}")
        if not 1 <= self.max_obs_per_insert <= 256:
            raise ValueError(f"sender.max_obs_per_insert must be in 1..256, got {self.max_obs_per_insert}")
        if self.max_lag is not None and self.max_lag < 0:
            raise ValueError(f"sender.max_lag must be >= 0 or None, got {self.max_lag}")
        if not 0 < self.retry_base_s <= self.retry_cap_s:
            raise ValueError(f"need 0 < sender.retry_base_s <= retry_cap_s, got {self.retry_base_s}, {self.retry_cap_s}")
        if self.backpressure_timeout_s is not None and self.backpressure_timeout_s <= 0:
            raise ValueError(f"sender.backpressure_timeout_s must be > 0 or None, got {self.backpressure_timeout_s}")


class SenderStats(NamedTuple):
    """Cumulative sender counters (for metrics)."""

    steps: int
    chunks: int
    inserts: int
    obs_uploaded: int
    obs_lru_hits: int
    bytes_sent: int
    duplicates: int
    missing_retries: int
    oom_retries: int
    error_retries: int
    backpressure_wait_s: float
    steps_dropped: int


class HubUnavailableError(RuntimeError):
    """Redis refused or could not take an insert for longer than the configured wait."""


class _Layout(NamedTuple):
    num_envs: int
    template: Tree  # first obs tree; only its structure is used
    shapes: list[tuple[int, ...]]  # per-env shape of each obs leaf
    dtypes: list[np.dtype]
    ref: list[int]  # leaf ordinal -> position among referenced leaves, -1 if inline
    sig: list[int]  # referenced leaves with equal (dtype, shape) share a signature
    extras: tuple[str, ...]


class ExperienceSender:
    """Turns vectorized env steps into chunks and sends them to shard ``agent_id % num_shards``.

    Not thread-safe: one sender per agent process. ``add`` blocks only when it flushes (every
    ``flush_steps`` calls): for the pipeline round trip, for backpressure (``max_lag``) and for
    backoff while Redis is out of memory or unreachable.
    """

    def __init__(self, client: redis.Redis, config: SenderConfig, run: str, agent_id: int,
                 num_shards: int) -> None:
        if agent_id < 0:
            raise ValueError(f"agent_id must be >= 0, got {agent_id}")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.client, self.config, self.agent_id = client, config, agent_id
        self.shard = agent_id % num_shards
        self.keys = RunKeys(run).shard(self.shard)
        self.uuid = uuid.uuid4().hex
        self._scripts = Scripts(client)
        self._seq = 0
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._layout: _Layout | None = None
        self._t = 0  # steps stored in the current chunk
        self._carry: list[list[tuple[int, bytes, str]]] | None = None  # digests of obs row 0, per env
        self._blobs: dict[str, bytes] = {}  # digest -> encoded observation, for this flush
        self._raw: dict[str, np.ndarray] = {}  # digest -> array, when not encoded
        self._counts = dict.fromkeys(SenderStats._fields, 0)

    # ------------------------------------------------------------ public API

    def add(self, obs: Tree, actions: Any, rewards: Any, terminated: Any, truncated: Any,
            final_obs: Tree | None = None, extras: dict[str, Any] | None = None,
            policy_version: int | Any = 0) -> None:
        """Record one step of N envs.

        ``obs``: tree with leaves ``[N, ...]``, the observations the actions were chosen from.
        ``actions`` ``[N, ...]``; ``rewards``, ``terminated``, ``truncated`` ``[N]``.
        ``final_obs``: tree like ``obs`` holding, for every env whose episode ended at this step,
        the true last observation (other rows are ignored); None when no episode ended.
        ``extras``: ``{name: [N, ...]}`` per-step algorithm data, plus optionally
        ``"initial_state"``: a tree with ``[N, ...]`` leaves (recurrent state), kept only at the
        first step of each chunk. ``policy_version``: int or ``[N]``.
        Raises ValueError naming the argument whose shape or structure is wrong.
        """
        leaves = [np.asarray(leaf) for leaf in tree_leaves(obs)]
        extras = extras or {}
        if self._layout is None:
            self._allocate(obs, leaves, actions, extras)
        layout = self._layout
        T, n = self.config.flush_steps, layout.num_envs
        if len(leaves) != len(layout.shapes):
            raise ValueError(f"obs has {len(leaves)} leaves, expected {len(layout.shapes)}")
        if self._t == T:  # obs is obs_T of the full chunks: send them, it becomes obs_0 of the next
            self._store_obs(leaves, T)
            self._emit(T)
        t = self._t
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
        self._t += 1
        self._counts["steps"] += n

    def flush(self, next_obs: Tree | None = None) -> int:
        """Send the partial chunks (at shutdown); returns the number of chunks sent.

        ``next_obs`` (leaves ``[N, ...]``) is the observation that followed the last added step;
        without it that step cannot be completed and is dropped (counted in ``steps_dropped``).
        Blocks like ``add`` does when it flushes. The next ``add`` starts new chunks.
        """
        if self._layout is None or self._t == 0:
            return 0
        steps = self._t
        if next_obs is not None:
            self._store_obs([np.asarray(leaf) for leaf in tree_leaves(next_obs)], steps)
        else:
            steps -= 1
            self._counts["steps_dropped"] += self._layout.num_envs
        sent = self._emit(steps) if steps > 0 else 0
        self._t, self._carry = 0, None
        for finals in self._final:
            finals.clear()
        return sent

    def stats(self) -> SenderStats:
        return SenderStats(**self._counts)

    # ------------------------------------------------------------ buffers

    def _allocate(self, obs: Tree, leaves: list[np.ndarray], actions: Any, extras: dict[str, Any]) -> None:
        cfg = self.config
        if not leaves or any(leaf.ndim < 1 for leaf in leaves):
            raise ValueError("every obs leaf needs a leading env dimension N")
        n = leaves[0].shape[0]
        if any(leaf.shape[0] != n for leaf in leaves):
            raise ValueError(f"obs leaves disagree on N: {[leaf.shape for leaf in leaves]}")
        shapes = [leaf.shape[1:] for leaf in leaves]
        ref, sig, sigs = [], [], {}
        for leaf in leaves:
            if leaf.nbytes // n >= cfg.dedup_min_bytes:
                ref.append(sum(r >= 0 for r in ref))
                sig.append(sigs.setdefault((leaf.dtype.str, leaf.shape[1:]), len(sigs)))
            else:
                ref.append(-1)
                sig.append(-1)
        T = cfg.flush_steps
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
        self._layout = _Layout(n, obs, shapes, [leaf.dtype for leaf in leaves], ref, sig, names)

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
                     candidates: list[tuple[int, bytes, str]]) -> tuple[int, bytes, str]:
        """(sig, raw bytes, digest); frames repeated from a neighbouring step (frame stacks) are
        found by comparing raw bytes, which is much cheaper than encoding and hashing them again."""
        raw = array.tobytes()
        for other in candidates:
            if other[0] == sig and other[1] == raw:
                self._raw.setdefault(other[2], array)
                return other
        blob = encode_array(array, self.config.compress_min_bytes)
        key = digest(blob)
        self._blobs.setdefault(key, blob)
        return sig, raw, key

    def _blob(self, key: str) -> bytes:
        """The encoded observation of digest ``key`` (re-encoded when it was only matched)."""
        blob = self._blobs.get(key)
        if blob is None:
            blob = self._blobs[key] = encode_array(self._raw[key], self.config.compress_min_bytes)
        return blob

    def _build_chunks(self, steps: int) -> list[tuple[tuple[bytes, ...], list[str]]]:
        """Stream fields and referenced digests of each env's chunk of ``steps`` steps (obs rows
        0..steps). Clears the per-chunk final observations; keeps obs row ``steps`` digests."""
        layout = self._layout
        refs = [i for i, r in enumerate(layout.ref) if r >= 0]
        carry: list[list[tuple[int, bytes, str]]] = []
        chunks = []
        for env in range(layout.num_envs):
            # rows[t]: (signature, raw bytes, digest) of each referenced leaf of obs row t
            rows: list[list[tuple[int, bytes, str]]] = []
            prev = self._carry[env] if self._carry is not None else []
            for t in range(steps + 1):
                if (t == 0 and prev) or not refs:
                    for i, entry in zip(refs, prev):
                        self._raw.setdefault(entry[2], self._obs[i][env, 0])
                    rows.append(prev)
                    continue
                row: list[tuple[int, bytes, str]] = []
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

    def _chunk_fields(self, env: int, steps: int, rows: list, final_rows: dict) -> tuple[tuple[bytes, ...], list[str]]:
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
        data = encode_tree(payload, self.config.compress_min_bytes)
        digests = list(order)
        if len(digests) > self.config.max_obs_per_insert:
            raise ValueError(f"a chunk references {len(digests)} observation leaves, more than "
                             f"max_obs_per_insert={self.config.max_obs_per_insert}: lower sender.flush_steps "
                             f"(now {self.config.flush_steps})")
        fields = (str(self.agent_id).encode(), str(env).encode(), ",".join(digests).encode(), data)
        return fields, digests

    # ------------------------------------------------------------ sending

    def _remember(self, digests: list[str]) -> None:
        lru = self._lru
        for d in digests:
            lru[d] = None
            lru.move_to_end(d)
        while len(lru) > self.config.lru_size:
            lru.popitem(last=False)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _emit(self, steps: int) -> int:
        """Build and send the chunks of ``steps`` steps; the next step starts new chunks. If the
        send fails (HubUnavailableError), those steps are counted as dropped and the next chunks
        start afresh from the next added step."""
        chunks = self._build_chunks(steps)
        self._t = 0
        try:
            self._send(chunks)
        except BaseException:
            self._carry = None
            self._counts["steps_dropped"] += steps * len(chunks)
            raise
        finally:
            self._blobs.clear()
            self._raw.clear()
        return len(chunks)

    def _send(self, chunks: list[tuple[tuple[bytes, ...], list[str]]]) -> None:
        """Insert all chunks (one pipeline per attempt); retries until stored or max_wait_s."""
        cfg = self.config
        self._wait_for_learner()
        pending = split_batches(chunks, cfg.max_chunks_per_insert, cfg.max_obs_per_insert, self._next_seq)
        for batch in pending:
            batch.upload = [d for d in batch.digests if d not in self._lru]
            self._counts["obs_lru_hits"] += len(batch.digests) - len(batch.upload)
        backoff = Backoff(cfg.retry_base_s, cfg.retry_cap_s)
        deadline = None
        attempts = 0
        while pending:
            retry, error = self._attempt(pending)
            pending = [batch for batch, _ in retry]
            attempts += 1
            if not pending:
                break
            # Re-uploading missing obs or loading the script is retried at once, but only once.
            if attempts > 1 or error is not None or any(kind is Outcome.BACKOFF for _, kind in retry):
                now = time.monotonic()
                deadline = deadline or now + cfg.max_wait_s
                if now > deadline:
                    raise HubUnavailableError(
                        f"shard {self.shard}: {len(pending)} inserts not stored after {cfg.max_wait_s}s "
                        f"(sender.max_wait_s); last error: {error}")
                time.sleep(backoff.next_delay())

    def _attempt(self, batches: list[Batch]) -> tuple[list[tuple[Batch, Outcome]], BaseException | None]:
        """One pipeline: uploads, then the inserts. Returns the batches to retry and why."""
        keys, sent = self.keys, set()
        pipe = self.client.pipeline(transaction=False)
        nbytes = 0
        for batch in batches:
            for d in batch.upload:
                if d not in sent:
                    sent.add(d)
                    blob = self._blob(d)
                    nbytes += len(blob)
                    pipe.set(keys.obs(d), blob, nx=True, ex=self.config.obs_ttl_s)
        sha = self._scripts.get("insert").sha
        for batch in batches:
            args = [batch.seq, self.config.seen_ttl_s, len(batch.chunks)]
            for fields in batch.chunks:
                args.extend(fields)
                nbytes += sum(len(f) for f in fields)
            obs_keys = [keys.obs(d) for d in batch.digests]
            pipe.evalsha(sha, 3 + len(obs_keys), keys.exp, keys.obsref, keys.seen(self.uuid), *obs_keys, *args)
        try:
            replies = pipe.execute(raise_on_error=False)
        except CONNECTION_ERRORS as exc:
            # Unknown outcome: resend the same seqs; whatever was stored answers DUP.
            self._counts["error_retries"] += 1
            log.warning("shard %d: insert pipeline failed (%s); retrying", self.shard, exc)
            return [(b, Outcome.BACKOFF) for b in batches], exc
        self._counts["bytes_sent"] += nbytes
        self._counts["obs_uploaded"] += sum(r is True for r in replies[: len(sent)])
        retry: list[tuple[Batch, Outcome]] = []
        # A refused upload (OOM) shows up as MISSING in its insert; keep the reason for the error.
        error = next((r for r in replies[: len(sent)] if isinstance(r, Exception)), None)
        for batch, reply in zip(batches, replies[len(sent):]):
            kind, detail = classify_reply(reply)
            if kind is Outcome.DONE:
                self._counts["inserts"] += 1
                self._counts["chunks"] += len(batch.chunks)
                self._counts["duplicates"] += detail == "DUP"
                self._remember(batch.digests)
                continue
            if kind is Outcome.RELOAD:
                try:
                    self.client.script_load(self._scripts.get("insert").script)
                except redis.ResponseError as exc:  # agents may lack SCRIPT LOAD: the learner loads it
                    kind, error = Outcome.BACKOFF, exc
                    log.info("shard %d: cannot load insert.lua (%s); backing off", self.shard, exc)
            elif kind is Outcome.MISSING:
                self._counts["missing_retries"] += 1
                batch.upload = list(detail)
                for d in detail:
                    self._lru.pop(d, None)
            else:
                self._counts["oom_retries" if "OOM" in str(detail) else "error_retries"] += 1
                error = detail
                log.info("shard %d: insert refused (%s); backing off", self.shard, detail)
            # Nothing of this batch was written, but later batches of this pipeline may have been:
            # a fresh seq keeps it from being mistaken for a duplicate of theirs.
            batch.seq = self._next_seq()
            retry.append((batch, kind))
        return retry, error

    def _wait_for_learner(self) -> None:
        """Block while the learner's unread backlog on our shard exceeds max_lag."""
        cfg = self.config
        if not cfg.max_lag:
            return
        backoff = Backoff(cfg.retry_base_s, cfg.retry_cap_s)
        start = time.monotonic()
        while True:
            try:
                unread = read_backlog(self.client, self.keys, cfg.max_lag + 1).unread
            except CONNECTION_ERRORS as exc:
                log.warning("shard %d: backlog check failed (%s); retrying", self.shard, exc)
                unread = None
            if unread is not None and unread <= cfg.max_lag:
                break
            waited = time.monotonic() - start
            if cfg.backpressure_timeout_s is not None and waited > cfg.backpressure_timeout_s:
                raise HubUnavailableError(
                    f"shard {self.shard}: learner backlog {unread} > max_lag {cfg.max_lag} for "
                    f"{waited:.1f}s (sender.backpressure_timeout_s)")
            time.sleep(backoff.next_delay())
        self._counts["backpressure_wait_s"] += time.monotonic() - start
