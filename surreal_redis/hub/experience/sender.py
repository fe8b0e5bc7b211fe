"""Agent side of the experience path: vectorized steps -> chunks -> one pipeline per flush.

Every ``flush_steps`` steps all envs' chunks go out in one pipeline of ``insert.lua`` calls, each
carrying the observation blobs not known stored and writing them with the batch, all-or-nothing,
into the shard's inbox; a payload of at least ``payload_ref_min_bytes`` is stored apart by the
sender's own SETNX under an id bound to its batch (:func:`~surreal_redis.hub.experience.wire.payload_id`).
The entry format is in
:mod:`surreal_redis.hub.experience.wire`; docs/concepts.md tells the whole path.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from surreal_redis.codec import Tree
from surreal_redis.connection import CONNECTION_ERRORS, Backoff, RedisClient
from surreal_redis.hub.experience.backpressure import Backpressure
from surreal_redis.hub.experience.chunker import ChunkBuffer, EncodedChunk
from surreal_redis.hub.experience.inbox import MAX_INLINE_BYTES
from surreal_redis.hub.experience.insert import (
    SEQ_WINDOW,
    Batch,
    HubUnavailableError,
    Outcome,
    StoredDigests,
    classify_reply,
    insert_pipeline,
    is_oom,
    is_replicated,
    send_commands,
    split_batches,
    split_replies,
)
from surreal_redis.hub.experience.ledger import Ledger
from surreal_redis.hub.experience.wire import payload_id, sender_tag
from surreal_redis.keys import DIGEST_CHARS, RunKeys
from surreal_redis.outage import Waiter
from surreal_redis.redis_cluster import node_name
from surreal_redis.scripts import Scripts

log = logging.getLogger(__name__)

STOP_RETRY_S = 5.0  # once stopping, an insert is retried this long at most (within the launcher's grace)


@dataclass(frozen=True)
class SenderConfig:
    """Experience sender settings. Sizes in bytes, times in seconds.

    ``flush_steps``: steps per chunk (T), sent every T steps (on-policy: a divisor of the rollout
    length). An observation leaf of at least ``dedup_min_bytes`` per env and step is stored once
    under ``obs:<digest>`` and referenced, smaller ones travel inline: the default (4 KiB)
    references images and frame-stack frames, which repeat across steps, and keeps state vectors
    (which never repeat; a key costs ~250 B of Redis memory) inline. Blobs and chunk bodies of at
    least ``compress_min_bytes`` are lz4-compressed when that shrinks them. ``lru_size``: digests
    remembered as stored (at least the latest ``lru_size / 2``). ``max_insert_bytes``: bytes per
    insert call, bounding how long one call holds the server (a bigger chunk goes alone).
    ``max_lag``: after each flush, wait while our shard has more unread entries than this less
    the other agents' flushes (``peer_chunks``), keeping its backlog within about one flush of it
    (None or 0: never wait). ``max_wait_s``: give up (HubUnavailableError) after retrying an
    insert refused for OOM or connection errors this long; ``backpressure_timeout_s``: likewise
    for the learner (None: no limit). ``payload_ref_min_bytes``: a chunk payload (without its
    referenced observations) this big or bigger is stored apart by the sender's own SETNX and
    only its id passes through the scripts, since Lua copies each byte several times; a blob
    costs ~200 B of Redis memory and the learner a round trip, so the default (16 KiB) keeps that
    under 1.5% (docs/benchmarks.md, Hub). None: inline up to 1 MiB, the bound of ``insert.lua``.
    ``wait_replica_ms`` > 0: an insert
    counts as stored only once a replica has it (``WAIT 1 <ms>`` per pipeline, else the batches
    are sent again under the same seqs, without the blobs the primary has: a primary that has them
    answers DUP and queues nothing, a promoted replica that lost them asks for their blobs), so a
    failover loses nothing reported stored, for one replication round trip per flush; senders
    stall while the primary has no replica (up to ``max_wait_s``). 0: the primary's ack suffices, and that
    tail is lost if it dies before replicating (docs/reliability.md).
    """

    flush_steps: int = 64
    dedup_min_bytes: int = 4096
    compress_min_bytes: int = 512
    lru_size: int = 65536
    max_lag: int | None = None
    max_chunks_per_insert: int = 64
    max_obs_per_insert: int = 256
    max_insert_bytes: int = 4 << 20
    retry_base_s: float = 0.05
    retry_cap_s: float = 2.0
    max_wait_s: float = 120.0
    backpressure_timeout_s: float | None = None
    payload_ref_min_bytes: int | None = 16 << 10
    wait_replica_ms: int = 0

    def __post_init__(self) -> None:
        positive = ("flush_steps", "dedup_min_bytes", "compress_min_bytes", "lru_size",
                    "max_chunks_per_insert", "max_obs_per_insert", "max_insert_bytes", "max_wait_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"sender.{name} must be > 0, got {getattr(self, name)!r}")
        for name, top in (("max_chunks_per_insert", 64), ("max_obs_per_insert", 256)):
            if getattr(self, name) > top:
                raise ValueError(f"sender.{name} must be in 1..{top}, got {getattr(self, name)}")
        if self.max_lag is not None and self.max_lag < 0:
            raise ValueError(f"sender.max_lag must be >= 0 or None, got {self.max_lag}")
        if not 0 < self.retry_base_s <= self.retry_cap_s:
            raise ValueError(f"need 0 < sender.retry_base_s <= retry_cap_s, got {self.retry_base_s}, {self.retry_cap_s}")
        if self.backpressure_timeout_s is not None and self.backpressure_timeout_s <= 0:
            raise ValueError(f"sender.backpressure_timeout_s must be > 0 or None, got {self.backpressure_timeout_s}")
        if self.payload_ref_min_bytes is not None and self.payload_ref_min_bytes <= 0:
            raise ValueError(f"sender.payload_ref_min_bytes must be > 0 or None, got {self.payload_ref_min_bytes}")
        if self.wait_replica_ms < 0:
            raise ValueError(f"sender.wait_replica_ms must be >= 0, got {self.wait_replica_ms}")


class SenderStats(NamedTuple):
    """Cumulative sender counters (for metrics). ``payloads_stored``: new payload blobs the
    sender's SETNX wrote (their bytes count in ``bytes_sent``)."""

    steps: int
    chunks: int
    inserts: int
    obs_uploaded: int
    obs_lru_hits: int
    bytes_sent: int
    missing_retries: int
    oom_retries: int
    error_retries: int
    backpressure_wait_s: float
    steps_dropped: int
    chunks_dropped: int
    payloads_stored: int = 0
    unreplicated_retries: int = 0  # pipelines sent again: no replica had them in wait_replica_ms


def shard_peer_chunks(agent_id: int, num_agents: int, num_shards: int, num_envs: int) -> int:
    """The chunks that the other agents of ``agent_id``'s shard send in one flush each: of the
    run's agents ``0 .. num_agents-1``, those of shard ``agent_id % num_shards`` other than
    ``agent_id``, each flushing ``num_envs`` chunks."""
    shard = agent_id % num_shards
    peers = sum(1 for other in range(num_agents) if other % num_shards == shard and other != agent_id)
    return peers * num_envs


class ExperienceSender:
    """Turns vectorized env steps into chunks and sends them to shard ``agent_id % num_shards``.

    Not thread-safe: one sender per agent process. ``add`` blocks only when it flushes (every
    ``flush_steps`` calls): for the round trip, for backpressure and for backoff while Redis is
    out of memory or unreachable.
    """

    def __init__(self, client: RedisClient, config: SenderConfig, run: str, agent_id: int,
                 num_shards: int, stop: Waiter | None = None, ledger: Ledger | None = None,
                 peer_chunks: int = 0) -> None:
        """``ledger``: where acknowledged batches are recorded (default: the one
        ``SURREAL_LEDGER_DIR`` names, usually none; :mod:`surreal_redis.hub.experience.ledger`).
        ``peer_chunks``: see :func:`shard_peer_chunks`; a flush waits for ``unread + peer_chunks
        <= max_lag``, so that agents woken together by one read overshoot ``max_lag`` by at most
        one flush (else their experience lags past ``replay.fifo.max_policy_lag`` and is dropped)."""
        if agent_id < 0:
            raise ValueError(f"agent_id must be >= 0, got {agent_id}")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if peer_chunks < 0:
            raise ValueError(f"peer_chunks must be >= 0, got {peer_chunks}")
        self.client, self.config, self.agent_id = client, config, agent_id
        self.admit_below = max((config.max_lag or 0) - peer_chunks, 0)
        """The unread backlog at or under which a flush goes out (``max_lag`` less ``peer_chunks``)."""
        if config.max_lag and peer_chunks >= config.max_lag:
            log.warning("agent %d: hub.sender.max_lag %d is within the flushes of the other agents of shard %d (%d "
                        "chunks): a flush waits for an empty backlog, which one flush of every agent can overshoot",
                        agent_id, config.max_lag, agent_id % num_shards, peer_chunks)
        self.stop = stop  # ends the backpressure wait (the run is stopping)
        self.shard = agent_id % num_shards
        self.keys = RunKeys(run).shard(self.shard)  # on a cluster, its inserts go to the slot's primary
        self.uuid = uuid.uuid4().hex
        self._ledger = ledger if ledger is not None else Ledger.from_environment("agent")
        self._scripts = Scripts(client)
        self._seq = 0
        self._known = StoredDigests(config.lru_size)  # observation blobs known to be stored
        self._buffer = ChunkBuffer(agent_id, config.flush_steps, config.dedup_min_bytes,
                                   config.compress_min_bytes, config.max_obs_per_insert)
        self._counts = dict.fromkeys((f for f in SenderStats._fields if f != "backpressure_wait_s"), 0)
        self._unsent: dict[int, EncodedChunk] = {}  # id(fields) -> chunk, while a flush is being sent
        self._payloads: dict[str, bytes] = {}  # id -> payload stored apart, while a flush is being sent
        self._backpressure = Backpressure(client, self.keys, config, self.admit_below, stop)

    @property
    def learner_waits(self) -> int:
        """Flushes after which the sender waited for the learner's backlog (``max_lag``): an agent
        whose sender waited pulls the learner's newest parameters before it steps on."""
        return self._backpressure.waits

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
        chunks = self._buffer.add(obs, actions, rewards, terminated, truncated, final_obs, extras,
                                  policy_version)
        self._counts["steps"] += self._buffer.num_envs
        if chunks:
            self._emit(chunks)

    def flush(self, next_obs: Tree | None = None) -> int:
        """Send the partial chunks (at shutdown); returns the number of chunks sent.

        ``next_obs`` (leaves ``[N, ...]``) is the observation that followed the last added step;
        without it that step cannot be completed and is dropped (counted in ``steps_dropped``).
        Blocks like ``add`` does when it flushes. The next ``add`` starts new chunks.
        """
        dropped = self._buffer.steps > 0 and next_obs is None
        chunks = self._buffer.finish(next_obs)
        self._counts["steps_dropped"] += self._buffer.num_envs * dropped
        if chunks:
            self._emit(chunks)
        return len(chunks)

    def stats(self) -> SenderStats:
        return SenderStats(**self._counts, backpressure_wait_s=self._backpressure.waited_s)

    def close(self) -> None:
        """Drop the connection the backpressure wait listens on; the sender stays usable."""
        self._backpressure.close()

    # ------------------------------------------------------------ sending

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _emit(self, chunks: list[EncodedChunk]) -> None:
        """Send; the chunks not stored when that fails (HubUnavailableError, a script error) are
        counted as dropped (``chunks_dropped``, ``steps_dropped``)."""
        chunks = [self._store_apart(chunk) for chunk in chunks]
        self._unsent = {id(chunk.fields): chunk for chunk in chunks}
        try:
            self._send(chunks)
        except BaseException:
            self._counts["chunks_dropped"] += len(self._unsent)
            self._counts["steps_dropped"] += sum(chunk.steps for chunk in self._unsent.values())
            raise
        finally:
            self._unsent, self._payloads = {}, {}
            self._buffer.release()
        # After the send: finished chunks do not age while the agent waits, and its next ones use
        # the parameters it pulls after the wait (``learner_waits``).
        self._backpressure.wait()

    def _store_apart(self, chunk: EncodedChunk) -> EncodedChunk:
        """The chunk with its payload replaced by a placeholder blob id when it is at least
        ``payload_ref_min_bytes``, or its fields more than ``MAX_INLINE_BYTES`` (the blob waits in
        ``_payloads``); else the chunk itself. :meth:`_bind_payloads` gives it its real id once its
        batch and position are known."""
        limit = self.config.payload_ref_min_bytes
        agent, env, refs, payload = chunk.fields
        if (limit is None or len(payload) < limit) and sum(map(len, chunk.fields)) <= MAX_INLINE_BYTES:
            return chunk  # (insert.lua refuses a chunk over MAX_INLINE_BYTES)
        blob_id = secrets.token_hex(DIGEST_CHARS // 2)
        self._payloads[blob_id] = payload
        return EncodedChunk((agent, env, refs, blob_id.encode()), [*chunk.digests, blob_id], chunk.steps)

    def _send(self, chunks: list[EncodedChunk]) -> None:
        """Insert all chunks (one pipeline per attempt); retries until stored or max_wait_s.

        A refused batch, and every batch of a pipeline whose replies were lost, is resent under the
        same seq (insert.lua answers DUP for a batch queued or stored before; move.lua drops a copy
        queued around it). At most ``SEQ_WINDOW`` seqs past the floor, the lowest unsettled seq,
        are in flight.
        """
        cfg = self.config
        known, blob, payloads = self._known, self._buffer.blob, self._payloads

        def upload_size(d: str) -> int | None:
            if d in payloads:
                return None  # stored beside the call (Batch.direct)
            if d in known:
                self._counts["obs_lru_hits"] += 1
                return None
            return len(blob(d))

        pending = split_batches([(c.fields, c.digests) for c in chunks], cfg.max_chunks_per_insert,
                                cfg.max_obs_per_insert, cfg.max_insert_bytes, upload_size, self._next_seq)
        for batch in pending:
            self._bind_payloads(batch)
            batch.direct = [d for d in batch.digests if d in payloads]
        backoff = Backoff(cfg.retry_base_s, cfg.retry_cap_s)
        deadline = None
        attempts = 0
        stop_capped = False
        while pending:
            floor = pending[0].seq  # pending stays in seq order
            window = [batch for batch in pending if batch.seq < floor + SEQ_WINDOW]
            retry, error = self._attempt(window, floor)
            settled = {id(batch) for batch in window} - {id(batch) for batch, _ in retry}
            pending = [batch for batch in pending if id(batch) not in settled]
            attempts += 1
            if not retry:
                attempts, deadline = 0, None
                backoff.reset()
                continue
            # Re-uploading missing obs or loading the script is retried at once, but only once.
            if attempts > 1 or error is not None or any(kind is Outcome.BACKOFF for _, kind in retry):
                now = time.monotonic()
                deadline = deadline or now + cfg.max_wait_s
                stopping = self.stop is not None and self.stop.is_set()
                if stopping and not stop_capped:  # the launcher kills a stopping agent after its grace
                    deadline, stop_capped = min(deadline, now + STOP_RETRY_S), True
                if now > deadline:
                    why = f"the run is stopping ({STOP_RETRY_S}s)" if stop_capped else f"{cfg.max_wait_s}s (sender.max_wait_s)"
                    raise HubUnavailableError(
                        f"shard {self.shard}: {len(pending)} inserts not stored after {why}; last error: {error}")
                if self.stop is None or stopping:
                    time.sleep(backoff.next_delay())
                else:
                    self.stop.wait(backoff.next_delay())  # a stop ends the wait: retried, then capped

    def _bind_payloads(self, batch: Batch) -> None:
        """Rename the placeholder id of each payload stored apart in ``batch`` to its bound id,
        :func:`~surreal_redis.hub.experience.wire.payload_id` of (uuid, seq, position), which
        ``move.lua`` checks: no other agent can name that blob (it never learns the uuid), and
        neither side pays for hashing the payload."""
        payloads = self._payloads
        renamed: dict[str, str] = {}
        for position, fields in enumerate(batch.chunks, 1):
            agent, env, refs, payload = fields
            placeholder = payload.decode("latin-1") if len(payload) == DIGEST_CHARS else ""
            if placeholder not in payloads:
                continue
            bound = payload_id(self.uuid, batch.seq, position)
            renamed[placeholder] = bound
            payloads[bound] = payloads.pop(placeholder)
            batch.chunks[position - 1] = (agent, env, refs, bound.encode())
            self._unsent[id(batch.chunks[position - 1])] = self._unsent.pop(id(fields))
        batch.digests = [renamed.get(d, d) for d in batch.digests]

    def _attempt(self, batches: list[Batch], floor: int) -> tuple[list[tuple[Batch, Outcome]], BaseException | None]:
        """One pipeline of inserts (:func:`insert_pipeline`); returns the batches to retry and why."""
        payloads, wait_ms = self._payloads, self.config.wait_replica_ms
        commands = insert_pipeline(self._scripts.get("insert").sha, self.keys, self.uuid, floor, batches,
                                   self._buffer.blob, payloads, wait_ms)
        node = node_name(self.client, self.keys.exp)  # the primary send_commands uses, for the ledger
        try:
            replies = send_commands(self.client, commands, self.keys.exp)
        except CONNECTION_ERRORS as exc:
            # Unknown outcome: resend the same seqs; insert.lua answers DUP for those it has.
            self._counts["error_retries"] += 1
            log.warning("shard %d: insert pipeline failed (%s); retrying", self.shard, exc)
            return [(b, Outcome.BACKOFF) for b in batches], exc
        self._counts["bytes_sent"] += sum(batch.nbytes for batch in batches)
        retry: list[tuple[Batch, Outcome]] = []
        stored_now: list[Batch] = []
        error: BaseException | None = None
        for batch, answer in zip(batches, split_replies(batches, replies)):
            self._stored_apart(batch, answer.stored_apart)
            kind, detail = classify_reply(answer.insert)
            if kind is Outcome.DONE:
                stored_now.append(batch)
                continue
            kind, why = self._before_retry(batch, kind, detail)
            if why is not None:
                error = why
            retry.append((batch, kind))  # nothing of it was written: resent under the same seq
        if wait_ms and stored_now and not is_replicated(replies[-1]):  # see SenderConfig.wait_replica_ms
            self._counts["unreplicated_retries"] += 1
            error = RuntimeError(f"no replica acknowledged the insert within {wait_ms} ms ({replies[-1]!r})")
            log.info("shard %d: %s; sending it again", self.shard, error)
            for batch in stored_now:
                self._strip_blobs(batch)
            retry += [(batch, Outcome.BACKOFF) for batch in stored_now]
            stored_now = []
        for batch in stored_now:
            self._count_stored(batch, node)
        return retry, error

    def _strip_blobs(self, batch: Batch) -> None:
        """Ready a batch the primary stored, but no replica acknowledged, for its resend: without
        its uploads and payloads stored apart, which the primary has (counted uploaded now). The
        resend is answered DUP at the door (nothing queued twice) and its WAIT covers the batch; a
        promoted replica that lost them answers MISSING, and they travel again."""
        self._counts["obs_uploaded"] += len(batch.upload)
        batch.nbytes -= sum(len(self._buffer.blob(d)) for d in batch.upload)
        batch.upload, batch.direct = [], []

    def _stored_apart(self, batch: Batch, replies: list[Any]) -> None:
        """Count the payloads of ``batch`` that its SETNX replies say are stored (1: now, 0: it was
        there, a resend); those refused (OOM) stay in ``batch.direct``, to go beside the retry."""
        stored = [d for d, reply in zip(batch.direct, replies) if isinstance(reply, int)]
        self._counts["payloads_stored"] += sum(reply for reply in replies if isinstance(reply, int))
        self._counts["bytes_sent"] += sum(len(self._payloads[d]) for d in stored)
        batch.direct = [d for d in batch.direct if d not in stored]

    def _before_retry(self, batch: Batch, kind: Outcome, detail: Any) -> tuple[Outcome, BaseException | None]:
        """Ready a refused batch for its retry; returns its outcome now, and the error to back off
        for (None: retried at once)."""
        if kind is Outcome.RELOAD:
            try:
                self._scripts.load("insert", self.keys.exp)
            except redis.ResponseError as exc:  # agents may lack SCRIPT LOAD: the learner loads it
                # INFO the first time only: the retries come every couple of seconds
                log.log(logging.DEBUG if self._counts["error_retries"] else logging.INFO,
                        "shard %d: cannot load insert.lua (%s); backing off until the learner loads it",
                        self.shard, exc)
                return Outcome.BACKOFF, exc
            return kind, None
        if kind is Outcome.MISSING:
            payloads, blob = self._payloads, self._buffer.blob
            for d in detail:  # gc collected them since they were recorded stored
                self._known.discard(d)
            # a payload goes beside the call again (an OOM refused its SETNX, or gc took it)
            batch.direct += [d for d in detail if d in payloads and d not in batch.direct]
            missing = [d for d in detail if d not in batch.upload and d not in payloads]
            batch.upload += missing
            batch.nbytes += sum(len(blob(d)) for d in missing)
            self._counts["missing_retries"] += 1
            return kind, None
        self._counts["oom_retries" if is_oom(detail) else "error_retries"] += 1
        log.info("shard %d: insert refused (%s); backing off", self.shard, detail)
        return kind, detail

    def _count_stored(self, batch: Batch, node: str | None) -> None:
        """Count a batch insert.lua stored (``node``: the cluster primary that said so)."""
        self._counts["inserts"] += 1
        self._counts["chunks"] += len(batch.chunks)
        self._ledger.acked(sender_tag(self.uuid), batch.seq, len(batch.chunks), node)
        self._counts["obs_uploaded"] += len(batch.upload)
        self._known.add([d for d in batch.digests if d not in self._payloads])
        for fields in batch.chunks:
            self._unsent.pop(id(fields), None)
