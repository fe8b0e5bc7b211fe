"""Chunk payloads stored apart, on a real redis-server: a payload of at least
``sender.payload_ref_min_bytes`` is a blob under a random id that the agent pins (SADD) and stores
(SETNX) itself, and only the id passes through insert.lua and move.lua (field ``p`` of the entry). It arrives exactly,
and no payload blob outlives its entry: not after trim and gc, not after ``gc --drop``, not when the
entry or its batch is set aside, not when the agent stops between storing it and its insert, not
when a resend that the dedup window drops stores it again."""

import numpy as np
import pytest
import redis
from support.acl_users import acl_clients

import surreal_redis.hub.experience.sender as sender_module
from surreal_redis.codec import digest
from surreal_redis.hub.experience.backlog import dedup_ratio
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.insert import pack_command, send_commands
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.experience.wire import id_score, payload_id, sender_tag
from surreal_redis.hub.run.control import RunControl
from surreal_redis.keys import RunKeys, is_digest
from surreal_redis.scripts import ScriptError, Scripts, script_source

pytestmark = pytest.mark.integration

RUN = "payloads"
KEYS = RunKeys(RUN).shard(0)
N, DIM = 2, 376  # MuJoCo Humanoid's observation: 1.5 KB of float32 per step, inline
CONFIG = SenderConfig(flush_steps=4, payload_ref_min_bytes=4096, retry_base_s=0.01)  # ~7.6 KB payloads


def humanoid_steps(sender: ExperienceSender, count: int, seed: int = 0, start: int = 0) -> list[np.ndarray]:
    """``count`` steps of N envs with random 376-float observations (env 1's episode ends every 3rd
    step); returns the observations, one [N, DIM] array per step."""
    rng = np.random.default_rng(seed)
    seen = []
    for t in range(start, start + count):
        obs = rng.standard_normal((N, DIM)).astype(np.float32)
        ended = np.array([False, t % 3 == 2])
        final = {"q": obs + 1} if ended.any() else None
        sender.add({"q": obs}, np.full(N, t, np.float32), np.full(N, t, np.float32), ended, np.zeros(N, bool),
                   final_obs=final, policy_version=t)
        seen.append(obs)
    return seen


def janitor(client: redis.Redis, max_entries: int | None) -> HubJanitor:
    """The learner's janitor without the orphan sweep (the learner's ACL user may not SCAN): every
    blob must be collected through obsref."""
    return HubJanitor(client, RetentionConfig(max_entries=max_entries, orphan_scan_count=0), RUN, 1)


def blob_keys(client: redis.Redis) -> set[bytes]:
    return set(client.keys(KEYS.obs_prefix + "*"))


def digest_n(i: int) -> str:
    return f"{i:032x}"


def insert(scripts: Scripts, seq: int, payload: bytes, obs: list[str] = (), keys: list[str] | None = None,
           uuid: str = "aa01"):
    """insert.lua with one chunk whose payload field is ``payload`` (a digest: stored apart); KEYS
    are ``keys``, by default the observations' and the payload's blobs."""
    keys = [KEYS.obs(d) for d in obs] + [KEYS.obs(payload.decode())] if keys is None else keys
    return scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, *keys],
                        [uuid, seq, seq, 1, 0, b"0", b"0", ",".join(obs).encode(), payload])


def test_insert_and_move_carry_a_stored_payload_by_its_digest(real_redis):
    scripts = Scripts(real_redis)
    p, frame = payload_id("aa01", 1, 1), digest_n(8)  # the id bound to chunk 1 of batch 1 of sender aa01
    assert insert(scripts, 1, p.encode()) == [b"MISSING", p.encode()]
    assert not real_redis.exists(KEYS.inbox, KEYS.pinned)  # refused whole
    real_redis.set(KEYS.obs(p), b"the payload")
    real_redis.set(KEYS.obs(frame), b"a frame")
    assert insert(scripts, 1, p.encode(), obs=[frame]) == [b"OK"]
    assert real_redis.smembers(KEYS.pinned) == {p.encode(), frame.encode(), b"q:aa01:1"}  # and the door pin
    assert max(len(item) for item in real_redis.lrange(KEYS.inbox, 0, -1)) < 200  # the digest, not the bytes
    assert move_inbox(scripts, KEYS)[:5] == (1, 1, 0, 0, 0)
    (entry_id, fields), = real_redis.xrange(KEYS.exp)
    assert list(fields) == [b"a", b"e", b"o", b"p", b"s"] and fields[b"p"] == p.encode()
    assert fields[b"s"] == sender_tag("aa01").encode() + b":1:1:1"
    assert real_redis.zscore(KEYS.obsref, p) == real_redis.zscore(KEYS.obsref, frame) == id_score(entry_id)
    assert not real_redis.exists(KEYS.pinned)
    with pytest.raises(ScriptError, match=f"references payload {p} missing from KEYS"):
        insert(scripts, 2, p.encode(), keys=[KEYS.obs(frame)])
    with pytest.raises(ScriptError, match=f"names its payload {p} among its observations"):
        insert(scripts, 2, p.encode(), obs=[p], keys=[KEYS.obs(p)])
    # the same, pushed around insert.lua: set aside, never an entry
    item = b"".join(b"%d:%s" % (len(f), f) for f in (b"aa01", b"2", b"2", b"1", b"0", b"0", p.encode(), p.encode()))
    real_redis.rpush(KEYS.inbox, item)
    moved = move_inbox(scripts, KEYS)
    assert (moved.malformed, moved.added) == (1, 0) and real_redis.xlen(KEYS.exp) == 1
    assert b"among its observations" in real_redis.xrange(KEYS.dead)[0][1][b"detail"]


def test_big_payloads_travel_apart_and_arrive_exactly(real_redis):
    sender = ExperienceSender(real_redis, CONFIG, RUN, 0, 1)
    sent = humanoid_steps(sender, 8)
    sender.flush(None)
    stats = sender.stats()
    assert stats.chunks == 4 and stats.payloads_stored == 4 and stats.obs_uploaded == 0
    assert stats.bytes_sent > 4 * 6000
    # queued as digests: the batches are small, the payload blobs are pinned
    assert all(len(item) < 1000 for item in real_redis.lrange(KEYS.inbox, 0, -1))
    pinned = {d for d in real_redis.smembers(KEYS.pinned) if is_digest(d.decode())}  # not the door pins
    assert len(pinned) == 4 and {KEYS.obs(d.decode()).encode() for d in pinned} == blob_keys(real_redis)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = receiver.receive(100, 0)
    assert len(got) == 4 and receiver.stats().dead == 0
    assert all(set(fields) == {b"a", b"e", b"o", b"p", b"s"} for _, fields in real_redis.xrange(KEYS.exp))
    for i, item in enumerate(got):  # flush 1 (steps 0-3), then flush 2 (steps 4-6: step 7 has no next obs)
        chunk, env, first = item.chunk, item.chunk.env_index, 4 * (i >= 2)
        assert item.nbytes > 6000  # the entry's size counts its payload
        for t in range(chunk.num_steps):
            step = first + t
            np.testing.assert_array_equal(chunk.obs["q"][t], sent[step][env])
            assert chunk.actions[t] == step and chunk.policy_version[t] == step
            if env == 1 and step % 3 == 2:
                np.testing.assert_array_equal(chunk.final_obs[t]["q"], sent[step][env] + 1)
        if first == 0:  # the 5th row of the first chunk is the next step's observation
            np.testing.assert_array_equal(chunk.obs["q"][4], sent[4][env])
    receiver.ack(got)
    # below the threshold a payload stays inline
    small = ExperienceSender(real_redis, SenderConfig(flush_steps=1, payload_ref_min_bytes=1 << 20), RUN, 1, 1)
    humanoid_steps(small, 2)
    assert small.stats().payloads_stored == 0
    move_inbox(Scripts(real_redis), KEYS)
    assert [set(f) for _, f in real_redis.xrange(KEYS.exp)][-1] == {b"a", b"e", b"o", b"d", b"s"}


def test_no_payload_blob_outlives_its_entry_after_trim_and_gc(real_redis):
    real_redis.config_set("stream-node-max-entries", 2)
    sender = ExperienceSender(real_redis, CONFIG, RUN, 0, 1)
    humanoid_steps(sender, 13)  # 3 flushes of 2 chunks
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    receiver.ack(receiver.receive(100, 0))
    assert len(blob_keys(real_redis)) == 6 and real_redis.zcard(KEYS.obsref) == 6
    stats = janitor(real_redis, 2).run_once()
    assert stats.trimmed == 4 and stats.obs_deleted == 4
    retained = {KEYS.obs(f[b"p"].decode()).encode() for _, f in real_redis.xrange(KEYS.exp)}
    assert blob_keys(real_redis) == retained and len(retained) == 2
    assert len(list(receiver.read_retained())) == 2  # what is retained still decodes
    stats = janitor(real_redis, 0).run_once()
    assert stats.obs_deleted == 2 and not blob_keys(real_redis) and not real_redis.exists(KEYS.obsref)


def test_dropping_the_run_deletes_its_payload_blobs(real_redis):
    sender = ExperienceSender(real_redis, CONFIG, RUN, 0, 1)
    humanoid_steps(sender, 5)  # one batch moved, one queued with its blobs pinned
    move_inbox(Scripts(real_redis), KEYS)
    humanoid_steps(sender, 4, start=5)
    assert real_redis.llen(KEYS.inbox) == 1 and len(blob_keys(real_redis)) == 4
    assert RunControl(real_redis, RUN).drop() > 0
    assert real_redis.keys("*") == []


def test_payload_blobs_of_entries_set_aside_go_with_their_entries(real_redis):
    """A payload blob gone, cut short, or not a payload: each entry is dead-lettered with its
    reason, the others are delivered, and once trimmed no blob of them is left."""
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=4, payload_ref_min_bytes=4096), RUN, 0, 1)
    humanoid_steps(sender, 17)  # 4 flushes of 2 chunks
    move_inbox(Scripts(real_redis), KEYS)
    entries = real_redis.xrange(KEYS.exp)
    assert len(entries) == 8
    gone, short = (entries[i][1][b"p"].decode() for i in (0, 3))
    real_redis.delete(KEYS.obs(gone))
    real_redis.set(KEYS.obs(short), real_redis.get(KEYS.obs(short))[:-1])
    # junk under an id of its own (what an agent's own SETNX can store), referenced by a hand-made entry
    real_redis.set(KEYS.obs(digest(b"SRC1junk")), b"SRC1junk")
    real_redis.zadd(KEYS.obsref, {digest(b"SRC1junk"): id_score(entries[-1][0])})
    real_redis.xadd(KEYS.exp, {"a": "0", "e": "0", "o": "", "p": digest(b"SRC1junk")})
    real_redis.xadd(KEYS.exp, {"a": "0", "e": "0", "o": "", "p": "not a digest"})
    real_redis.xadd(KEYS.exp, {"a": "0", "e": "0", "o": "", "p": digest_n(1), "d": b"both"})
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    good = receiver.receive(100, 0)
    assert len(good) == 6 and all(item.entry_id != entries[i][0] for item in good for i in (0, 3))
    assert receiver.dead_by_reason == {"missing_payload": 1, "codec": 2, "format": 2}
    detail = {f[b"reason"]: f[b"detail"] for _, f in real_redis.xrange(KEYS.dead)}
    assert gone.encode() in detail[b"missing_payload"]
    receiver.ack(good)
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    janitor(real_redis, 0).run_once()
    assert not blob_keys(real_redis) and not real_redis.exists(KEYS.obsref, KEYS.pinned)


def test_a_batch_move_sets_aside_leaves_no_payload_blob(real_redis):
    """Storing fails (the stream's last id is the largest there is): the batch is set aside, and
    the blobs its pins kept go into obsref and are collected."""
    sender = ExperienceSender(real_redis, CONFIG, RUN, 0, 1)
    humanoid_steps(sender, 5)
    real_redis.xadd(KEYS.exp, {"a": "0"}, id=f"{2**64 - 1}-{2**64 - 1}")
    moved = move_inbox(Scripts(real_redis), KEYS)
    assert (moved.failed, moved.added, moved.left) == (1, 0, 0)
    assert len(blob_keys(real_redis)) == 2 and not real_redis.exists(KEYS.pinned)
    assert real_redis.zcard(KEYS.obsref) == 2  # the pins, scored at the time of the move
    stats = janitor(real_redis, None).run_once()
    assert stats.obs_deleted == 2 and not blob_keys(real_redis)


def test_an_agent_stopped_between_its_payloads_and_its_insert_leaves_no_blob(real_redis):
    """The sender pins and stores its payloads before the insert that queues them: an agent killed
    in between leaves a pinned blob, which gc spares while pinned; the learner's move scores the
    pin once the inbox is empty, and gc collects the blob once the stream is past it."""
    sender = ExperienceSender(real_redis, CONFIG, RUN, 0, 1)
    humanoid_steps(sender, 5)  # two entries in the stream, for gc to compare with
    move_inbox(Scripts(real_redis), KEYS)
    payload = b"SRC1" + b"\x00" * 9000
    d = digest(payload)
    send_commands(real_redis, [pack_command("SADD", KEYS.pinned, d), pack_command("SETNX", KEYS.obs(d), payload)])
    assert HubJanitor(real_redis, RetentionConfig(), RUN, 1)._sweep_orphans(KEYS)[0] == 0
    assert real_redis.exists(KEYS.obs(d))  # the orphan sweep spares it: it is pinned
    assert move_inbox(Scripts(real_redis), KEYS).taken == 0  # nothing queued: the pin is scored
    assert not real_redis.exists(KEYS.pinned) and real_redis.zscore(KEYS.obsref, d) is not None
    janitor(real_redis, None).run_once()
    assert real_redis.exists(KEYS.obs(d))  # newer than every retained entry: kept for now
    janitor(real_redis, 0).run_once()
    assert not blob_keys(real_redis)


def test_a_resend_dropped_as_a_copy_leaves_no_payload_blob(real_redis, monkeypatch):
    """A lost reply, and the first copy is moved, read, trimmed and collected before the resend
    comes: the resend stores the payload again, insert.lua answers DUP (the dedup window names the
    batch) and queues nothing, and the blob is collected all the same."""
    real_redis.script_load(script_source("insert"))
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=4, payload_ref_min_bytes=4096,
                                                       retry_base_s=0.01), RUN, 0, 1)
    original = sender_module.send_commands
    lost = []

    def collect_then_lose_reply(client, commands, key=None):
        replies = original(client, commands, key)
        if not lost:
            lost.append(True)
            receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
            receiver.ack(receiver.receive(100, 0))
            janitor(real_redis, 0).run_once()
            assert not blob_keys(real_redis)
            raise redis.TimeoutError("reply lost after the server ran the inserts")
        return replies

    monkeypatch.setattr(sender_module, "send_commands", collect_then_lose_reply)
    humanoid_steps(sender, 5)
    assert lost and sender.stats().error_retries == 1
    assert sender.stats().payloads_stored == 2  # by the resend (the first replies were lost)
    assert len(blob_keys(real_redis)) == 2
    moved = move_inbox(Scripts(real_redis), KEYS)
    assert (moved.taken, moved.added, moved.duplicates) == (0, 0, 0)  # the copy was dropped at the door (DUP)
    janitor(real_redis, 0).run_once()  # the stream is empty
    assert not blob_keys(real_redis) and not real_redis.exists(KEYS.obsref, KEYS.pinned)


def test_a_refused_payload_store_is_retried_and_arrives_once(real_redis, monkeypatch):
    """A SETNX refused (as under maxmemory) makes insert.lua answer MISSING: the payload goes
    again with the retry, and the chunk is stored once."""
    real_redis.script_load(script_source("insert"))
    sender = ExperienceSender(real_redis, CONFIG, RUN, 0, 1)
    original = sender_module.send_commands
    refused = []

    def refuse_the_first_store(client, commands, key=None):
        if not refused:
            refused.append(True)
            commands = [pack_command("SETNX") if c.startswith(b"*3\r\n$5\r\nSETNX") else c for c in commands]
        return original(client, commands, key)

    monkeypatch.setattr(sender_module, "send_commands", refuse_the_first_store)
    humanoid_steps(sender, 5)
    stats = sender.stats()
    assert refused and stats.missing_retries == 1 and stats.payloads_stored == 2 and stats.steps_dropped == 0
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    assert len(receiver.receive(100, 0)) == 2 and receiver.stats().dead == 0


def test_the_agent_user_stores_payloads_apart_and_cannot_touch_them(redis_server, real_redis):
    clients = acl_clients(redis_server, real_redis, RUN)
    agent, learner = clients["agent"], clients["learner"]
    receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 1)
    receiver.start()  # loads insert.lua, which the agent may not
    sender = ExperienceSender(agent, CONFIG, RUN, 0, 1)
    humanoid_steps(sender, 5)
    assert sender.stats().payloads_stored == 2 and sender.stats().steps_dropped == 0
    got = receiver.receive(100, 0)
    assert len(got) == 2 and receiver.stats().dead == 0
    blob = KEYS.obs(real_redis.xrange(KEYS.exp)[0][1][b"p"].decode())
    for command in (("SET", blob, b"x"), ("DEL", blob), ("GET", blob), ("SPOP", KEYS.pinned), ("SREM", KEYS.pinned, "x"),
                    ("ZADD", KEYS.obsref, 0, "x"), ("EXPIRE", blob, 1), ("APPEND", blob, b"x"), ("SETRANGE", blob, 0, b"x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command(*command)
    assert agent.setnx(blob, b"x") is False  # create only
    receiver.ack(got)
    janitor(learner, 0).run_once()
    assert not blob_keys(real_redis)
    agent.close()
    learner.close()


def test_the_dedup_ratio_counts_observation_blobs_not_payloads(real_redis):
    """status's dedup ratio (observation slots / observation blobs) is the same whether payloads
    travel inline or apart: payload blobs are left out of the blob count."""
    ratios = []
    for run, apart in (("inline", None), ("apart", 1)):
        sender = ExperienceSender(real_redis, SenderConfig(flush_steps=10, dedup_min_bytes=1024,
                                                           payload_ref_min_bytes=apart), run, 0, 1)
        rng = np.random.default_rng(0)
        frames = [rng.integers(0, 255, (2, 84, 84), dtype=np.uint8) for _ in range(4)]
        for _ in range(41):  # a 4-frame stack, one new frame per step and env
            sender.add(tuple(frames), np.zeros(2), np.ones(2), np.zeros(2, bool), np.zeros(2, bool))
            frames = frames[1:] + [rng.integers(0, 255, (2, 84, 84), dtype=np.uint8)]
        keys = RunKeys(run).shard(0)
        move_inbox(Scripts(real_redis), keys)
        ratios.append(dedup_ratio(real_redis, keys, real_redis.xlen(keys.exp)))
    assert ratios[0] == ratios[1] and ratios[0][0] > 3 and ratios[0][1] == 2 * (4 + 40)


def test_one_janitor_run_scores_every_pin_of_a_burst_and_collects_its_blobs(real_redis):
    """Batches moved while the inbox never emptied leave more pins than one move scores (1024):
    the movers call again until every pin is scored, so one janitor run after the trim collects
    every blob (a pin still held would spare its blob: memory the janitor could not free)."""
    scripts = Scripts(real_redis)
    digests = [digest_n(i) for i in range(1, 1301)]
    for seq, start in enumerate(range(0, 1300, 250), start=1):
        batch = digests[start:start + 250]
        args = ["aa01", seq, 1, 1, len(batch), *[b"x" * 64] * len(batch), b"0", b"0", ",".join(batch).encode(),
                b"SRC1 payload"]
        assert scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, *[KEYS.obs(d) for d in batch]], args) == [b"OK"]
    assert real_redis.scard(KEYS.pinned) == 1300 + 6  # and each queued batch's door pin, unpinned by its move
    moved = move_inbox(scripts, KEYS, max_items=256)
    assert (moved.taken, moved.left, moved.pins) == (6, 0, 1300 - 1024) and not moved.done
    assert move_inbox(scripts, KEYS).done and not real_redis.exists(KEYS.pinned)
    for seq, start in enumerate(range(0, 1300, 250), start=10):  # again, collected by the janitor alone
        batch = digests[start:start + 250]
        args = ["aa01", seq, 10, 1, len(batch), *[b"x" * 64] * len(batch), b"0", b"0", ",".join(batch).encode(),
                b"SRC1 payload"]
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, *[KEYS.obs(d) for d in batch]], args)
    stats = janitor(real_redis, 0).run_once()
    assert stats.moved == 6 and stats.obs_deleted == 1300
    assert not blob_keys(real_redis) and not real_redis.exists(KEYS.pinned, KEYS.obsref)
