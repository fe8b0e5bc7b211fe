"""One scale-bench case from start to end: its servers, its child processes (reader, publisher,
agent workers, probe) and the timeline of its phases, with server snapshots at every mark."""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

from surreal_redis.codec import ParamDict

from .processes import learner_process, probe_process, publisher_process
from .servers import HubServers, Mailbox, hub_servers, sleep_until, snapshot
from .spec import DRAIN_TIMEOUT_S, SETUP_TIMEOUT_S, CaseSpec, Window
from .summary import Marks, headline, summarize
from .workers import agent_worker

log = logging.getLogger(__name__)

IDLE_S = 1.0


class _CaseRun:
    """The child processes of one case and the bench's view of the servers while they run: every
    wait also appends a snapshot of the servers to ``samples`` every 0.5 s."""

    def __init__(self, spec: CaseSpec, hub: HubServers) -> None:
        self.spec, self.hub = spec, hub
        self.ctx = mp.get_context("fork")  # this process never imports torch (load_params spawns for it)
        self.results = self.ctx.Queue()
        self.mail = Mailbox(self.results)
        self.learner_control, self.publisher_control, self.probe_control = (self.ctx.Queue(), self.ctx.Queue(),
                                                                            self.ctx.Queue())
        self.procs: list[Any] = []
        self.samples: list[dict[str, Any]] = []
        self.controls: list[Any] = []
        self.workers: set[int] = set()
        self.learner = self.publisher = self.probe = 0

    def spawn(self, target: Callable[..., None], *args: Any) -> int:
        proc = self.ctx.Process(target=target, args=(*args, self.results), daemon=True)
        proc.start()
        self.procs.append(proc)
        if proc.pid is None:
            raise RuntimeError(f"{target.__name__} did not start")
        return proc.pid

    def snap(self) -> dict[str, Any]:
        return snapshot(self.hub.servers)

    def until(self, instant: float) -> dict[str, Any]:
        """Sleep until ``instant`` (sampling), then a snapshot."""
        sleep_until(instant, self.hub.servers, self.samples)
        return self.snap()

    def wait(self, pids: set[int], what: str, timeout: float) -> dict[int, Any]:
        return self.mail.wait_for(pids, what, timeout, self.hub.servers, self.samples)

    def start(self, params: ParamDict) -> dict[str, Any]:
        """Start the reader and the publisher, then (after a snapshot, returned) the agent workers
        and the probe; blocks until every one is ready."""
        spec = self.spec
        self.learner = self.spawn(learner_process, spec, self.hub.url, self.learner_control)
        self.mail.wait_for({self.learner}, "ready", SETUP_TIMEOUT_S)
        self.publisher = self.spawn(publisher_process, spec, self.hub.url, params, self.publisher_control)
        self.mail.wait_for({self.publisher}, "ready", SETUP_TIMEOUT_S)
        before_agents = self.snap()
        workers = min(spec.workers, spec.agents)
        ids = [list(range(w, spec.agents, workers)) for w in range(workers)]
        self.controls = [self.ctx.Queue() for _ in ids]
        self.workers = {self.spawn(agent_worker, spec, self.hub, agent_ids, control)
                        for agent_ids, control in zip(ids, self.controls)}
        self.probe = self.spawn(probe_process, self.hub.url, self.probe_control)
        self.mail.wait_for({*self.workers, self.probe}, "ready", SETUP_TIMEOUT_S)
        return before_agents

    def drain(self, counts: dict[int, Any]) -> dict[str, Any]:
        """Tell the reader how many chunks the workers stored; a snapshot once it had them all."""
        self.learner_control.put(("drain", sum(counts.values())))
        self.wait({self.learner}, "drained", DRAIN_TIMEOUT_S + 30)
        return self.snap()

    def phase_a(self, window: Window) -> tuple[dict[str, Any], ...]:
        """Phase A (experience and polls): snapshots at its start, measured start, end, drained."""
        for control in self.controls:
            control.put([window])
        start, measured, end = self.until(window.start), self.until(window.measured), self.until(window.end)
        drained = self.drain(self.wait(self.workers, "paused", SETUP_TIMEOUT_S))
        return start, measured, end, drained

    def phases_p_b(self, window_p: Window, window_b: Window) -> tuple[dict[str, Any], ...]:
        """Phase P (polls and publishes) then B (everything): snapshots at P's start, B's start,
        B's end, drained."""
        for control in self.controls:
            control.put([window_p, window_b])
        self.publisher_control.put(Window(window_p.start, window_p.start, window_b.end))
        p_start, b_start, b_end = self.until(window_p.start), self.until(window_b.start), self.until(window_b.end)
        drained = self.drain(self.wait(self.workers, "ended", SETUP_TIMEOUT_S))
        return p_start, b_start, b_end, drained

    def finish(self) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Flush every agent, let the reader take all, stop the probe: the reports of the workers,
        the reader, the publisher and the probe."""
        for control in self.controls:
            control.put("flush")
        done = self.wait(self.workers, "done", SETUP_TIMEOUT_S)
        stored = int(sum(s["chunks"] for payload in done.values() for s in payload["senders"]))
        self.learner_control.put(("finish", stored))
        learner_done = self.wait({self.learner}, "done", DRAIN_TIMEOUT_S + 30)[self.learner]
        self.probe_control.put("stop")
        publisher_done = self.mail.wait_for({self.publisher}, "done", 30)[self.publisher]
        probe_done = self.mail.wait_for({self.probe}, "done", 30)[self.probe]
        return list(done.values()), learner_done, publisher_done, probe_done

    def join(self) -> None:
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def run_case(spec: CaseSpec, params: ParamDict) -> dict[str, Any]:
    """Measure one case (see :mod:`harness.scale`) and return its results. Blocks for setup plus
    ``warmup_s + quiet_s + loaded_s`` plus two drains; starts and stops its own servers and
    processes. Raises RuntimeError with a child's traceback when one fails."""
    log.info("case %s: setting up", spec.label)
    started = time.monotonic()
    with hub_servers(spec) as hub:
        run = _CaseRun(spec, hub)
        try:
            before_agents = run.start(params)
            setup_s = time.monotonic() - started
            idle_start = run.snap()
            time.sleep(IDLE_S)  # agents connected and waiting, the reader polling: the fixed cost
            idle = (idle_start, run.snap())
            go = time.monotonic() + 0.2
            window_a = Window(go, go + spec.warmup_s, go + spec.warmup_s + spec.quiet_s)
            log.info("case %s: %d agents ready in %.1fs", spec.label, spec.agents, setup_s)
            a_start, a_measured, a_end, a_drained = run.phase_a(window_a)
            start = time.monotonic() + 0.3
            window_p = Window(start, start, start + spec.params_s, produce=False)
            window_b = Window(window_p.end, window_p.end, window_p.end + spec.loaded_s)
            p_start, b_start, b_end, b_drained = run.phases_p_b(window_p, window_b)
            workers, learner_done, publisher_done, probe_done = run.finish()
        finally:
            run.join()
    marks = Marks(before_agents, idle, window_a, a_drained, a_start, a_measured, a_end, window_p, p_start, window_b,
                  b_start, b_end, b_drained)
    out = summarize(spec, hub, marks, run.samples, workers, learner_done, publisher_done, probe_done)
    out["setup_s"] = round(setup_s, 2)
    out["seconds"] = round(time.monotonic() - started, 2)
    log.info("case %s: %s", spec.label, headline(out))
    return out
