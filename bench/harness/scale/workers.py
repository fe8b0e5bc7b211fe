"""The scale bench's agent processes: each holds many :class:`~harness.scale.agents.SimAgent`
threads and drives them through the case's windows on a real agent's clock."""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .agents import SimAgent, base_trajectory
from .servers import HubServers, rows_array
from .spec import SETUP_TIMEOUT_S, CaseSpec, Window


class _LogCount(logging.Handler):
    """Counts the hub clients' log records in an agent process by message template (fetch
    failures, insert retries: hundreds at a time under a download storm) instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.levelname} {record.msg}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def install(self, name: str = "surreal_redis.hub") -> None:
        """Take over ``name``'s records for the rest of this (agent) process."""
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(self)


class _Scheduler:
    """Hands the agents of one window to the pool threads of :func:`drive`: a ``poll`` thread gets
    the agent whose version poll is due earliest, a ``produce`` thread the lowest-numbered agent
    whose next block of steps is due. Every method but :meth:`run` holds ``cond``."""

    def __init__(self, agents: Sequence[SimAgent], window: Window) -> None:
        self.agents = agents
        self.polls: list[tuple[float, int]] = []
        self.later: list[tuple[float, int]] = []  # production not due yet
        self.ready: list[int] = []  # production due: the lowest agent number first
        for i, agent in enumerate(agents):
            produce_due, poll_due = agent.begin(window)
            if produce_due < window.end:
                self.later.append((produce_due, i))
            if poll_due < window.end:
                self.polls.append((poll_due, i))
        heapq.heapify(self.polls)
        heapq.heapify(self.later)
        self.locks = [threading.Lock() for _ in agents]
        self.cond = threading.Condition()
        self.busy = {"poll": 0, "produce": 0}
        self.errors: list[str] = []

    def take(self, kind: str) -> int | None:
        """The next agent for a ``kind`` thread (None: nothing left of that kind)."""
        while not self.errors:
            now = time.monotonic()
            while self.later and self.later[0][0] <= now:
                heapq.heappush(self.ready, heapq.heappop(self.later)[1])
            if kind == "poll" and self.polls and self.polls[0][0] <= now:
                return heapq.heappop(self.polls)[1]
            if kind == "produce" and self.ready:
                return heapq.heappop(self.ready)
            pending = self.polls if kind == "poll" else self.later
            if not pending and self.busy[kind] == 0 and (kind == "poll" or not self.ready):
                return None
            self.cond.wait(min(0.05, max(0.0, pending[0][0] - now)) if pending else 0.05)
        return None

    def run(self, kind: str) -> None:
        """One pool thread: act for the agents :meth:`take` gives it until none is left."""
        while True:
            with self.cond:
                index = self.take(kind)
                if index is None:
                    self.cond.notify_all()
                    return
                self.busy[kind] += 1
            try:
                with self.locks[index]:
                    agent = self.agents[index]
                    due = agent.poll_action() if kind == "poll" else agent.produce_action()
            except BaseException:
                due = None
                self.errors.append(traceback.format_exc())
            with self.cond:
                self.busy[kind] -= 1
                if due is not None:
                    heapq.heappush(self.polls if kind == "poll" else self.later, (due, index))
                self.cond.notify_all()


def drive(agents: Sequence[SimAgent], window: Window, threads: int) -> None:
    """Run ``agents`` through ``window``: half of ``threads`` make the version polls, each the
    one due earliest, so every agent polls on a real agent's clock; the other half make the
    steps, always of the lowest-numbered agent whose next block is due, so that when this
    machine's CPU runs short some agents still produce at a real agent's pace (full chunks,
    as Redis would see them) and the others only poll. An agent never runs two actions at once
    (its lock). Returns once every agent is past the window; raises with the first agent error."""
    scheduler = _Scheduler(agents, window)
    each = max(1, threads // 2)
    pool = [threading.Thread(target=scheduler.run, args=(kind,), daemon=True)
            for kind in ("poll", "produce") for _ in range(min(each, len(agents)))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if scheduler.errors:
        raise RuntimeError(f"{len(scheduler.errors)} agents failed:\n{scheduler.errors[0]}")


def _cheap_client_setup() -> None:
    """Setup-only speedups of redis-py for an agent process holding hundreds of clients (what
    Redis sees afterwards is unchanged): the library's version is read from the package metadata
    once, not at every connection (~3 ms each), and a cluster client's COMMAND table (~30 ms to
    fetch and parse per client) is fetched once per process and shared (it is only read)."""
    import functools

    import redis.utils

    redis.utils.get_lib_version = functools.cache(redis.utils.get_lib_version)
    try:
        from redis._parsers.commands import CommandsParser
    except ImportError:  # another redis-py layout: every client fetches its own
        return
    original = CommandsParser.initialize
    table: dict[str, Any] = {}

    def initialize(self: Any, r: Any) -> None:
        if "commands" not in table:
            original(self, r)
            table["commands"] = self.commands
        self.commands = table["commands"]

    CommandsParser.initialize = initialize  # type: ignore[method-assign]



def _measurements(agents: Sequence[SimAgent], cpu: list[float], counted: _LogCount) -> dict[str, Any]:
    """What an agent process reports at its end: every agent's rows as arrays, sender stats, the
    CPU seconds of each driven phase and the counted log records."""
    return {
        "insert": rows_array([r for a in agents for r in a.rec.insert], 2),
        "poll": rows_array([r for a in agents for r in a.rec.poll], 2),
        "claim": rows_array([r for a in agents for r in a.rec.claim], 2),
        "download": rows_array([r for a in agents for r in a.rec.download], 4),
        "steps": [rows_array(a.rec.steps, 2) for a in agents],
        "versions": [rows_array(a.rec.versions, 2) for a in agents],
        "senders": [{k: float(v) for k, v in a.sender.stats()._asdict().items()} for a in agents],
        "claim_wait_s": sum(a.rec.claim_wait_s for a in agents),
        "cpu_s": cpu,
        "log_counts": counted.counts,
    }


def agent_worker(spec: CaseSpec, hub: HubServers, agent_ids: list[int], control: Any, results: Any) -> None:
    """One agent process: set the agents up, report ready; run phase A (``spec.threads`` pool
    threads driving all of its agents, see :func:`drive`), report
    the chunks stored; run phases P and B, report them again; when told, flush every agent and report
    every measurement. Once set up it runs under SCHED_IDLE where the OS has it: the agents
    stand for other machines, so on shared cores Redis, the reader, the publisher and the probe
    come first and the agents make what CPU is left."""
    try:
        _cheap_client_setup()
        traj = base_trajectory(spec.env, spec.profile.num_envs, 4 * spec.profile.flush_steps, seed=agent_ids[0])
        agents = [SimAgent(spec, hub, i, traj) for i in agent_ids]
        counted = _LogCount()
        counted.install()

        with ThreadPoolExecutor(spec.threads) as pool:
            list(pool.map(SimAgent.setup, agents))
        if spec.idle_priority and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # the pool threads started later inherit it
        results.put(("ready", os.getpid(), None))
        cpu = []
        for phase in ("paused", "ended"):
            windows: list[Window] = control.get(timeout=SETUP_TIMEOUT_S * 2)
            before = time.process_time()
            for window in windows:
                drive(agents, window, spec.threads)
            cpu.append(time.process_time() - before)
            results.put((phase, os.getpid(), sum(a.sender.stats().chunks for a in agents)))
        control.get(timeout=SETUP_TIMEOUT_S * 2)  # then send what is left
        with ThreadPoolExecutor(spec.threads) as pool:
            list(pool.map(SimAgent.flush, agents))
        payload = _measurements(agents, cpu, counted)
        for agent in agents:
            agent.close()
        results.put(("done", os.getpid(), payload))
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))
