"""Experience path on fakeredis: sender -> insert.lua -> receiver, dedup, routing, eviction."""

import threading
import time

import numpy as np
import pytest
import redis

from surreal_redis.hub.experience import payload as pl
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, JanitorStats, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, HubUnavailableError, SenderConfig
from surreal_redis.hub.experience.wire import WireError, parse_entry, sender_tag
from surreal_redis.keys import CONSUMER_GROUP, RunKeys
from surreal_redis.scripts import Scripts

RUN = "unit"
N = 3
T = 4


def moved(client, num_shards: int = 1) -> None:
    """Move the agents' queued batches into the streams, as the learner's receiver does."""
    for keys in RunKeys(RUN).shards(num_shards):
        assert move_inbox(Scripts(client), keys).left == 0


def frame(i: int) -> np.ndarray:
    """A distinct, compressible 84x84 frame for every integer."""
    f = np.zeros((84, 84), np.uint8)
    f[i % 84, :] = 255
    f[:, (i // 84) % 84] = i % 251
    return f


def atari_obs(step: int) -> dict:
    """4-frame stacks (one new frame per step and env) plus a small inline vector."""
    pix = tuple(np.stack([frame(1000 * env + step + k) for env in range(N)]) for k in range(4))
    vec = np.stack([np.array([step, env, 0.5], np.float32) for env in range(N)])
    return {"pix": pix, "vec": vec}


def run_episode_steps(sender: ExperienceSender, steps: int, record: list) -> dict:
    """Add ``steps`` steps with episode ends mid-chunk; returns the obs that follows the last."""
    for step in range(steps):
        obs = atari_obs(step)
        terminated = np.array([step == 2, False, False])
        truncated = np.array([False, step == 5, False])
        final = None
        if (terminated | truncated).any():  # the true last stack: 3 frames of obs, one new frame
            final = atari_obs(step + 1)
            final["pix"] = final["pix"][:3] + (np.stack([frame(50_000 + step)] * N),)
        actions = np.arange(N, dtype=np.int64) + step
        extras = {"logp": np.full(N, -step, np.float32), "value": np.full(N, step * 0.1, np.float32),
                  "initial_state": {"h": np.full((N, 2), step, np.float32)}}
        sender.add(obs, actions, np.full(N, step, np.float32), terminated, truncated, final, extras, 7)
        record.append((obs, actions, terminated, truncated, final))
    return atari_obs(steps)


def assert_tree_equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_tree_equal(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_tree_equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def index(tree, i):
    if isinstance(tree, dict):
        return {k: index(v, i) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(index(v, i) for v in tree)
    return tree[i]


def chunk_payload(terminated: list[bool], ref: bool = False) -> bytes:
    """A well-formed payload of one obs leaf (a referenced 84x84 frame or 2 inline floats)."""
    leaf = pl.Leaf(np.dtype(np.uint8), (84, 84), True) if ref else pl.Leaf(np.dtype("<f4"), (2,), False)
    layout = pl.Layout.create(np.zeros(1), [leaf], (np.dtype("<f8"), ()), [], None)
    steps = len(terminated)
    arrays = {pl.OBS: np.zeros(steps + 1, np.uint8) if ref else np.zeros((steps + 1, 2), "<f4"),
              pl.FINAL: np.zeros(0, np.uint8) if ref else np.zeros((0, 2), "<f4"),
              pl.ACTIONS: np.zeros(steps), pl.REWARDS: np.zeros(steps, "<f4"),
              pl.TERMINATED: np.array(terminated), pl.TRUNCATED: np.zeros(steps, bool),
              pl.VERSION: np.zeros(1, "<i8")}
    return pl.encode(layout, steps, 0, lambda slot: arrays[slot.group], True, None)


@pytest.mark.parametrize("apart", [None, 1], ids=["payloads-inline", "payloads-apart"])
def test_round_trip_vectorized_with_episode_ends_and_extras(fake_redis, apart):
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T, payload_ref_min_bytes=apart), RUN, 4, 1)
    record: list = []
    next_obs = run_episode_steps(sender, 10, record)
    assert sender.flush(next_obs) == N
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    received = receiver.receive(100, block_ms=0)
    assert len(received) == 3 * N  # chunks of 4, 4 and 2 steps per env
    fields = [set(f) for _, f in fake_redis.xrange(RunKeys(RUN).shard(0).exp)]
    assert fields == [{b"a", b"e", b"o", b"p" if apart else b"d", b"s"}] * 3 * N
    assert sender.stats().payloads_stored == (3 * N if apart else 0)
    by_env: dict[int, list] = {}
    for item in received:
        assert item.chunk.agent_id == 4
        by_env.setdefault(item.chunk.env_index, []).append(item.chunk)
    for env, chunks in by_env.items():
        assert [c.num_steps for c in chunks] == [4, 4, 2]
        start = 0
        for c in chunks:
            for t in range(c.num_steps):
                obs, actions, terminated, truncated, final = record[start + t]
                assert_tree_equal(index(c.obs, t), index(obs, env))
                assert c.actions[t] == actions[env]
                assert c.terminated[t] == terminated[env] and c.truncated[t] == truncated[env]
                if terminated[env] or truncated[env]:
                    assert_tree_equal(c.final_obs[t], index(final, env))
                    assert_tree_equal(c.next_obs(t), index(final, env))
            assert sorted(c.final_obs) == np.flatnonzero(c.terminated | c.truncated).tolist()
            assert c.rewards.dtype == np.float32 and c.policy_version.tolist() == [7] * c.num_steps
            np.testing.assert_array_equal(c.extras["logp"], -np.arange(start, start + c.num_steps))
            np.testing.assert_array_equal(c.extras["initial_state"]["h"], [start, start])
            last = record[start + c.num_steps][0] if start + c.num_steps < 10 else next_obs
            assert_tree_equal(index(c.obs, c.num_steps), index(last, env))
            start += c.num_steps
    # termination and truncation stay apart
    env0 = by_env[0][0]
    assert env0.terminated.tolist() == [False, False, True, False] and not env0.truncated.any()
    env1 = by_env[1][1]
    assert env1.truncated.tolist() == [False, True, False, False] and not env1.terminated.any()
    assert receiver.ack(received) == len(received)
    stats = receiver.stats()
    assert stats.chunks == 9 and stats.steps == N * 10 and stats.dead == 0


def test_frame_stacks_upload_one_new_frame_per_step(fake_redis):
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T), RUN, 0, 1)
    run_episode_steps(sender, 13, [])
    keys = RunKeys(RUN).shard(0)
    # 3 full flushes cover obs rows 0..12: 4 frames for row 0, then one new frame per row and env,
    # plus one new frame for each of the 2 final observations.
    expected = N * (4 + 12) + 2
    assert sender.stats().obs_uploaded == expected
    assert len(fake_redis.keys(keys.obs_prefix + "*")) == expected
    assert fake_redis.scard(keys.pinned) == expected + 3  # queued: gc spares them (and 3 batches' door pins)
    moved(fake_redis)
    assert fake_redis.zcard(keys.obsref) == expected and not fake_redis.exists(keys.pinned)
    # the boundary row of each chunk (obs_T = obs_0 of the next) is referenced by both entries
    entries = fake_redis.xrange(keys.exp)
    first, second = (set(e[1][b"o"].split(b",")) for e in entries[:N * 2: N])
    assert len(first & second) == 4


def test_frames_in_a_reused_buffer_and_in_strided_views_are_stored_as_they_were_added(fake_redis):
    """Frames are identified by a hash of their bytes read in place: a buffer the env overwrites
    after each step (as vector envs do) and frames passed as strided views (a slice of a bigger
    screen, a transposed array) must still arrive as they were at add(); a frame stack still
    uploads one new frame per step and env."""
    screens = np.zeros((N, 84, 168), np.uint8)  # frames are its even columns: strided views
    reused = [np.zeros((N, 84, 84), np.uint8) for _ in range(4)]
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T), RUN, 0, 1)
    added = []
    steps = 2 * T
    for step in range(steps + 1):
        for k in range(4):  # the stack shifts by one frame per step; the buffers are rewritten in place
            reused[k][:] = [frame(1000 * env + step + k) for env in range(N)]
        screens[:, :, ::2] = reused[3]
        obs = {"stack": tuple(reused), "strided": screens[:, :, ::2], "transposed": reused[2].transpose(0, 2, 1)}
        added.append({"stack": tuple(f.copy() for f in reused), "strided": reused[3].copy(),
                      "transposed": reused[2].transpose(0, 2, 1).copy()})
        if step < steps:
            sender.add(obs, np.zeros(N, np.int64), np.ones(N, np.float32), np.zeros(N, bool), np.zeros(N, bool))
    sender.flush(obs)
    # row 0: 4 stack frames (the strided one repeats frame 3, the transposed one is new); then per
    # step one new stack frame, its repeat, and one new transposed frame
    assert sender.stats().obs_uploaded == N * (5 + 2 * steps)
    chunks = [item.chunk for item in ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(100, 0)]
    assert sum(c.num_steps for c in chunks) == N * steps
    for position, c in enumerate(chunks):  # one flush after the other, env by env
        start = T * (position // N)
        for t in range(c.num_steps + 1):
            assert_tree_equal(index(c.obs, t), index(added[start + t], c.env_index))


def test_a_step_refused_after_its_frames_were_read_leaves_no_trace(fake_redis):
    """add() refuses a step (bad actions) after reading its frames: the retried step is compared
    with the step before it, not with the refused one (whose leaves 1-3 here equal the retried
    step's leaves 0-2, as a shifted stack would, while the step before holds other frames)."""
    def stack(step):
        return tuple(np.stack([frame(100 * step + 10 * env + k) for env in range(N)]) for k in range(4))

    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T), RUN, 0, 1)
    good = np.zeros(N, np.int64)
    rest = (np.ones(N, np.float32), np.zeros(N, bool), np.zeros(N, bool))
    for step in range(T):
        if step == 2:
            refused = (np.stack([frame(999)] * N),) + stack(2)[:3]
            with pytest.raises(ValueError, match="actions"):
                sender.add(refused, np.zeros((N, 2), np.int64), *rest)
        sender.add(stack(step), good, *rest)
    sender.flush(stack(T))
    chunks = [item.chunk for item in ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(100, 0)]
    assert len(chunks) == N
    for c in chunks:
        for t in range(T + 1):
            assert_tree_equal(index(c.obs, t), index(stack(t), c.env_index))


def test_equal_bytes_of_leaves_with_different_shapes_are_not_shared(fake_redis):
    """Two referenced leaves whose frames hold the same bytes but differ in shape (or dtype) are
    stored apart: each decodes to its own shape."""
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T), RUN, 0, 1)
    for step in range(T + 1):
        wide = np.stack([frame(step + env) for env in range(N)])
        obs = (wide, wide.reshape(N, 42, 168), wide.view(np.int8))
        sender.add(obs, np.zeros(N, np.int64), np.ones(N, np.float32), np.zeros(N, bool), np.zeros(N, bool))
    chunks = [item.chunk for item in ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(100, 0)]
    assert len(chunks) == N
    for c in chunks:
        square, tall, signed = c.obs
        assert square.shape[1:] == (84, 84) and tall.shape[1:] == (42, 168) and signed.dtype == np.int8
        np.testing.assert_array_equal(tall, square.reshape(-1, 42, 168))
        np.testing.assert_array_equal(signed.view(np.uint8), square)


def test_small_observations_travel_inline(fake_redis):
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T), RUN, 0, 1)
    for step in range(T + 1):
        obs = np.full((N, 4), step, np.float32)  # cartpole-sized: 16 bytes per env
        sender.add(obs, np.zeros(N, np.int64), np.ones(N), np.zeros(N, bool), np.zeros(N, bool))
    keys = RunKeys(RUN).shard(0)
    assert sender.stats().obs_uploaded == 0 and not fake_redis.keys(keys.obs_prefix + "*")
    assert all(fields[b"o"] == b"" for _, fields in fake_redis.xrange(keys.exp))
    chunk = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(10, 0)[0].chunk
    np.testing.assert_array_equal(chunk.obs[:, 0], np.arange(T + 1))


def test_lru_skips_reupload_and_missing_obs_is_reuploaded(fake_redis):
    static = np.stack([frame(5)] * N)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)

    def step():
        sender.add({"f": static}, np.zeros(N, np.int64), np.ones(N), np.zeros(N, bool), np.zeros(N, bool))

    for _ in range(3):
        step()
    assert sender.stats().obs_uploaded == 1
    for _ in range(2):
        step()
    stats = sender.stats()
    assert stats.obs_uploaded == 1 and stats.obs_lru_hits >= 1
    # a gc that ran meanwhile removed it: the insert answers MISSING and the sender re-uploads
    keys = RunKeys(RUN).shard(0)
    fake_redis.delete(*fake_redis.keys(keys.obs_prefix + "*"))
    for _ in range(2):
        step()
    stats = sender.stats()
    assert stats.missing_retries == 1 and stats.obs_uploaded == 2 and stats.inserts == 3
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    chunks = receiver.receive(100, 0)
    assert len(chunks) == 3 * N and receiver.stats().dead == 0
    assert receiver.stats().cache_misses == 1  # identical frames: one fetch, one shared array


def test_agents_route_to_shard_k_mod_s(fake_redis):
    run_keys = RunKeys(RUN)
    for agent in range(5):
        sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, agent, 3)
        for _ in range(2):
            sender.add(np.zeros((1, 2), np.float32), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    moved(fake_redis, 3)
    lengths = [fake_redis.xlen(k.exp) for k in run_keys.shards(3)]
    assert lengths == [2, 2, 1]
    agents = {int(f[b"a"]) for _, f in fake_redis.xrange(run_keys.shard(1).exp)}
    assert agents == {1, 4}


def test_partial_flush_with_and_without_next_obs(fake_redis):
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=8), RUN, 0, 1)
    zeros = np.zeros(N, bool)
    for step in range(3):
        sender.add(np.full((N, 2), step, np.float32), np.zeros(N), np.zeros(N), zeros, zeros)
    assert fake_redis.llen(keys.inbox) == 0
    assert sender.flush() == N  # without the next obs the last step cannot be completed
    assert sender.stats().steps_dropped == N
    chunks = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(100, 0)
    assert {c.chunk.num_steps for c in chunks} == {2}
    np.testing.assert_array_equal(chunks[0].chunk.obs[:, 0], [0, 1, 2])
    sender.add(np.full((N, 2), 9, np.float32), np.zeros(N), np.zeros(N), zeros, zeros)
    assert sender.flush(np.full((N, 2), 10, np.float32)) == N
    moved(fake_redis)
    assert fake_redis.xlen(keys.exp) == 2 * N
    assert sender.flush() == 0


def test_bad_input_names_the_value(fake_redis):
    with pytest.raises(ValueError, match="flush_steps"):
        SenderConfig(flush_steps=0)
    with pytest.raises(ValueError, match="max_obs_per_insert"):
        SenderConfig(max_obs_per_insert=300)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    zeros = np.zeros(N, bool)
    sender.add(np.zeros((N, 2)), np.zeros(N), np.zeros(N), zeros, zeros)
    with pytest.raises(ValueError, match="rewards has shape"):
        sender.add(np.zeros((N, 2)), np.zeros(N), np.zeros(N + 1), zeros, zeros)
    with pytest.raises(ValueError, match="final_obs is None"):
        sender.add(np.zeros((N, 2)), np.zeros(N), np.zeros(N), np.array([True, False, False]), zeros)
    with pytest.raises(ValueError, match="max_chunks"):
        ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(0)


def test_backpressure_waits_for_the_learner(fake_redis):
    config = SenderConfig(flush_steps=1, max_lag=2, retry_base_s=0.01, retry_cap_s=0.02,
                          backpressure_timeout_s=0.2)
    sender = ExperienceSender(fake_redis, config, RUN, 0, 1)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    receiver.start()

    def step():
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))

    for _ in range(3):
        step()  # 2 entries sent: backlog 2 <= max_lag, no wait
    assert sender.learner_waits == 0
    with pytest.raises(HubUnavailableError, match="max_lag"):
        step()  # the 3rd is sent, then the wait for the learner's backlog times out
    # the chunk went out before the wait: stored, not dropped
    assert sender.stats().steps_dropped == 0 and fake_redis.llen(RunKeys(RUN).shard(0).inbox) == 3
    assert sender.learner_waits == 1
    reader = threading.Timer(0.05, lambda: receiver.receive(10, 0))
    reader.start()
    started = time.monotonic()
    step()  # the 4th is sent, then it waits for the read
    reader.join()
    assert time.monotonic() - started >= 0.04
    assert sender.stats().backpressure_wait_s > 0.04 and sender.learner_waits == 2


def _failing_waits(monkeypatch, errors: list[redis.ResponseError]) -> None:
    """The next pipelined BLMOVEs reply ``errors`` (last first). An UNBLOCKED one (a failover
    demoted the primary) also makes the writes pipelined after it meet a replica (READONLY)."""
    execute = redis.client.Pipeline._execute_pipeline

    def failing(self, connection, commands, raise_on_error):
        replies = execute(self, connection, commands, raise_on_error)
        wait = next((i for i, (args, _) in enumerate(commands) if args[0] == "BLMOVE"), None)
        if errors and wait is not None:  # after the acks owed, if any
            error = errors.pop()
            replies[wait] = error
            if str(error).startswith("UNBLOCKED"):
                replies[wait + 1:] = [redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
                                      if args[0] in ("EVALSHA", "XREADGROUP") else reply
                                      for (args, _), reply in zip(commands[wait + 1:], replies[wait + 1:])]
        return replies
    monkeypatch.setattr(redis.client.Pipeline, "_execute_pipeline", failing)


def test_a_read_blocked_on_a_demoted_primary_ends_empty_and_reads_on(fake_redis, monkeypatch):
    """A failover demotes the primary the receiver blocks on: Redis ends the block with an
    UNBLOCKED error, and the move and read pipelined after it meet a replica. The receive returns
    nothing (the learner asks again), the next one reads what was sent; any other error of the
    block still propagates."""
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    assert receiver.receive(10, 0) == []  # nothing left: the next read waits first
    _failing_waits(monkeypatch, errors := [redis.ResponseError(
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)")])
    assert receiver.receive(10, 50) == [] and not errors
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    for _ in range(2):
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    assert len(receiver.receive(10, 50)) == 1
    errors.append(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        receiver.receive(10, 50)


def test_a_wait_that_failed_raises_after_the_read_beside_it_is_taken(fake_redis, monkeypatch):
    """The wait, the move and the read share a round trip: when the wait fails (here WRONGTYPE)
    the read beside it may still have delivered entries. They are taken before the error is
    raised, so the next receive returns them (not left pending until the claim pass)."""
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    assert receiver.receive(10, 0) == []  # nothing left: the next read waits first
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    for _ in range(2):
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    _failing_waits(monkeypatch, [redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")])
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        receiver.receive(10, 50)
    assert len(receiver.receive(10, 0)) == 1


def test_acks_left_for_later_stay_owed_through_a_lost_reply_and_a_demoted_wait(fake_redis, monkeypatch):
    """The learner's ``ack(later=True)``: a connection error while the acks owed from before are
    sent leaves them and the new ones owed (the error raised); the next read carries them all. A
    failover's UNBLOCKED wait ends a read with its acks still owed: the next read sends them again."""
    keys = RunKeys(RUN).shard(0)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    acked: list[bytes] = []  # the ids of every XACK sent
    lost: list[Exception] = []
    execute = redis.client.Pipeline._execute_pipeline

    def recording(self, connection, commands, raise_on_error):
        if lost:
            raise lost.pop()
        acked.extend(i for args, _ in commands if args[0] == "XACK" for i in args[3:])
        return execute(self, connection, commands, raise_on_error)
    monkeypatch.setattr(redis.client.Pipeline, "_execute_pipeline", recording)

    def step():
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))

    def pending() -> int:
        return fake_redis.xpending(keys.exp, CONSUMER_GROUP)["pending"]
    for _ in range(3):
        step()  # two chunks
    first, second = receiver.receive(1, 0), receiver.receive(1, 0)
    assert receiver.ack(first, later=True) is None and acked == [] and pending() == 2
    lost.append(redis.ConnectionError("reply lost"))
    with pytest.raises(redis.ConnectionError):
        receiver.ack(second, later=True)  # the first's ack was owed: sent first, and lost
    assert pending() == 2 and acked == []
    assert receiver.receive(10, 0) == [] and pending() == 0  # the read carried both
    assert sorted(acked) == sorted([first[0].entry_id, second[0].entry_id])
    acked.clear()
    step()
    third = receiver.receive(10, 0)  # fewer than asked for: the next read waits first
    receiver.ack(third, later=True)
    _failing_waits(monkeypatch, errors := [redis.ResponseError(
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)")])
    assert receiver.receive(10, 50) == [] and not errors and acked == [third[0].entry_id]
    assert receiver.receive(10, 0) == [] and acked == [third[0].entry_id] * 2  # still owed: sent again
    assert pending() == 0 and receiver.flush_acks() == 0 and len(acked) == 2  # nothing owed now


def test_malformed_entries_go_to_the_dead_letter_stream(fake_redis):
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    zeros = np.zeros(1, bool)
    sender.add({"f": frame(1)[None]}, np.zeros(1), np.zeros(1), zeros, zeros)
    fake_redis.xadd(keys.exp, {"a": "0", "e": "0", "o": "", "d": b"not a tree"})
    fake_redis.xadd(keys.exp, {"x": "1"})
    # an episode ends but the payload holds no final observation; a digest that was never stored
    fake_redis.xadd(keys.exp, {"a": "0", "e": "0", "o": "", "d": chunk_payload([False, True])})
    fake_redis.xadd(keys.exp, {"a": "0", "e": "0", "o": "ab" * 16, "d": chunk_payload([False], ref=True)})
    sender.add({"f": frame(2)[None]}, np.zeros(1), np.zeros(1), zeros, zeros)
    sender.add({"f": frame(3)[None]}, np.zeros(1), np.zeros(1), zeros, zeros)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    good = receiver.receive(100, 0)
    assert len(good) == 2
    assert receiver.dead_by_reason == {"codec": 1, "format": 2, "missing_obs": 1}
    dead = fake_redis.xrange(keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"codec", b"format", b"format", b"missing_obs"]
    assert dead[1][1][b"f.x"] == b"1"
    pending = fake_redis.xpending(keys.exp, "learner")["pending"]
    assert pending == 2  # only the good ones, until acked
    receiver.ack(good)
    assert fake_redis.xpending(keys.exp, "learner")["pending"] == 0


def test_tampered_observation_fails_digest_verification(fake_redis):
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    zeros = np.zeros(1, bool)
    for i in range(2):
        sender.add({"f": frame(i)[None]}, np.zeros(1), np.zeros(1), zeros, zeros)
    obs_key = fake_redis.keys(keys.obs_prefix + "*")[0]
    fake_redis.set(obs_key, fake_redis.get(fake_redis.keys(keys.obs_prefix + "*")[1]))
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    assert receiver.receive(10, 0) == []
    assert receiver.dead_by_reason == {"digest_mismatch": 1}


def test_janitor_trims_by_count_counts_unread_and_collects_obs(fake_redis):
    fake_redis.config_set("stream-node-max-entries", 2)
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    zeros = np.zeros(1, bool)
    for i in range(11):
        sender.add({"f": frame(i)[None]}, np.zeros(1), np.zeros(1), zeros, zeros)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    receiver.ack(receiver.receive(4, 0))  # entries 0..3 delivered, 4..9 unread
    janitor = HubJanitor(fake_redis, RetentionConfig(max_entries=2, trim_limit=4), RUN, 1)
    stats = janitor.run_once()
    assert fake_redis.xlen(keys.exp) == 2 and stats.trimmed == 8
    assert stats.unread_dropped == 4 and janitor.unread_dropped_total == 4
    referenced = {d for _, f in fake_redis.xrange(keys.exp) for d in f[b"o"].decode().split(",")}
    stored = {keys.digest_of(k.decode()) for k in fake_redis.keys(keys.obs_prefix + "*")}
    assert stored == referenced and len(stored) == 3
    assert {m.decode() for m in fake_redis.zrange(keys.obsref, 0, -1)} == referenced
    assert janitor.run_once()._replace(calls=0) == (0,) * len(JanitorStats._fields)


def test_janitor_age_trim_keeps_unread_and_pending(fake_redis):
    fake_redis.config_set("stream-node-max-entries", 1)
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    zeros = np.zeros(1, bool)
    for i in range(6):
        sender.add({"f": frame(i)[None]}, np.zeros(1), np.zeros(1), zeros, zeros)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    delivered = receiver.receive(3, 0)
    time.sleep(0.01)
    janitor = HubJanitor(fake_redis, RetentionConfig(max_entries=None, max_age_s=0.001), RUN, 1)
    assert janitor.run_once().trimmed == 0  # delivered but not acked: the learner may still die
    receiver.ack(delivered[:2])
    stats = janitor.run_once()
    assert stats.unread_dropped == 0 and stats.trimmed == 2  # the oldest pending entry stays
    assert fake_redis.xrange(keys.exp)[0][0] == delivered[-1].entry_id
    receiver.ack(delivered[2:])
    assert janitor.run_once().trimmed == 0  # and so does the last delivered one


def chunk_key(chunk) -> tuple:
    return chunk.agent_id, chunk.env_index, float(chunk.obs["f"][0].sum()), chunk.num_steps


def test_read_retained_reads_every_shard_oldest_first_without_touching_the_group(fake_redis):
    run_keys = RunKeys(RUN)
    zeros = np.zeros(2, bool)
    senders = [ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, agent, 2) for agent in (0, 1)]
    for step in range(6):
        for agent, sender in enumerate(senders):
            frames = np.stack([frame(100 * agent + 10 * env + step) for env in range(2)])
            sender.add({"f": frames}, np.zeros(2), np.ones(2), zeros, zeros, policy_version=step)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(retained_batch=3), RUN, 2)
    received = receiver.receive(6, 0)
    receiver.ack(received[:4])  # 4 acked, 2 pending, the rest unread
    fake_redis.xadd(run_keys.shard(1).exp, {"a": "1", "e": "0", "o": "", "d": b"garbage"})
    ids = sorted(((i, s) for s in (0, 1) for i, _ in fake_redis.xrange(run_keys.shard(s).exp)),
                 key=lambda x: tuple(map(int, x[0].split(b"-"))))
    pending_before = [fake_redis.xpending(k.exp, "learner")["pending"] for k in run_keys.shards(2)]
    retained = list(receiver.read_retained())
    assert len(retained) == 20 and receiver.stats().retained == 20
    # merged by entry id across shards: entries of the same agent come in the order they were sent
    order = [c.agent_id for c in retained]
    assert order == [s for _, s in ids][:-1]  # the malformed (newest) entry is skipped
    for agent in (0, 1):
        for env in (0, 1):
            mine = [c for c in retained if (c.agent_id, c.env_index) == (agent, env)]
            assert [c.policy_version.tolist() for c in mine] == [[s] for s in range(5)]
            for step, c in enumerate(mine):
                np.testing.assert_array_equal(c.obs["f"][0], frame(100 * agent + 10 * env + step))
                np.testing.assert_array_equal(c.obs["f"][1], frame(100 * agent + 10 * env + step + 1))
    # decoded exactly like receive()
    by_key = {chunk_key(c) for c in retained}
    assert {chunk_key(item.chunk) for item in received} <= by_key
    assert receiver.stats().retained_skipped == 1 and receiver.skipped_by_reason == {"codec": 1}
    assert receiver.stats().dead == 0 and not fake_redis.exists(run_keys.shard(1).dead)
    assert [fake_redis.xpending(k.exp, "learner")["pending"] for k in run_keys.shards(2)] == pending_before
    assert len(receiver.receive(100, 0)) == 20 - 6  # the unread ones are still delivered
    assert receiver.stats().dead == 1  # ... and the malformed one is set aside there, once


def test_read_retained_stops_at_max_entries_and_at_the_start_snapshot(fake_redis):
    zeros = np.zeros(1, bool)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    for step in range(8):
        sender.add({"f": frame(step)[None]}, np.zeros(1), np.ones(1), zeros, zeros, policy_version=step)
    moved(fake_redis)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(retained_batch=2), RUN, 1)
    assert [c.policy_version[0] for c in receiver.read_retained(max_entries=3)] == [0, 1, 2]
    assert list(receiver.read_retained(max_entries=0)) == []
    with pytest.raises(ValueError, match="max_entries"):
        list(receiver.read_retained(max_entries=-1))
    reader = receiver.read_retained()
    first = next(reader)
    for step in range(8, 12):  # sent while reading: left to receive()
        sender.add({"f": frame(step)[None]}, np.zeros(1), np.ones(1), zeros, zeros, policy_version=step)
    assert [first.policy_version[0]] + [c.policy_version[0] for c in reader] == list(range(7))
    assert not fake_redis.exists(RunKeys(RUN).shard(0).dead)


def test_start_removes_consumers_with_nothing_pending(fake_redis):
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    zeros = np.zeros(1, bool)
    for step in range(4):
        sender.add(np.full((1, 2), step, np.float32), np.zeros(1), np.ones(1), zeros, zeros)
    done = ExperienceReceiver(fake_redis, ReceiverConfig(consumer="done"), RUN, 1)
    taken = done.receive(1, 0)
    busy = ExperienceReceiver(fake_redis, ReceiverConfig(consumer="busy"), RUN, 1)
    busy.receive(1, 0)  # still pending, and not idle long enough to be claimed
    me = ExperienceReceiver(fake_redis, ReceiverConfig(consumer="me"), RUN, 1)
    me.ack(me.receive(1, 0))  # our own consumer stays even with nothing pending
    assert busy.stats().consumers_removed == me.stats().consumers_removed == 0  # "done" had one pending
    done.ack(taken)
    fresh = ExperienceReceiver(fake_redis, ReceiverConfig(consumer="me"), RUN, 1)
    fresh.ack(fresh.receive(10, 0))
    assert fresh.stats().consumers_removed == 1
    names = {c["name"] for c in fake_redis.xinfo_consumers(keys.exp, "learner")}
    assert names == {b"busy", b"me"}
    assert fake_redis.xpending(keys.exp, "learner")["pending"] == 1


def test_atari_like_frame_stacks_with_resets_round_trip_exactly(fake_redis):
    from harness.bench_data import index_tree, obs_bytes, synthetic_trajectory

    traj = synthetic_trajectory("atari", num_envs=2, steps=260, seed=3)  # episodes end (~200 steps)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=16), RUN, 0, 1)
    for step in traj.steps:
        sender.add(step.obs, step.actions, step.rewards, step.terminated, step.truncated, step.final_obs,
                   policy_version=3)
    sender.flush(traj.last_obs)
    assert sender.stats().obs_uploaded < 2 * 260 * 1.1  # about one new frame per step and env
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    chunks = [item.chunk for item in receiver.receive(1000, 0)]
    assert receiver.stats().dead == 0 and sum(c.num_steps for c in chunks) == 2 * 260
    ended = 0
    for env in (0, 1):
        t0 = 0
        for c in [c for c in chunks if c.env_index == env]:
            for t in range(c.num_steps):
                assert obs_bytes(index_tree(c.obs, t)) == obs_bytes(index_tree(traj.steps[t0 + t].obs, env))
                assert obs_bytes(c.next_obs(t)) == obs_bytes(traj.next_obs(t0 + t, env))
                ended += bool(c.terminated[t])
            assert all(not leaf.flags.writeable for leaf in c.obs)  # shared frames are read-only
            t0 += c.num_steps
    assert ended >= 1


def test_split_batches_bounds_calls_and_uploads_each_blob_once():
    from surreal_redis.hub.experience.insert import split_batches

    seqs = iter(range(1, 100))
    sizes = {"a": 100, "b": 100, "c": 100, "d": None}  # d is known to be stored
    chunks = [((b"x" * 10,), ["a", "b"]), ((b"x" * 10,), ["b", "c", "d"]), ((b"x" * 500,), ["c"]),
              ((b"x" * 10,), ["a"])]
    batches = split_batches(chunks, max_chunks=64, max_obs=256, max_bytes=400, upload_size=sizes.get,
                            next_seq=lambda: next(seqs))
    assert [b.seq for b in batches] == [1, 2, 3]
    assert [len(b.chunks) for b in batches] == [2, 1, 1]  # the 500-byte chunk goes alone
    assert [b.upload for b in batches] == [["a", "b", "c"], [], []]  # each blob once, first batch
    assert batches[0].digests == ["a", "b", "c", "d"] and batches[0].nbytes == 20 + 300
    assert batches[1].digests == ["c"] and batches[2].digests == ["a"]
    assert batches[0].keys_order() == ["a", "b", "c", "d"]
    counted = split_batches(chunks, max_chunks=1, max_obs=3, max_bytes=1 << 20, upload_size=sizes.get,
                            next_seq=lambda: 0)
    assert [len(b.chunks) for b in counted] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="more than 2"):
        split_batches([((b"",), ["a", "b", "c"])], 64, 2, 1 << 20, sizes.get, lambda: 0)


def test_small_insert_byte_bound_splits_flushes_and_loses_nothing(fake_redis):
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=T, max_insert_bytes=2000), RUN, 0, 1)
    record: list = []
    next_obs = run_episode_steps(sender, 8, record)
    sender.flush(next_obs)
    assert sender.stats().inserts == 2 * N  # each chunk (with its new frames) alone, not 1 call per flush
    chunks = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1).receive(100, 0)
    assert sorted((c.chunk.env_index, int(c.chunk.extras["logp"][0])) for c in chunks) == \
        sorted((env, -step) for env in range(N) for step in (0, 4))
    for item in chunks:
        c = item.chunk
        start = -int(c.extras["logp"][0])
        for t in range(c.num_steps):
            assert_tree_equal(index(c.obs, t), index(record[start + t][0], c.env_index))


def test_obs_keys_match_obs_and_validate_every_digest():
    keys = RunKeys(RUN).shard(2)
    digests = ["ab" * 16, "cd" * 16]
    assert keys.obs_keys(digests) == [keys.obs(d) for d in digests]
    with pytest.raises(ValueError, match="invalid observation digest 'XY'"):
        keys.obs_keys(digests + ["XY"])


def test_read_retained_delivered_only_then_receive_gives_each_entry_once(fake_redis):
    """A restarted learner refills replay from what the group was given (acking what a dead
    learner left pending), then receives the rest: every entry exactly once."""
    zeros = np.zeros(1, bool)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    for step in range(10):
        sender.add({"f": frame(step)[None]}, np.zeros(1), np.ones(1), zeros, zeros, policy_version=step)
    dead = ExperienceReceiver(fake_redis, ReceiverConfig(consumer="learner"), RUN, 1)
    dead.ack(dead.receive(4, 0))  # 4 stored and acked
    dead.receive(2, 0)  # 2 read, never stored: pending
    fresh = ExperienceReceiver(fake_redis, ReceiverConfig(consumer="learner", claim_min_idle_ms=0), RUN, 1)
    refilled = [int(c.policy_version[0]) for c in fresh.read_retained(delivered_only=True)]
    assert refilled == list(range(6))
    assert fake_redis.xpending(RunKeys(RUN).shard(0).exp, "learner")["pending"] == 0
    rest = [int(item.chunk.policy_version[0]) for item in fresh.receive(100, 0)]
    assert rest == list(range(6, 9))  # the 10th step waits for its next observation
    assert sorted(refilled + rest) == list(range(9))


def test_read_retained_delivered_only_without_a_group_reads_nothing(fake_redis):
    zeros = np.zeros(1, bool)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    for step in range(3):
        sender.add({"f": frame(step)[None]}, np.zeros(1), np.ones(1), zeros, zeros)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    assert list(receiver.read_retained(delivered_only=True)) == []
    assert len(receiver.receive(10, 0)) == 2


@pytest.mark.parametrize("value", [b"-1", b"+1", b" 1", b"1 ", b"1_000", b"01", b"1.0", b"", b"2147483648", "1"])
def test_entry_ids_must_be_plain_non_negative_integers(value):
    payload = chunk_payload([False])
    for field in (b"a", b"e"):
        fields = {b"a": b"0", b"e": b"0", b"o": b"", b"d": payload, field: value}
        with pytest.raises(WireError, match=f"field {field.decode()} .* not a non-negative integer"):
            parse_entry(fields)
    entry = parse_entry({b"a": b"2147483647", b"e": b"0", b"o": b"", b"d": payload})
    assert (entry.agent_id, entry.env_index) == (2**31 - 1, 0)


@pytest.mark.parametrize("field, value", [("payload_ref_min_bytes", 0), ("payload_ref_min_bytes", -5),
                                          ("max_obs_per_insert", 257)])
def test_sender_config_names_the_bad_value(field, value):
    with pytest.raises(ValueError, match=field):
        SenderConfig(**{field: value})


@pytest.mark.parametrize("field, value", [("cache_bytes", -1), ("max_obs_bytes", 0), ("claim_every_s", -1.0),
                                          ("retry_base_s", 0.0), ("retry_cap_s", 0.01)])
def test_receiver_config_names_the_bad_value(field, value):
    with pytest.raises(ValueError, match=field):
        ReceiverConfig(**{field: value})


# ---------------------------------------------------------------- what the learner consumed, across a failover

def vector_steps(sender: ExperienceSender, first: int, count: int) -> None:
    """``count`` steps of 2 envs whose observations name (step, env): every chunk is distinct."""
    zeros = np.zeros(2, bool)
    for step in range(first, first + count):
        sender.add(np.array([[step, 0], [step, 1]], np.float32), np.zeros(2), np.ones(2), zeros, zeros)


def chunk_identity(item) -> tuple[int, float]:
    return item.chunk.env_index, float(item.chunk.obs[0, 0])


def drain_acked(receiver: ExperienceReceiver) -> list:
    got = []
    while batch := receiver.receive(100, 0):
        receiver.ack(batch)
        got += batch
    return got


def test_a_promoted_replica_holding_the_lost_tail_delivers_each_chunk_to_the_feed_once(fake_redis, tmp_path):
    """The primary moved, delivered and acked 6 chunks, then died; the promoted replica still
    holds their batches in its inbox (and no dedup window). The learner, resumed with its consumed
    window (through a weights-only checkpoint), drops all 6 and takes the sender's next ones."""
    from surreal_redis.checkpoint import CheckpointConfig, CheckpointManager
    from surreal_redis.testing.fakes import fake_redis as new_fake_redis

    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    vector_steps(sender, 0, 7)  # 3 batches of 2 chunks
    replica_inbox = fake_redis.lrange(keys.inbox, 0, -1)  # what the replica got before it lagged
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    first = drain_acked(receiver)
    assert len(first) == 6 and all(item.origin.sender == sender_tag(sender.uuid) for item in first)
    checkpoints = CheckpointManager(tmp_path, CheckpointConfig())
    state = checkpoints.load(checkpoints.save({"consumed": receiver.consumed_state()}, 1))

    promoted = new_fake_redis()  # the replica: the batches queued, nothing moved
    promoted.rpush(keys.inbox, *replica_inbox)
    unaware = ExperienceReceiver(promoted, ReceiverConfig(consumer="unaware"), RUN, 1)
    assert len(unaware.receive(100, 0)) == 6  # what the learner trained on twice before
    promoted.delete(*promoted.keys("*"))
    promoted.rpush(keys.inbox, *replica_inbox)
    resumed = ExperienceReceiver(promoted, ReceiverConfig(), RUN, 1)
    resumed.load_consumed(state["consumed"])
    sender.client = promoted
    sender._scripts = Scripts(promoted)
    vector_steps(sender, 7, 2)  # one more batch of the same sender, after the failover
    second = drain_acked(resumed)
    identities = [chunk_identity(item) for item in first + second]
    assert len(identities) == len(set(identities)) == 8  # every chunk handed out exactly once
    assert [item.origin.seq for item in second] == [4, 4]
    assert resumed.stats().duplicates_consumed == 6 and resumed.stats().chunks == 2
    assert promoted.xpending(keys.exp, CONSUMER_GROUP)["pending"] == 0  # the dropped copies are acked


def test_a_copy_of_a_chunk_in_flight_stays_pending_until_the_chunk_is_acked(fake_redis):
    """Delivered again while the first copy is handed out and not acked: the copy is dropped but
    kept pending (a learner stopping before its ack gets the chunk back); acking the chunk acks it."""
    keys = RunKeys(RUN).shard(0)
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    vector_steps(sender, 0, 3)
    queued = fake_redis.lrange(keys.inbox, 0, -1)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    held = receiver.receive(100, 0)
    assert len(held) == 2
    fake_redis.delete(keys.seen)  # a failover took move.lua's dedup window: the batch is stored again
    fake_redis.rpush(keys.inbox, *queued)
    assert receiver.receive(100, 0) == [] and receiver.stats().duplicates_consumed == 2
    assert fake_redis.xpending(keys.exp, CONSUMER_GROUP)["pending"] == 4
    receiver.ack(held)
    assert fake_redis.xpending(keys.exp, CONSUMER_GROUP)["pending"] == 0
    fake_redis.delete(keys.seen)
    fake_redis.rpush(keys.inbox, *queued)  # once more, now that the chunks are consumed
    assert receiver.receive(100, 0) == [] and receiver.stats().duplicates_consumed == 4
    assert fake_redis.xpending(keys.exp, CONSUMER_GROUP)["pending"] == 0


def test_an_agent_restarted_under_the_same_id_is_a_new_sender(fake_redis):
    """A restarted agent's sender draws a new uuid and starts at seq 1 again: nothing it sends is
    taken for a chunk consumed before."""
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    before = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    vector_steps(before, 0, 5)  # 2 batches of 2 chunks (the 5th step waits for its next observation)
    after = ExperienceSender(fake_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    vector_steps(after, 0, 5)  # the same observations, steps and agent id
    got = drain_acked(receiver)
    assert before.uuid != after.uuid and len(got) == 8 and receiver.stats().duplicates_consumed == 0
    assert sorted(item.origin.seq for item in got) == [1, 1, 1, 1, 2, 2, 2, 2]


def test_consumed_window_ranges_gaps_and_bounds():
    from surreal_redis.hub.experience.consumed import ConsumedWindow
    from surreal_redis.hub.experience.wire import Origin

    window = ConsumedWindow(max_senders=2, max_ranges=2, max_partial=2)
    for seq in (1, 2, 5, 3):  # 4 missing: ranges [1, 3] and [5, 5]
        window.add(Origin("aa", seq, 1, 1))
    assert [window.seen(Origin("aa", s, 1, 1)) for s in range(1, 7)] == [True, True, True, False, True, False]
    window.add(Origin("aa", 7, 1, 1))  # a third range: the oldest gap (4) is closed
    assert window.seen(Origin("aa", 4, 1, 1)) and window.stats().gaps_closed == 1
    window.add(Origin("aa", 9, 2, 3))  # batches 9 and 10 partly consumed
    window.add(Origin("aa", 10, 1, 2))
    assert window.seen(Origin("aa", 9, 2, 3)) and not window.seen(Origin("aa", 9, 1, 3))
    window.add(Origin("aa", 11, 1, 2))  # a third partial batch: the oldest (9) counts as complete
    assert window.seen(Origin("aa", 9, 3, 3)) and window.stats().partial_closed == 1
    window.add(Origin("aa", 10, 2, 2))
    assert window.seen(Origin("aa", 10, 1, 2)) and not window.seen(Origin("aa", 11, 2, 2))
    restored = ConsumedWindow(max_senders=2, max_ranges=2, max_partial=2)
    restored.load_state_dict(window.state_dict())
    assert restored.state_dict() == window.state_dict()
    window.add(Origin("bb", 1, 1, 1))
    window.add(Origin("cc", 1, 1, 1))  # a third sender: the least recently consumed is forgotten
    assert not window.seen(Origin("aa", 1, 1, 1)) and window.stats().senders_forgotten == 1
    with pytest.raises(ValueError, match="version 1"):
        restored.load_state_dict({"senders": []})
    with pytest.raises(ValueError, match="bad sender row"):
        restored.load_state_dict({"version": 1, "senders": [["aa", [[3, 1]], []]]})
    with pytest.raises(ValueError, match="max_ranges must be >= 1, got 0"):
        ConsumedWindow(max_ranges=0)


@pytest.mark.parametrize("value", [b"", b"aa", b"aa:1:1", b"AA:1:1:1", b"aa:0:1:1", b"aa:1:2:1", b"aa:1:1:65",
                                   b"aa:1:1:1:", b"g:1:1:1", "aa:1:1:1"])
def test_entry_origin_must_be_uuid_seq_index_count(value):
    payload = chunk_payload([False])
    with pytest.raises(WireError, match="field s"):
        parse_entry({b"a": b"0", b"e": b"0", b"o": b"", b"d": payload, b"s": value})
    entry = parse_entry({b"a": b"0", b"e": b"0", b"o": b"", b"d": payload, b"s": b"ab12:7:2:3"})
    assert entry.origin == ("ab12", 7, 2, 3)


def test_a_pipelined_announcement_that_failed_is_sent_again_after_the_read_is_taken(fake_redis, monkeypatch):
    """The read's entries are ours once the pipeline ran: an error in its announcement must not
    strand them on our pending list. The read is announced again on its own, after the take."""
    sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), RUN, 1)
    assert receiver.receive(10, 0) == []
    for _ in range(2):
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    original, published = fake_redis.pipeline, []

    def pipeline(*args, **kwargs):
        pipe = original(*args, **kwargs)
        execute = pipe.execute

        def announcement_refused(*a, **k):
            announces = pipe.command_stack[-1][0][0] == "PUBLISH"  # the read's pipeline, not the ack's
            replies = execute(*a, **k)
            return replies[:-1] + [redis.ResponseError("ERR the announcement failed (simulated)")] if announces else replies
        pipe.execute = announcement_refused
        return pipe
    monkeypatch.setattr(fake_redis, "pipeline", pipeline)
    keyed = fake_redis.execute_command

    def publish_counted(*args, **kwargs):
        if args[0] == "PUBLISH":
            published.append(args[1])
        return keyed(*args, **kwargs)
    monkeypatch.setattr(fake_redis, "execute_command", publish_counted)
    got = receiver.receive(10, 0)
    assert len(got) == 1 and published == [RunKeys(RUN).shard(0).reads]
    receiver.ack(got)
    assert fake_redis.xpending(RunKeys(RUN).shard(0).exp, CONSUMER_GROUP)["pending"] == 0
