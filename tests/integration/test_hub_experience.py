"""Experience path against a real redis-server: the Lua scripts, restarts, retries, TTL cleanup,
maxmemory backpressure, dead letters and claiming a dead learner's entries."""

import re
import subprocess
import threading
import time

import numpy as np
import pytest
import redis

import surreal_redis.hub.experience.sender as sender_module
from surreal_redis.connection import connect
from surreal_redis.embedded import find_redis_server
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.experience.wire import id_score, sender_tag
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import ScriptError, Scripts, script_source

pytestmark = pytest.mark.integration

RUN = "integ"
KEYS = RunKeys(RUN).shard(0)


def noise_frames(rng: np.random.Generator, n: int) -> np.ndarray:
    """Incompressible 84x84 frames, one per env."""
    return rng.integers(0, 256, (n, 84, 84), dtype=np.uint8)


def add_steps(sender: ExperienceSender, count: int, rng: np.random.Generator, n: int = 2) -> None:
    zeros = np.zeros(n, bool)
    for _ in range(count):
        sender.add({"f": noise_frames(rng, n)}, np.zeros(n), np.ones(n), zeros, zeros)


def insert(scripts: Scripts, seq: int, digests: list[str], chunks: int = 1, uuid: str = "aa01",
           upload: dict[str, bytes] | None = None, floor: int | None = None):
    """insert.lua as an agent runs it: queues one batch in the inbox."""
    upload = upload or {}
    order = list(upload) + [d for d in digests if d not in upload]
    args = [uuid, seq, seq if floor is None else floor, chunks, len(upload), *upload.values()]
    for c in range(chunks):
        args += [b"0", str(c).encode(), ",".join(digests).encode(), b"payload"]
    return scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, *[KEYS.obs(d) for d in order]], args)


def move(scripts: Scripts, count: int = 64, budget: int = 4 << 20) -> list[int]:
    """move.lua as the learner runs it: {taken, added, duplicates, malformed, left}; no item's
    storing may fail here (the sixth count)."""
    reply = scripts.call("move", [KEYS.inbox, KEYS.exp, KEYS.obsref, KEYS.seen, KEYS.pinned, KEYS.dead],
                         [count, 60_000, 1000, budget])
    assert reply[5] == 0, reply
    return reply[:5]


def insert_moved(scripts: Scripts, seq: int, digests: list[str], **kwargs) -> list:
    """Queue a batch and move it: ["OK", entry ids...] | ["DUP"] | the insert's refusal."""
    reply = insert(scripts, seq, digests, **kwargs)
    if reply[0] != b"OK":
        return reply
    before = scripts.client.xrevrange(KEYS.exp, count=1)
    taken, added, duplicates, malformed, left = move(scripts)
    assert (taken, malformed, left) == (1, 0, 0)
    if duplicates:
        return [b"DUP"]
    newer = scripts.client.xrange(KEYS.exp, min=b"(" + before[0][0] if before else "-")
    return [b"OK"] + [entry_id for entry_id, _ in newer]


def digest_n(i: int) -> str:
    return f"{i:032x}"


def seen_window(client: redis.Redis, uuid: str = "aa01") -> bytes | None:
    """A sender's dedup window in the seen hash, without its timestamp."""
    state = client.hget(KEYS.seen, uuid)
    return None if state is None else state.split(b":", 1)[1]


def test_insert_script_is_all_or_nothing_and_only_queues(real_redis):
    scripts = Scripts(real_redis)
    a, b, c = digest_n(1), digest_n(2), digest_n(3)
    real_redis.set(KEYS.obs(a), b"A")
    assert insert(scripts, 1, [a, b, c], upload={c: b"C"}) == [b"MISSING", b.encode()]
    assert real_redis.exists(KEYS.inbox, KEYS.pinned, KEYS.obs(c)) == 0  # not even the upload
    assert insert(scripts, 1, [a, b, c], chunks=2, upload={b: b"B", c: b"C"}) == [b"OK"]
    assert real_redis.mget(KEYS.obs(b), KEYS.obs(c)) == [b"B", b"C"]
    assert real_redis.ttl(KEYS.obs(b)) == -1 and real_redis.ttl(KEYS.obs(c)) == -1
    # queued, not in the stream: the referenced digests are pinned until the learner moves it
    assert real_redis.llen(KEYS.inbox) == 1 and not real_redis.exists(KEYS.exp, KEYS.obsref, KEYS.seen)
    assert real_redis.smembers(KEYS.pinned) == {a.encode(), b.encode(), c.encode(), b"q:aa01:1"}  # and the door pin
    assert move(scripts) == [1, 2, 0, 0, 0]
    ids = [entry_id for entry_id, _ in real_redis.xrange(KEYS.exp)]
    assert real_redis.zscore(KEYS.obsref, a) == id_score(ids[1])  # newest referencing entry
    assert seen_window(real_redis) == b"1,1," and not real_redis.exists(KEYS.inbox, KEYS.pinned)
    entry = real_redis.xrange(KEYS.exp)[0][1]
    assert list(entry) == [b"a", b"e", b"o", b"d", b"s"] and entry[b"o"] == f"{a},{b},{c}".encode()
    tag = sender_tag("aa01").encode()  # the uuid's SHA1: the uuid stays secret from agents reading the stream
    assert [fields[b"s"] for _, fields in real_redis.xrange(KEYS.exp)] == [tag + b":1:1:2", tag + b":1:2:2"]
    # a resent batch is dropped at the door (DUP: the window names it), whatever it carries; a copy
    # queued around the door (RPUSH) is dropped by the move
    assert insert(scripts, 1, [a, b]) == [b"DUP"]
    assert insert(scripts, 1, [a], upload={a: b"other"}) == [b"DUP"]
    copy = (b"aa01", b"1", b"1", b"1", b"0", b"0", a.encode(), b"payload")
    real_redis.rpush(KEYS.inbox, b"".join(b"%d:%s" % (len(f), f) for f in copy))
    assert move(scripts) == [1, 0, 1, 0, 0]
    assert real_redis.xlen(KEYS.exp) == 2 and real_redis.get(KEYS.obs(a)) == b"A"
    # another sender is independent
    assert insert_moved(scripts, 1, [a], uuid="bb02")[0] == b"OK"
    # bounds, undeclared digests and unreferenced uploads are refused before any write
    with pytest.raises(ScriptError, match="chunk count"):
        insert(scripts, 5, [a], chunks=65)
    with pytest.raises(ScriptError, match="bad uuid"):
        insert(scripts, 5, [a], uuid="not hex")
    with pytest.raises(ScriptError, match="missing from KEYS"):
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(a)],
                     ["aa01", 7, 7, 1, 0, b"0", b"0", f"{a},{b}".encode(), b"p"])
    with pytest.raises(ScriptError, match="bad upload count"):
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(a)],
                     ["aa01", 7, 7, 1, 2, b"x", b"y", b"0", b"0", a.encode(), b"p"])
    with pytest.raises(ScriptError, match="expected 10 arguments"):
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(a)],
                     ["aa01", 7, 7, 1, 1, b"0", b"0", a.encode(), b"p"])
    with pytest.raises(ScriptError, match="exceed 256"):
        insert(scripts, 8, [digest_n(i) for i in range(257)])
    with pytest.raises(ScriptError, match="referenced by no chunk"):
        insert(scripts, 9, [a], upload={digest_n(9): b"never referenced"})
    with pytest.raises(ScriptError, match="listed twice"):  # as an upload, and again as a reference
        scripts.call("insert", [KEYS.inbox, KEYS.pinned, KEYS.seen, KEYS.obs(c), KEYS.obs(c)],
                     ["aa01", 9, 9, 1, 1, b"C", b"0", b"0", b"", b"p"])
    for seq, floor in ((9, 10), (2000, 1), (0, 0), (2.5, 1)):
        with pytest.raises(ScriptError, match="bad uuid/seq/floor"):
            insert(scripts, seq, [a], floor=floor)
    assert real_redis.xlen(KEYS.exp) == 3 and real_redis.llen(KEYS.inbox) == 0 and seen_window(real_redis) == b"1,1,"
    assert not real_redis.exists(KEYS.obs(digest_n(9)))


def test_insert_dedup_window_stores_a_refused_batch_after_a_later_one(real_redis):
    """One pipeline carries s1 < s2; s1 is refused (MISSING), s2 stored, the replies are lost.
    The resend must store s1 (a maximum-based dedup answered DUP: s1 lost, counted nowhere)."""
    scripts = Scripts(real_redis)
    a, b = digest_n(1), digest_n(2)
    assert insert_moved(scripts, 1, [a], floor=1)[0] == b"MISSING"
    assert insert_moved(scripts, 2, [b], upload={b: b"B"}, floor=1)[0] == b"OK"
    # replies lost: both are sent again, unchanged, with the same floor
    assert insert_moved(scripts, 1, [a], upload={a: b"A"}, floor=1)[0] == b"OK"
    assert insert_moved(scripts, 2, [b], upload={b: b"B"}, floor=1) == [b"DUP"]
    assert real_redis.xlen(KEYS.exp) == 2
    # the next flush raises the floor: the stored seqs below it are forgotten, and any seq below
    # it (settled long ago, e.g. a copy stuck in a dead connection) is dropped unstored
    assert insert_moved(scripts, 3, [a], floor=3)[0] == b"OK"
    assert seen_window(real_redis) == b"3,3,"
    assert insert_moved(scripts, 2, [a], floor=2) == [b"DUP"]
    assert insert_moved(scripts, 1, [a], floor=1) == [b"DUP"]
    assert real_redis.xlen(KEYS.exp) == 3
    # seqs stored out of order inside the window all count; a copy of a queued one is dropped at the door
    assert [insert(scripts, s, [a], floor=4) for s in (6, 4, 5, 6, 4)] == [[b"OK"]] * 3 + [[b"DUP"]] * 2
    assert move(scripts) == [3, 3, 0, 0, 0]
    assert seen_window(real_redis) == b"4,6,4,5,"
    with pytest.raises(ScriptError, match="bad uuid/seq/floor"):
        insert(scripts, 4 + 1024, [a], floor=4)  # beyond the window


def test_move_sets_aside_what_an_agent_pushes_around_insert_and_moves_the_rest(real_redis):
    """The inbox takes anything an agent RPUSHes: junk goes to the dead-letter stream with its
    reason, in order with the batches around it, and the move never stops on it."""
    scripts = Scripts(real_redis)
    a = digest_n(1)
    real_redis.set(KEYS.obs(a), b"A")
    assert insert(scripts, 1, [a]) == [b"OK"]
    junk = [b"", b"garbage", b"4:aa01", b"999999999999:x", b"4:aa011:31:11:3" + b"1:01:02:ab1:p" * 2,
            b"4:aa011:11:11:11:01:03:xyz1:p", b"4:aa011:51:61:11:01:00:1:p", b"9:not-a-hex1:11:11:11:01:00:1:p"]
    real_redis.rpush(KEYS.inbox, *junk)
    assert insert(scripts, 2, [a]) == [b"OK"]
    assert move(scripts, count=4) == [4, 1, 0, 3, 6]
    assert move(scripts) == [6, 1, 0, 5, 0]
    assert real_redis.xlen(KEYS.exp) == 2 and real_redis.xlen(KEYS.dead) == len(junk)
    reasons = {f[b"reason"] for _, f in real_redis.xrange(KEYS.dead)}
    details = [f[b"detail"] for _, f in real_redis.xrange(KEYS.dead)]
    assert reasons == {b"malformed_batch"} and all(details)
    assert real_redis.xrange(KEYS.dead)[1][1][b"f.raw"] == b"garbage"
    assert not real_redis.exists(KEYS.pinned)


def test_move_takes_items_up_to_its_count_and_byte_budget(real_redis):
    scripts = Scripts(real_redis)
    for seq in range(1, 6):
        assert insert(scripts, seq, [], chunks=seq) == [b"OK"]
    assert move(scripts, budget=1) == [1, 1, 0, 0, 4]  # the first item always goes
    size = len(real_redis.lindex(KEYS.inbox, 0)) + len(real_redis.lindex(KEYS.inbox, 1))
    assert move(scripts, budget=size) == [2, 5, 0, 0, 2]
    assert move(scripts, count=1) == [1, 4, 0, 0, 1]
    assert move(scripts) == [1, 5, 0, 0, 0] and real_redis.xlen(KEYS.exp) == 15


def test_gc_spares_what_a_queued_batch_references(real_redis):
    """An observation whose last reference was trimmed, queued again by a batch the learner has
    not moved yet, survives gc; so does a fresh upload that is in no obsref yet."""
    scripts = Scripts(real_redis)
    old, fresh = digest_n(1), digest_n(2)
    assert insert_moved(scripts, 1, [old], upload={old: b"O"})[0] == b"OK"
    real_redis.xtrim(KEYS.exp, maxlen=0)  # its only entry is gone: gc would take it now
    assert insert(scripts, 2, [old, fresh], upload={fresh: b"F"}) == [b"OK"]
    candidates = [KEYS.obs(old), KEYS.obs(fresh)]
    assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, *candidates], []) == [0, 0, 0, 2, 0]  # deleted, orphans, skipped, spared (both pinned)
    assert move(scripts)[1] == 1
    assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, *candidates], []) == [0, 0, 0, 2, 0]  # referenced by the entry
    assert real_redis.mget(*candidates) == [b"O", b"F"]
    real_redis.xtrim(KEYS.exp, maxlen=0)
    assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, *candidates], []) == [2, 0, 0, 0, 0]


def test_move_runs_in_a_full_redis_while_agents_inserts_wait(real_redis):
    """Out of memory, agents' inserts are refused whole; the learner's move still runs (it frees
    about what it adds), so the janitor can trim and collect what agents queued."""
    scripts = Scripts(real_redis)
    a = digest_n(1)
    assert insert(scripts, 1, [a], upload={a: b"A" * 1000}) == [b"OK"]
    assert insert(scripts, 2, [a]) == [b"OK"]
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] // 2)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            insert(scripts, 3, [a])
        assert real_redis.llen(KEYS.inbox) == 2 and real_redis.sismember(KEYS.pinned, a)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            real_redis.xadd(KEYS.exp, {"a": "0"})
        assert move(scripts) == [2, 2, 0, 0, 0]
        assert real_redis.xlen(KEYS.exp) == 2 and not real_redis.exists(KEYS.inbox, KEYS.pinned)
        real_redis.xtrim(KEYS.exp, maxlen=0)
        assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, KEYS.obs(a)], []) == [1, 0, 0, 0, 0]
    finally:
        real_redis.config_set("maxmemory", 0)


def test_trim_and_gc_scripts(real_redis):
    real_redis.config_set("stream-node-max-entries", 2)
    scripts = Scripts(real_redis)
    digests = [digest_n(i) for i in range(6)]
    for d in digests:
        real_redis.set(KEYS.obs(d), d, ex=60)
    ids = [insert_moved(scripts, i + 1, [digests[i], digests[i + 1]])[1] for i in range(5)]  # 5 entries
    orphan = digest_n(99)
    real_redis.set(KEYS.obs(orphan), b"written around insert.lua, never referenced")
    removed, unread, first = scripts.call("trim", [KEYS.exp], ["learner", "CAP", 3, 1000])
    assert (removed, unread, first) == (2, 2, ids[2])  # whole nodes of 2 entries; no group: all unread
    real_redis.xgroup_create(KEYS.exp, "learner", id="0")
    delivered = real_redis.xreadgroup("learner", "c", {KEYS.exp: ">"}, count=2)[0][1]  # ids 2 and 3
    # age trims acked entries only: nothing while entries 2 and 3 are pending
    assert scripts.call("trim", [KEYS.exp], ["learner", "AGE", ids[4].decode(), 1000]) == [0, 0, ids[2]]
    real_redis.xack(KEYS.exp, "learner", delivered[0][0], delivered[1][0])
    assert scripts.call("trim", [KEYS.exp], ["learner", "AGE", ids[4].decode(), 1]) == [0, 0, ids[2]]  # limit < node
    assert scripts.call("trim", [KEYS.exp], ["learner", "AGE", ids[4].decode(), 1000]) == [0, 0, ids[2]]  # keeps ids[3]
    # cap: delivered entries first (ids 2 and 3 share a node), then unread ones, counted exactly
    assert scripts.call("trim", [KEYS.exp], ["learner", "CAP", 1, 1000]) == [2, 0, ids[4]]
    ids += [insert_moved(scripts, 10 + i, [digests[5]])[1] for i in range(3)]  # nodes [4, 5] and [6, 7]
    assert scripts.call("trim", [KEYS.exp], ["learner", "CAP", 1, 1000]) == [2, 2, ids[6]]
    candidates = [KEYS.obs(d) for d in digests] + [KEYS.obs(orphan)]
    assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, *candidates], []) == [6, 1, 0, 1, 0]  # digests 0..4 and the orphan; digest 5 spared
    assert real_redis.exists(*[KEYS.obs(d) for d in digests]) == 1
    assert real_redis.zcard(KEYS.obsref) == 1 and not real_redis.exists(KEYS.obs(orphan))
    with pytest.raises(ScriptError, match="bad mode"):
        scripts.call("trim", [KEYS.exp], ["learner", "CAP", 3, 5000])
    assert scripts.call("trim", [KEYS.exp], ["learner", "CAP", 0, 1000]) == [2, 2, b""]
    assert scripts.call("gc", [KEYS.exp, KEYS.obsref, KEYS.pinned, *candidates], []) == [1, 0, 0, 0, 0]  # empty stream: all go
    assert real_redis.zcard(KEYS.obsref) == 0


class RestartableRedis:
    """A redis-server on a fixed unix socket that can be restarted (losing its data)."""

    def __init__(self, directory) -> None:
        self.dir, self.socket = directory, directory / "redis.sock"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [find_redis_server(), "--port", "0", "--unixsocket", str(self.socket), "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if probe.ping():
                    break
            except (redis.ConnectionError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        probe.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def restartable(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server binary found")
    server = RestartableRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def test_scripts_survive_script_flush_and_restart(restartable):
    client = connect(restartable.url)
    rng = np.random.default_rng(0)
    sender = ExperienceSender(client, SenderConfig(flush_steps=2, retry_base_s=0.01), RUN, 0, 1)
    receiver = ExperienceReceiver(client, ReceiverConfig(), RUN, 1)
    janitor = HubJanitor(client, RetentionConfig(max_entries=0), RUN, 1)
    add_steps(sender, 3, rng)
    assert len(receiver.receive(10, 0)) == 2
    client.script_flush()
    add_steps(sender, 2, rng)
    assert len(receiver.receive(10, 0)) == 2
    client.script_flush()
    assert janitor.run_once().obs_deleted > 0
    restartable.stop()
    restartable.start()  # data, consumer group and script cache are gone
    add_steps(sender, 2, rng)  # the LRU is stale: every obs comes back MISSING and is re-uploaded
    assert sender.stats().missing_retries >= 1
    assert receiver.receive(10, 0) == []  # the group is recreated
    got = receiver.receive(10, 0)
    assert len(got) == 2 and receiver.stats().dead == 0
    assert janitor.run_once().trimmed == 2
    client.close()


def test_retried_insert_after_lost_reply_is_stored_once(real_redis, monkeypatch):
    real_redis.script_load(script_source("insert"))  # so the first insert runs rather than NOSCRIPT
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, retry_base_s=0.01), RUN, 0, 1)
    original = sender_module.send_commands
    lost = []

    def send_then_lose_reply(client, commands, key=None):
        replies = original(client, commands, key)
        if not lost:
            lost.append(True)
            raise redis.TimeoutError("reply lost after the server ran the inserts")
        return replies

    monkeypatch.setattr(sender_module, "send_commands", send_then_lose_reply)
    add_steps(sender, 3, np.random.default_rng(1))
    assert lost and sender.stats().error_retries == 1
    assert real_redis.llen(KEYS.inbox) == 1  # the resend was answered DUP at the door (the batch is queued)
    assert move(Scripts(real_redis)) == [1, 2, 0, 0, 0]  # 2 chunks (one per env)
    assert real_redis.xlen(KEYS.exp) == 2


def test_refused_insert_leaks_nothing(redis_server, real_redis):
    # Observations travel inside the insert call, so an agent that cannot run it (or dies before
    # it runs) leaves nothing behind: there is no separate upload to expire.
    real_redis.acl_setuser("uploader", enabled=True, passwords=["+pw"], keys=["*"],
                           commands=["+@all", "-evalsha", "-eval"])
    agent = redis.Redis(unix_socket_path=str(redis_server.socket_path), username="uploader", password="pw")
    sender = ExperienceSender(agent, SenderConfig(flush_steps=1), RUN, 0, 1)
    with pytest.raises(ScriptError, match="NoPermissionError"):
        add_steps(sender, 2, np.random.default_rng(2))
    assert sender.stats().steps_dropped == 2
    assert real_redis.keys("*") == []
    agent.close()


def test_maxmemory_backoff_no_partial_write_then_gc_resumes(real_redis):
    real_redis.config_set("stream-node-max-entries", 4)
    rng = np.random.default_rng(3)
    config = SenderConfig(flush_steps=2, retry_base_s=0.02, retry_cap_s=0.1, max_wait_s=30)
    sender = ExperienceSender(real_redis, config, RUN, 0, 1)
    add_steps(sender, 41, rng)  # 20 flushes, ~40 frames of 7 KB each
    scripts = Scripts(real_redis)
    assert move(scripts)[1] == 40  # a learner moved them (2 envs: 2 chunks a flush), never read them
    used = real_redis.info("memory")["used_memory"]
    real_redis.config_set("maxmemory", used + 300_000)
    errors = []

    def agent():
        try:
            add_steps(sender, 100, rng)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while sender.stats().oom_retries == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sender.stats().oom_retries > 0, "the sender never hit maxmemory"
        # right at the limit a write may still fit now and then; well over it, none does
        real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] - 100_000)
        time.sleep(0.1)
        stuck = real_redis.llen(KEYS.inbox)
        time.sleep(0.3)
        assert real_redis.llen(KEYS.inbox) == stuck  # backing off, nothing written
        assert real_redis.xlen(KEYS.exp) == 40
        queued = {d for item in real_redis.lrange(KEYS.inbox, 0, -1) for d in re.findall(rb"[0-9a-f]{32}", item)}
        queued.discard(sender.uuid.encode())  # the batch names its sender too
        assert queued and queued <= real_redis.smembers(KEYS.pinned)  # pinned: gc spares them
        assert all(real_redis.exists(KEYS.obs(d.decode())) for d in queued)  # no half-done insert
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            real_redis.xadd(KEYS.exp, {"a": "1"})
        janitor = HubJanitor(real_redis, RetentionConfig(max_entries=4), RUN, 1)
        stats = janitor.run_once()
        assert stats.moved == stuck  # it moves what agents queued first: the move runs in a full Redis
        assert stats.obs_deleted > 0 and stats.unread_dropped > 0  # the moved, unread entries: counted
        while thread.is_alive() and time.monotonic() < deadline + 20:  # as the learner would
            janitor.run_once()
            time.sleep(0.05)
    finally:
        thread.join(timeout=30)
        real_redis.config_set("maxmemory", "128mb")
    assert not thread.is_alive() and errors == []
    move(scripts)
    assert real_redis.xlen(KEYS.exp) > 4  # ingestion resumed
    assert sender.stats().steps_dropped == 0


def test_malformed_entries_are_set_aside_and_reading_goes_on(real_redis):
    rng = np.random.default_rng(4)
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    add_steps(sender, 2, rng, n=1)
    move(Scripts(real_redis))
    real_redis.xadd(KEYS.exp, {"a": "0", "e": "0", "o": "", "d": b"SRT1garbage"})
    real_redis.xadd(KEYS.exp, {"a": "0", "e": "0", "o": "", "d": b"x", "extra": b"field"})
    add_steps(sender, 2, rng, n=1)
    move(Scripts(real_redis))
    gone = real_redis.xrange(KEYS.exp)[-1][1][b"o"].decode().split(",")[-1]  # only the last entry has it
    real_redis.delete(KEYS.obs(gone))  # as if gc had collected it
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    good = receiver.receive(100, 0)
    assert len(good) == 2 and receiver.stats().dead == 3
    assert receiver.dead_by_reason == {"codec": 1, "format": 1, "missing_obs": 1}
    reasons = [f[b"reason"] for _, f in real_redis.xrange(KEYS.dead)]
    assert reasons == [b"codec", b"format", b"missing_obs"]
    receiver.ack(good)
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    add_steps(sender, 1, rng, n=1)
    assert len(receiver.receive(100, 0)) == 1 and receiver.stats().dead == 3  # the reader goes on


def test_claims_entries_of_a_dead_learner(real_redis):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    add_steps(sender, 3, np.random.default_rng(5), n=1)
    dead = ExperienceReceiver(real_redis, ReceiverConfig(consumer="old"), RUN, 1)
    taken = dead.receive(10, 0)
    assert len(taken) == 2  # read, never acked: the learner died
    time.sleep(0.06)
    fresh = ExperienceReceiver(real_redis, ReceiverConfig(consumer="new", claim_min_idle_ms=50), RUN, 1)
    assert fresh.start() == 2
    got = fresh.receive(10, 0)
    assert [g.entry_id for g in got] == [t.entry_id for t in taken]
    assert fresh.ack(got) == 2 and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    # the dead consumer had nothing left once claimed: it is removed, ours stays
    assert fresh.stats().consumers_removed == 1
    assert [c["name"] for c in real_redis.xinfo_consumers(KEYS.exp, "learner")] == [b"new"]


def test_consumer_script_keeps_a_consumer_that_read_meanwhile(real_redis):
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    add_steps(sender, 2, np.random.default_rng(6), n=1)
    ExperienceReceiver(real_redis, ReceiverConfig(consumer="live"), RUN, 1).receive(1, 0)
    real_redis.xgroup_createconsumer(KEYS.exp, "learner", "idle")
    # the caller listed both as idle, but "live" holds an entry now: only "idle" goes
    assert Scripts(real_redis).call("consumers", [KEYS.exp], ["learner", "live", "idle"]) == [b"idle"]
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 1


def test_read_retained_after_trim_and_gc_reads_the_window_only(real_redis):
    real_redis.config_set("stream-node-max-entries", 2)
    rng = np.random.default_rng(7)
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2), RUN, 0, 1)
    add_steps(sender, 13, rng)  # 6 flushes x 2 envs = 12 entries, one new frame per step and env
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(retained_batch=4), RUN, 1)
    receiver.ack(receiver.receive(100, 0))
    stats = HubJanitor(real_redis, RetentionConfig(max_entries=6), RUN, 1).run_once()
    assert stats.trimmed == 6 and stats.obs_deleted > 0
    window = real_redis.xrange(KEYS.exp)
    retained = list(receiver.read_retained())
    assert len(retained) == len(window) == 6 and receiver.stats().retained_skipped == 0
    fresh = ExperienceReceiver(real_redis, ReceiverConfig(consumer="other"), RUN, 1)
    again = list(fresh.read_retained())  # cold cache: every frame fetched and verified
    assert fresh.stats().cache_misses > 0
    for a, b in zip(retained, again):
        assert (a.agent_id, a.env_index) == (b.agent_id, b.env_index)
        np.testing.assert_array_equal(a.obs["f"], b.obs["f"])
        np.testing.assert_array_equal(a.rewards, b.rewards)
    # a frame collected under a retained entry (as a racing gc would): that entry is skipped
    gone = window[-1][1][b"o"].decode().split(",")[-1]
    real_redis.delete(KEYS.obs(gone))
    again = list(ExperienceReceiver(real_redis, ReceiverConfig(consumer="third"), RUN, 1).read_retained())
    assert len(again) == 5
    assert real_redis.xpending(KEYS.exp, "learner")["pending"] == 0 and not real_redis.exists(KEYS.dead)


def test_a_read_is_one_round_trip_and_after_a_read_that_took_all_the_next_waits_first(real_redis, monkeypatch):
    """On one server the move, the read and its announcement go in one pipeline: each round trip
    wakes the learner's prefetch thread, which takes the GIL from the update beside it. A read
    that left nothing queued makes the next one block on the inbox before it reads, in the same
    round trip."""
    import redis.connection

    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1, max_wait_s=5.0), RUN, 0, 1)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    assert receiver.receive(10, 0) == []  # starts the group, loads the scripts, claims once
    trips: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        if threading.current_thread() is threading.main_thread():  # the receiver's, not the sender's
            trips.append(b"".join(command) if isinstance(command, list) else bytes(command))
        return send(self, command, check_health)

    def step():
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    step()
    step()  # one chunk queued (and one step still open)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    assert len(receiver.receive(10, 0)) == 1
    assert len(trips) == 1 and all(name in trips[0] for name in (b"EVALSHA", b"XREADGROUP", b"PUBLISH"))
    trips.clear()

    errors: list[Exception] = []

    def flush_soon():
        time.sleep(0.2)
        try:
            step()
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
    flusher = threading.Thread(target=flush_soon)
    flusher.start()
    received = receiver.receive(10, 2000)
    flusher.join(10)  # never left running past the test (and its server)
    assert not flusher.is_alive() and errors == []
    assert len(received) == 1
    assert len(trips) == 1 and all(name in trips[0] for name in (b"BLMOVE", b"EVALSHA", b"XREADGROUP", b"PUBLISH"))
    assert trips[0].index(b"BLMOVE") < trips[0].index(b"EVALSHA")  # the wait first, the move after it


def test_acks_left_for_later_go_ahead_of_the_next_reads_wait_in_its_round_trip(real_redis, monkeypatch):
    """``ack(later=True)`` (the learner's): no round trip; the reading thread's next read sends
    the XACKs first in its pipeline, so they run at once, not after its wait. A second call while
    acks are still owed sends those first: only the last call's chunks stay pending."""
    import redis.connection

    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)

    def step():
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))

    def pending() -> int:
        return real_redis.xpending(KEYS.exp, "learner")["pending"]
    for _ in range(4):
        step()  # three chunks queued, a step still open
    first, second, third = (receiver.receive(1, 0) for _ in range(3))
    assert len(first) == len(second) == len(third) == 1 and pending() == 3
    trips: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        if threading.current_thread() is threading.main_thread() and b"XPENDING" not in packed:  # the receiver's
            trips.append(packed)
        return send(self, command, check_health)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    assert receiver.ack(first, later=True) is None and trips == [] and pending() == 3  # owed
    receiver.ack(second, later=True)  # the first's ack still owed: sent now, the second's owed
    assert len(trips) == 1 and b"XACK" in trips[0] and pending() == 2
    trips.clear()
    assert receiver.receive(10, 0) == [] and pending() == 1  # the read carried the second's ack
    assert len(trips) == 1 and trips[0].index(b"XACK") < trips[0].index(b"EVALSHA")
    receiver.ack(third, later=True)
    acks: list[bytes] = []  # any thread's calls that ack or wait

    def recorded(self, command, check_health=True):
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        if b"XACK" in packed or b"BLMOVE" in packed:
            acks.append(packed)
        return send(self, command, check_health)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", recorded)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(receiver.receive(10, 2000)))  # took everything: waits first
    reader.start()
    time.sleep(0.3)
    assert pending() == 0  # the third's ack ran ahead of the wait
    assert len(acks) == 1 and acks[0].index(b"XACK") < acks[0].index(b"BLMOVE") < acks[0].index(b"EVALSHA")
    receiver.ack([], later=True)  # the acks owed are on their way: no round trip of its own
    step()
    reader.join(5)
    assert len(got) == 1 and len(got[0]) == 1 and pending() == 1
    assert receiver.flush_acks() == 0 and len(acks) == 1  # nothing owed: no round trip


def test_a_batch_the_janitor_moved_is_read_after_one_wait(real_redis):
    """After a read that took everything the next one waits on the inbox first; a batch the
    learner's janitor moved into the stream meanwhile wakes no wait, and is read after it."""
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=1), RUN, 0, 1)
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(), RUN, 1)
    janitor = HubJanitor(real_redis, RetentionConfig(), RUN, 1)

    def step():
        sender.add(np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool))
    for _ in range(2):
        step()
    receiver.ack(receiver.receive(10, 0))  # took everything: the next read waits first
    step()
    assert janitor.run_once().moved == 1 and real_redis.llen(KEYS.inbox) == 0
    assert len(receiver.receive(10, 300)) == 1
