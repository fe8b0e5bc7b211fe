"""An agent process killed (SIGKILL) mid-run and replaced by a new one with the same agent id:
the new sender has a new uuid (its own dedup window), nothing is stored or received twice, and
the receiver drains everything both stored: the dead agent's chunks up to where it died, the new
one's all."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.keys import RunKeys

from .conftest import drain

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RUN = "killed"
KEYS = RunKeys(RUN).shard(0)
AGENT_ID, ENVS, FLUSH_STEPS = 3, 2, 8
BENCH = str(Path(__file__).resolve().parents[2] / "bench")
GENERATION = 100_000  # policy_version = generation * GENERATION + step: tells chunks of the two agents apart

# An agent process: CartPole-like synthetic steps into an ExperienceSender, one step per ~5 ms;
# policy_version carries the step index, so every chunk is identified by (generation, env, first step).
AGENT = f"""
import sys, time
sys.path.append({BENCH!r})  # bench/harness/, as tests/conftest.py puts it for the tests
from surreal_redis.connection import connect
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from harness.bench_data import synthetic_trajectory

url, generation, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sender = ExperienceSender(connect(url), SenderConfig(flush_steps={FLUSH_STEPS}), {RUN!r}, {AGENT_ID}, 1)
print(sender.uuid, flush=True)
trajectory = synthetic_trajectory("cartpole", {ENVS}, steps, seed=generation)
for t, step in enumerate(trajectory.steps):
    sender.add(step.obs, step.actions, step.rewards, step.terminated, step.truncated, step.final_obs,
               policy_version=generation * {GENERATION} + t)
    time.sleep(0.005)
sender.flush(trajectory.last_obs)
print(sender.stats().chunks, sender.stats().chunks_dropped, flush=True)
"""


def start_agent(url: str, generation: int, steps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", AGENT, url, str(generation), str(steps)],
                            stdout=subprocess.PIPE, text=True)


def chunk_id(item) -> tuple[int, int, int]:
    chunk = item.chunk
    assert chunk.agent_id == AGENT_ID
    first = int(chunk.policy_version[0])
    return first // GENERATION, chunk.env_index, first % GENERATION


def test_an_agent_killed_mid_run_and_restarted_with_its_id_duplicates_nothing(redis_server, real_redis):
    receiver = ExperienceReceiver(real_redis, ReceiverConfig(claim_every_s=0), RUN, 1)
    receiver.start()
    first = start_agent(redis_server.url, 0, 4000)  # ~20 s of steps: it is killed long before the end
    try:
        first_uuid = first.stdout.readline().strip()
        got = []
        deadline = time.monotonic() + 60
        while real_redis.xlen(KEYS.exp) < 10 * ENVS:  # mid-run: some flushes stored, more to come
            assert time.monotonic() < deadline and first.poll() is None
            got += drain(receiver, rounds=1)  # the learner reads while the agent runs
            time.sleep(0.05)
        first.kill()
        assert first.wait(timeout=10) == -9
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    second = start_agent(redis_server.url, 1, 8 * FLUSH_STEPS)
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    second_uuid, counts = out.splitlines()
    chunks, dropped = map(int, counts.split())
    assert second_uuid != first_uuid and len(first_uuid) == len(second_uuid) == 32

    got += drain(receiver)
    assert {first_uuid.encode(), second_uuid.encode()} <= set(real_redis.hkeys(KEYS.seen))  # a window each
    ids = [chunk_id(item) for item in got]
    assert len(ids) == len(set(ids)), "a chunk was received twice"
    entry_ids = [item.entry_id for item in got]
    assert len(entry_ids) == len(set(entry_ids))
    # the receiver drained everything stored, and acked it
    assert real_redis.xlen(KEYS.exp) == len(got) and real_redis.xpending(KEYS.exp, "learner")["pending"] == 0
    # the new agent: every chunk, the last partial one included (flushed with its next observation)
    assert dropped == 0 and chunks == 8 * ENVS
    assert {i for i in ids if i[0] == 1} == {(1, e, t) for e in range(ENVS) for t in range(0, 8 * FLUSH_STEPS, FLUSH_STEPS)}
    # the dead agent: whole flushes up to where it died, in both envs, none after
    firsts = sorted(t for g, e, t in ids if g == 0 and e == 0)
    assert len(firsts) >= 10 and firsts == list(range(0, len(firsts) * FLUSH_STEPS, FLUSH_STEPS))
    assert {(g, e, t) for g, e, t in ids if g == 0} == {(0, e, t) for e in range(ENVS) for t in firsts}
    np.testing.assert_array_equal(sorted(int(item.chunk.rewards.size) for item in got), [FLUSH_STEPS] * len(got))
