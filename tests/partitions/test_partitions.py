"""Partitions between hosts: Redis, the learner and two agents each in their own network namespace
(:mod:`support.netns`, tests/support/netns.py), a PPO smoke run (lockstep grants) across them, and links cut
with ``ip link set ... down``.

One run serves the whole module, in order: agents cut from the hub for 5 s, the learner cut for
5 s, and (``SURREAL_LONG_TESTS=1``) the agents cut for 60 s, past every socket timeout and the
heartbeat TTL. After each heal: the learner's updates advance again, both agents heartbeat again,
no process exited (nobody restarts anything). The last test stops the run and accounts for every
chunk: none is in the stream twice, the learner trained each delivered chunk at most once, and what
the agents dropped is counted (docs/reliability.md, "Partitions": a cut shorter than
``hub.sender.max_wait_s`` loses nothing).
"""

from __future__ import annotations

import time

import pytest
from support.netns import NetnsLab, netns_unavailable

from .harness import AGENTS, LONG, Run, account_for_every_chunk

pytestmark = [pytest.mark.partitions, pytest.mark.integration, pytest.mark.slow]

PORT = 6390
# The long cuts outlast a sender's wait (hub.sender.max_wait_s, 120 s by default) so that what an agent
# holds when it gives up is dropped, and must be counted.
LONG_OVERRIDES = ("hub.sender.max_wait_s=30",) if LONG else ()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"partition tests need network namespaces: {reason}")
    with NetnsLab(["redis", "learner", *AGENTS, "observer"], tmp_path_factory.mktemp("lab") / "logs") as lab:
        yield lab


@pytest.fixture(scope="module")
def run(lab, tmp_path_factory):
    address = lab.host("redis").address
    server = lab.start("redis", "redis", ["redis-server", "--bind", address, "--port", str(PORT), "--save", "",
                                          "--appendonly", "no", "--protected-mode", "no", "--maxmemory", "256mb",
                                          "--maxmemory-policy", "noeviction"])
    run = Run(lab, tmp_path_factory.mktemp("run"), f"redis://{address}:{PORT}/0", "redis", PORT, [server],
              LONG_OVERRIDES)
    run.wait_training(0, time.time(), "start")
    yield run


def test_a_cut_partitions_that_host_alone(run):
    redis_address = run.lab.host("redis").address

    def ping(host: str) -> str:
        command = ["timeout", "3", "redis-cli", "-h", redis_address, "-p", str(PORT), "PING"]
        return run.lab.run(host, command).stdout.strip()

    assert ping("agent0") == "PONG"
    run.lab.cut("agent0")
    try:
        assert run.lab.is_cut("agent0") and not run.lab.is_cut("agent1")
        assert ping("agent0") != "PONG" and ping("agent1") == "PONG" and run.cli("PING") == "PONG"
    finally:
        run.lab.heal("agent0")
    assert not run.lab.is_cut("agent0") and ping("agent0") == "PONG"


def test_a_split_partitions_a_group_that_still_reaches_itself(run):
    redis_address = run.lab.host("redis").address

    def ping(host: str) -> str:
        command = ["timeout", "3", "redis-cli", "-h", redis_address, "-p", str(PORT), "PING"]
        return run.lab.run(host, command).stdout.strip()

    run.lab.split("redis", "agent0")
    try:
        assert ping("agent0") == "PONG" and ping("agent1") != "PONG" and ping("observer") != "PONG"
    finally:
        run.lab.join("redis", "agent0")
    assert ping("agent0") == ping("agent1") == ping("observer") == "PONG"


def test_agents_cut_from_the_hub_for_5_s_resume(run):
    run.partition(AGENTS, 5.0)


def test_learner_cut_from_the_hub_for_5_s_resumes(run):
    run.partition(("learner",), 5.0)


@pytest.mark.skipif(not LONG, reason="a 60 s cut: set SURREAL_LONG_TESTS=1")
def test_agents_cut_from_the_hub_for_60_s_resume(run):
    run.partition(AGENTS, 60.0)


@pytest.mark.skipif(not LONG, reason="a 60 s cut: set SURREAL_LONG_TESTS=1")
def test_learner_cut_from_the_hub_for_60_s_resumes(run):
    run.partition(("learner",), 60.0)


def test_after_the_partitions_every_chunk_is_accounted_for(run):
    numbers = account_for_every_chunk(run)
    if not LONG:  # docs/reliability.md: a cut shorter than hub.sender.max_wait_s drops nothing
        assert all(chunks == 0 for chunks, _ in numbers["dropped"].values()), numbers["dropped"]
