"""One agent, using only what its ACL user allows (its own insert.lua calls, RPUSH to the inbox,
SETNX of obs keys, SADD of pins), must never destroy other agents' data, stop the learner or end
the run: every test here plays such an agent against a real redis-server."""

import numpy as np
import pytest
from support.acl_users import acl_clients

from surreal_redis.codec import digest, encode_array
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.experience.wire import payload_id
from surreal_redis.keys import DIGEST_CHARS, RunKeys, is_digest
from surreal_redis.scripts import ScriptError, Scripts, script_source

from .conftest import add_steps, assert_exactly_once, drain
from .test_hostile_entries import referencing_payload

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "agents"
KEYS = RunKeys(RUN).shard(0)


def netstrings(*fields: bytes) -> bytes:
    """An inbox item as insert.lua queues it (and as any agent may RPUSH it)."""
    return b"".join(b"%d:%s" % (len(f), f) for f in fields)


def honest_senders(client, count: int = 2) -> list[ExperienceSender]:
    return [ExperienceSender(client, SenderConfig(flush_steps=2), RUN, agent, 1) for agent in range(count)]


def upload(client, blob: bytes) -> str:
    d = digest(blob)
    client.set(KEYS.obs(d), blob)
    return d


# ---------------------------------------------------------------- 1: bounded references, no half-applied move

def test_insert_refuses_a_chunk_that_references_a_digest_more_than_once(real_redis):
    scripts = Scripts(real_redis)
    blob = encode_array(np.ones((84, 84), np.uint8))
    d = digest(blob)
    with pytest.raises(ScriptError, match=f"chunk 1 references {d} more than once"):
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(d)],
                     ["e71", 1, 1, 1, 1, blob, b"7", b"0", ",".join([d] * 5000).encode(), referencing_payload()])
    assert not real_redis.exists(KEYS.inbox, KEYS.pinned, KEYS.obs(d))


def test_a_batch_referencing_one_digest_thousands_of_times_is_set_aside_and_the_others_are_kept(real_redis):
    """The item used to make move.lua fail after its LTRIM: the batches taken with it vanished
    and the reader died on the ScriptError."""
    first, second = honest_senders(real_redis)
    rng = np.random.default_rng(0)
    add_steps(first, 0, 5, rng, n=1)
    d = upload(real_redis, encode_array(np.ones((84, 84), np.uint8)))
    hostile = netstrings(b"e71", b"1", b"1", b"1", b"7", b"0", ",".join([d] * 5000).encode(), referencing_payload())
    real_redis.rpush(KEYS.inbox, hostile)
    add_steps(second, 0, 5, rng, n=1)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = drain(receiver)
    assert assert_exactly_once(got) == {(agent, 0, 1000.0 * k) for agent in (0, 1) for k in (0, 2)}
    (_, record), = real_redis.xrange(KEYS.dead)
    assert record[b"reason"] == b"malformed_batch" and b"more than once" in record[b"detail"]
    assert receiver.stats().dead == 1 and receiver.dead_by_reason == {"malformed_batch": 1}


def test_a_script_error_while_storing_one_item_sets_that_item_aside_and_the_move_goes_on(real_redis):
    """Whatever fails inside move.lua while one item is stored (here every XADD: the stream's last
    id is the largest there is) dead-letters that item with the error; the call still answers."""
    scripts = Scripts(real_redis)
    sender, = honest_senders(real_redis, 1)
    add_steps(sender, 0, 5, np.random.default_rng(1), n=1)
    queued = real_redis.llen(KEYS.inbox)
    real_redis.xadd(KEYS.exp, {"a": "0"}, id=f"{2**64 - 1}-{2**64 - 1}")
    moved = move_inbox(scripts, KEYS)
    assert (moved.taken, moved.added, moved.failed, moved.left) == (queued, 0, queued, 0)
    dead = real_redis.xrange(KEYS.dead)
    assert [f[b"reason"] for _, f in dead] == [b"script_error"] * queued
    assert b"exhausted" in dead[0][1][b"detail"]


def test_a_refused_move_writes_nothing_and_the_receiver_goes_on_reading(real_redis):
    """A learner key of the wrong type (here the dedup hash replaced by a string) refuses the
    whole move before anything is taken; the receiver counts it and still delivers what is in the
    stream, and the queued batches move once the key is repaired."""
    sender, = honest_senders(real_redis, 1)
    rng = np.random.default_rng(2)
    add_steps(sender, 0, 3, rng, n=1)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    assert len(drain(receiver)) == 1
    add_steps(sender, 3, 2, rng, n=1)
    queued = real_redis.llen(KEYS.inbox)
    real_redis.set(KEYS.seen, b"not a hash")
    with pytest.raises(ScriptError, match="KEYS.4. holds a string, not a hash"):
        move_inbox(Scripts(real_redis), KEYS)
    assert real_redis.llen(KEYS.inbox) == queued and real_redis.xlen(KEYS.exp) == 1
    assert drain(receiver) == [] and receiver.stats().move_errors >= 1
    real_redis.delete(KEYS.seen)
    assert len(drain(receiver)) == 1 and not real_redis.exists(KEYS.inbox)


# ---------------------------------------------------------------- 2: one digest grammar

EDGE_CASES = ["", "a", "ABCDEF0123", "abcdef0123", "0" * 31, "0" * 32, "0" * 33, "f" * 64, "A" * 32,
              "abcdef" + "0" * 25 + "G", "0" * 31 + " ", "0" * 31 + "\n", "0" * 32 + "\n", "-" + "0" * 31,
              "0x" + "0" * 30, "0123456789abcdef" * 2, "0123456789ABCDEF" * 2, "é" + "0" * 31, "0" * 16 + ",0" * 8]


def test_keys_py_and_the_lua_scripts_share_one_digest_grammar(real_redis):
    """keys.py defines the grammar; every script that reads digests carries the same DIGEST
    line, and on the real server that pattern agrees with the Python regex on every edge case."""
    line = f"local DIGEST = '^' .. string.rep('[0-9a-f]', {DIGEST_CHARS}) .. '$'"
    for name in ("insert", "move", "gc"):
        assert script_source(name).splitlines().count(line) == 1, f"{name}.lua lacks {line!r}"
    check = line + "\nlocal out = {}\nfor i, text in ipairs(ARGV) do out[i] = string.match(text, DIGEST) and 1 or 0 end" \
                   "\nreturn out"
    lua = real_redis.eval(check, 0, *EDGE_CASES)
    assert lua == [int(is_digest(text)) for text in EDGE_CASES]
    assert sum(lua) == 2  # "0" * 32 and "0123456789abcdef" * 2


def test_insert_and_move_refuse_digests_outside_the_grammar(real_redis):
    scripts = Scripts(real_redis)
    payload = referencing_payload()
    for text in EDGE_CASES:
        key = KEYS.obs_prefix + text
        if is_digest(text):
            assert scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, key],
                                ["e71", 1, 1, 1, 0, b"7", b"0", text.encode(), payload]) == [b"MISSING", text.encode()]
        else:
            with pytest.raises(ScriptError, match="is not an obs key"):
                scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, key],
                             ["e71", 1, 1, 1, 0, b"7", b"0", text.encode(), payload])
    # an agent RPUSHes around insert.lua: the batch is set aside and its digest never reaches obsref
    real_redis.rpush(KEYS.inbox, netstrings(b"e71", b"1", b"1", b"1", b"7", b"0", b"ABCDEF0123", payload))
    moved = move_inbox(scripts, KEYS)
    assert (moved.malformed, moved.added) == (1, 0) and not real_redis.exists(KEYS.obsref, KEYS.exp)
    assert b"bad digest" in real_redis.xrange(KEYS.dead)[0][1][b"detail"]


def test_the_janitor_removes_malformed_obsref_members_and_never_dies_on_them(real_redis):
    """A malformed member (left by an older version that let one in) made every janitor run raise
    ValueError: the learner died at every restart, and so did `surreal-redis gc`."""
    sender, = honest_senders(real_redis, 1)
    add_steps(sender, 0, 3, np.random.default_rng(3), n=1)
    real_redis.zadd(KEYS.obsref, {"ABCDEF0123": 0, "3": 0, "0" * 31: 0})
    janitor = HubJanitor(real_redis, RetentionConfig(), RUN, 1)
    stats = janitor.run_once()
    assert stats.malformed_removed == 3 and janitor.run_once().malformed_removed == 0
    members = {m.decode() for m in real_redis.zrange(KEYS.obsref, 0, -1)}
    assert members and all(is_digest(m) for m in members)


# ---------------------------------------------------------------- 3: junk obs key names

def test_the_sweep_deletes_obs_keys_whose_name_holds_no_digest_and_the_orphans(real_redis):
    """Junk names were skipped by every gc and stayed until `gc --drop`: nothing can reach them."""
    for suffix in ("zz", "ABCDEF0123", "", "0" * 31):
        assert real_redis.setnx(KEYS.obs_prefix + suffix, b"junk")  # what an agent's SETNX allows
    upload(real_redis, b"written around insert.lua")
    janitor = HubJanitor(real_redis, RetentionConfig(), RUN, 1)
    stats = janitor.run_once()
    assert (stats.orphans_deleted, stats.junk_deleted, stats.obs_skipped, stats.obs_deleted) == (1, 4, 0, 5)
    assert not real_redis.keys(KEYS.obs_prefix + "*")
    other = RunKeys(RUN).shard(1).obs_prefix + "zz"  # another shard's key: never this call's to delete
    real_redis.set(KEYS.obs_prefix + "zz", b"junk")
    real_redis.set(other, b"junk")
    reply = Scripts(real_redis).call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, KEYS.obs_prefix + "zz", other], [])
    assert reply == [1, 0, 1, 0, 1]  # deleted, orphans, skipped, spared, junk: never a refusal of the call
    assert real_redis.exists(other)


def test_the_administrators_gc_collects_every_junk_obs_key_and_keeps_the_live_ones(real_redis, redis_server):
    """`surreal-redis gc` swept one SCAN page and skipped junk names: they stayed until `gc --drop`.
    Now it sweeps every obs key of the run once; pinned or referenced blobs of the live run stay."""
    from click.testing import CliRunner

    from surreal_redis.cli import main

    run = RunKeys(RUN)
    sender, = honest_senders(real_redis, 1)
    add_steps(sender, 0, 5, np.random.default_rng(5), n=1)
    move_inbox(Scripts(real_redis), KEYS)
    pinned = f"{7:032x}"
    real_redis.sadd(KEYS.pinned, pinned)  # a batch still queued references it
    real_redis.set(KEYS.obs(pinned), b"pinned")
    live = set(real_redis.keys(KEYS.obs_prefix + "*"))
    junk = [run.shard(s).obs_prefix + f"junk{i}" for s in range(2) for i in range(30)]
    for key in junk:
        assert real_redis.setnx(key, b"junk")
    result = CliRunner().invoke(main, ["gc", "--run", RUN, "--redis-url", redis_server.url, "--config", "ppo_cartpole",
                                       "-o", "redis.num_shards=2", "-o", "hub.retention.orphan_scan_count=5"])
    assert result.exit_code == 0, result.output
    assert not real_redis.exists(*junk)
    assert set(real_redis.keys(KEYS.obs_prefix + "*")) == live and len(live) > 1


# ---------------------------------------------------------------- 4: gc progress past pinned candidates

def test_gc_gets_past_pinned_candidates_with_bounded_work(real_redis):
    """256 pins (an agent's SADD loop) used to stop collection: every call fetched the same
    spared candidates again, until retention.max_calls (10,000 calls)."""
    digests = [f"{i:032x}" for i in range(600)]
    for d in digests:
        real_redis.set(KEYS.obs(d), b"x")
    real_redis.zadd(KEYS.obsref, {d: i for i, d in enumerate(digests)})  # all older than any entry: collectable
    real_redis.sadd(KEYS.pinned, *digests[:256])
    janitor = HubJanitor(real_redis, RetentionConfig(), RUN, 1)
    deleted, calls, _ = janitor._collect(KEYS, None, RetentionConfig().max_calls)  # pins stay while an agent races the move
    assert (deleted, calls) == (600 - 256, 3)  # three pages of 256 candidates, each fetched once
    assert real_redis.exists(*[KEYS.obs(d) for d in digests]) == 256
    assert real_redis.zcard(KEYS.obsref) == 256


def test_gc_reports_what_it_deleted(real_redis):
    """An obsref member whose obs key is already gone is dropped from obsref but not counted as
    an observation deleted."""
    scripts = Scripts(real_redis)
    here, gone = f"{1:032x}", f"{2:032x}"
    real_redis.set(KEYS.obs(here), b"x")
    real_redis.zadd(KEYS.obsref, {here: 0, gone: 0})
    assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, KEYS.obs(here), KEYS.obs(gone)], []) == [1, 0, 0, 0, 0]
    assert real_redis.zcard(KEYS.obsref) == 0


# ---------------------------------------------------------------- 5: references must match the template

def test_a_batch_with_references_its_template_never_uses_is_set_aside(real_redis):
    scripts = Scripts(real_redis)
    used = upload(real_redis, encode_array(np.ones((84, 84), np.uint8)))
    dangling = upload(real_redis, encode_array(np.full((84, 84), 2, np.uint8)))
    refs = f"{used},{dangling}".encode()
    assert scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(used), KEYS.obs(dangling)],
                        ["e71", 1, 1, 1, 0, b"7", b"0", refs, referencing_payload()]) == [b"OK"]
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    assert drain(receiver) == []
    (_, record), = real_redis.xrange(KEYS.dead)
    assert record[b"reason"] == b"format" and b"never uses" in record[b"detail"]


def test_a_batch_with_misplaced_fields_puts_nothing_into_obsref_and_janitor_set_asides_are_counted(real_redis):
    payload = referencing_payload()
    real_redis.rpush(KEYS.inbox, netstrings(b"e71", b"1", b"1", b"1", b"7", b"0", payload, b"3"),  # o and d swapped
                     netstrings(b"e71", b"2", b"2", b"1", b"7", b"3", b"0", payload))  # e and o swapped
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    janitor = HubJanitor(real_redis, RetentionConfig(), RUN, 1, dead_letters=receiver.count_dead_letters)
    stats = janitor.run_once()  # the learner's janitor moves first, as it does after a restart
    assert not real_redis.exists(KEYS.obsref) and real_redis.xlen(KEYS.dead) == 2
    assert stats.set_aside == 2 and receiver.stats().dead == 2  # hub/dead_entries_total
    assert receiver.dead_by_reason == {"malformed_batch": 2}


# ---------------------------------------------------------------- 6: payloads stored apart

def test_no_agent_can_store_under_a_payloads_id_first(real_redis):
    """A payload's blob id is 128 random bits, not its digest: the same steps sent twice get other
    ids (an agent that knows another's payload cannot name its blob). An id read from the stream
    names a blob that exists (SETNX refuses); once its entry is collected, junk stored under it is
    referenced by nothing (a resend of that batch is dropped as a copy: test_hub_payloads)."""
    config = SenderConfig(flush_steps=2, dedup_min_bytes=1 << 20, payload_ref_min_bytes=1, retry_base_s=0.01)
    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 256, (2, 84, 84), dtype=np.uint8) for _ in range(3)]
    twins = [ExperienceSender(real_redis, config, RUN, agent, 1) for agent in (0, 0)]
    for sender in twins:
        add_steps(sender, 0, 3, rng, frames=lambda k: frames[k])
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    got = drain(receiver)
    assert len(got) == 4 and receiver.stats().dead == 0
    ids = [fields[b"p"].decode() for _, fields in real_redis.xrange(KEYS.exp)]
    assert len(set(ids)) == 4 and all(is_digest(i) for i in ids)
    assert not any(real_redis.setnx(KEYS.obs(i), b"SRC1 junk") for i in ids)  # the blobs are there
    HubJanitor(real_redis, RetentionConfig(max_entries=0, orphan_scan_count=0), RUN, 1).run_once()
    assert not real_redis.keys(KEYS.obs_prefix + "*")
    assert real_redis.setnx(KEYS.obs(ids[0]), b"SRC1 junk")  # after collection: an orphan, named by no entry
    assert drain(receiver) == [] and receiver.stats().dead == 0


def test_no_agent_can_make_the_learner_train_again_on_a_stored_payload(redis_server, real_redis):
    """An agent read another's payload id in the stream and named it in its own insert.lua call
    (EXISTS passes, the blob is there): the learner trained on that payload once more per call.
    An id is now bound to the (uuid, seq, position) that stored it: such an item, and an agent's
    reuse of its own id under another seq, is set aside whole as unbound_payload."""

    from surreal_redis.acl import script_sha

    clients = acl_clients(redis_server, real_redis, RUN)
    agent, learner = clients["agent"], clients["learner"]
    receiver = ExperienceReceiver(learner, ReceiverConfig(), RUN, 1)
    receiver.start()  # loads insert.lua for the agents
    config = SenderConfig(flush_steps=2, dedup_min_bytes=1 << 20, payload_ref_min_bytes=1)
    add_steps(ExperienceSender(agent, config, RUN, 0, 1), 0, 3, np.random.default_rng(9), n=2)
    honest = drain(receiver)
    assert len(honest) == 2 and receiver.stats().dead == 0
    entries = [fields for _, fields in agent.xrange(KEYS.exp)]  # what any agent may read
    insert = script_sha("insert")

    def name(seq: int, fields: dict, blob_id: bytes) -> list:
        return agent.evalsha(insert, 4, KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(blob_id.decode()),
                             "e71", seq, seq, 1, 0, fields[b"a"], fields[b"e"], fields[b"o"], blob_id)

    for seq, fields in enumerate(entries, 1):  # another agent's payloads, by their ids
        assert name(seq, fields, fields[b"p"]) == [b"OK"]
    own = payload_id("e71", 3, 1)  # its own payload, bound to its batch 3 ...
    assert agent.setnx(KEYS.obs(own), real_redis.get(KEYS.obs(entries[0][b"p"].decode())))
    assert name(3, entries[0], own.encode()) == [b"OK"]
    assert name(3, entries[0], own.encode()) == [b"DUP"]  # a resend, dropped at the door (the agent's rights suffice)
    assert name(4, entries[0], own.encode()) == [b"OK"]  # ... named again by batch 4
    again = drain(receiver)
    assert len(again) == 1 and receiver.dead_by_reason == {"unbound_payload": 3}  # only batch 3 trains
    detail = [f[b"detail"] for _, f in real_redis.xrange(KEYS.dead)]
    assert all(b"not the id bound to its batch" in d for d in detail)
    agent.close()
    learner.close()


def test_thousands_of_junk_pins_are_scored_in_bounded_pages_and_collect_nothing_else(real_redis):
    """An agent SADDs 3000 pins, some no digest: each move scores at most 1024 of them, drops the
    ones that are no digest, and gc then deletes nothing any retained entry needs."""
    sender, = honest_senders(real_redis, 1)
    add_steps(sender, 0, 3, np.random.default_rng(8), n=1)
    junk = [f"{i:032x}" for i in range(2990)] + [f"not-a-digest-{i}" for i in range(10)]
    real_redis.sadd(KEYS.pinned, *junk)
    pins = real_redis.scard(KEYS.pinned) - 1  # the junk and the queued batch's own frames (its door pin goes)
    scripts = Scripts(real_redis)
    first = move_inbox(scripts, KEYS)
    assert first.added == 1 and first.pins == real_redis.scard(KEYS.pinned) == pins - 1024
    while real_redis.exists(KEYS.pinned):
        move_inbox(scripts, KEYS)
    frames = set(real_redis.xrange(KEYS.exp)[0][1][b"o"].decode().split(","))
    members = {m.decode() for m in real_redis.zrange(KEYS.obsref, 0, -1)}
    assert members == set(junk[:2990]) | frames
    HubJanitor(real_redis, RetentionConfig(max_entries=None), RUN, 1).run_once()
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    assert len(drain(receiver)) == 1 and receiver.stats().dead == 0
