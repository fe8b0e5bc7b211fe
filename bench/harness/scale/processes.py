"""The scale bench's learner-side processes: the reader (what the learner's prefetch thread and
feed do to the hub), the parameter publisher, and a quiet probe of the server's latency. Each
reports ``(kind, pid, payload)`` on ``results`` and an ``("error", pid, traceback)`` if it fails."""

from __future__ import annotations

import math
import os
import queue
import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from surreal_redis.codec import ParamDict
from surreal_redis.connection import connect
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.hub.quota import ProductionQuota
from surreal_redis.keys import RunKeys

from .servers import OUTAGES, PATIENT, rows_array
from .spec import DRAIN_TIMEOUT_S, RUN, SETUP_TIMEOUT_S, CaseSpec, Window

GC_EVERY_S = 5.0  # learner.gc_every_s's default
PROBE_EVERY_S = 0.02


class _Tally:
    """What the reader received: rows (time acked, steps, chunks), every chunk's origin (a
    duplicate is one seen before) and the read timeouts."""

    def __init__(self) -> None:
        self.acked: list[tuple[float, int, int]] = []
        self.origins: set[tuple[str, int, int]] = set()
        self.duplicates = self.chunks = self.timeouts = 0

    def add(self, batch: Sequence[Any]) -> None:
        """Count one acked batch of the receiver's ``ReceivedChunk`` items."""
        self.acked.append((time.monotonic(), sum(item.chunk.num_steps for item in batch), len(batch)))
        for item in batch:
            self.chunks += 1
            origin = item.origin
            key = ("", -1, self.chunks) if origin is None else (origin.sender, origin.seq, origin.position)
            if key in self.origins:
                self.duplicates += 1
            self.origins.add(key)


def learner_process(spec: CaseSpec, url: str, control: Any, results: Any) -> None:
    """Move, read, decode and ack every chunk (counting each origin), the janitor every 5 s.
    Control messages: ``("drain", n)``: report ``"drained"`` once n chunks came in all;
    ``("finish", n)``: likewise, then report everything and end."""
    try:
        client = connect(url, PATIENT)
        receiver = ExperienceReceiver(client, ReceiverConfig(), RUN, spec.num_shards, settings=PATIENT)
        receiver.start()
        janitor = HubJanitor(client, RetentionConfig(max_age_s=120.0), RUN, spec.num_shards, ReceiverConfig(),
                             dead_letters=receiver.count_dead_letters)
        if spec.sync == "lockstep":
            ProductionQuota(client, RUN).load_script()
        results.put(("ready", os.getpid(), None))
        tally = _Tally()
        target: tuple[str, int] | None = None
        deadline = math.inf
        next_gc = time.monotonic() + GC_EVERY_S
        drained: list[tuple[float, float]] = [(time.monotonic(), time.process_time())]
        while True:
            if target is None:
                try:
                    target = control.get_nowait()
                    deadline = time.monotonic() + DRAIN_TIMEOUT_S
                except queue.Empty:
                    pass
            if target is not None and tally.chunks >= target[1]:
                drained.append((time.monotonic(), time.process_time()))
                if target[0] == "finish":
                    break
                results.put(("drained", os.getpid(), drained[-1]))
                target, deadline = None, math.inf
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {tally.chunks} of {target and target[1]} chunks came within {DRAIN_TIMEOUT_S}s")
            try:
                batch = receiver.receive(max_chunks=spec.profile.receive_batch, block_ms=50)
            except OUTAGES:  # the learner's OutageGuard rides these out; the receiver recovers
                tally.timeouts += 1
                continue
            if batch:
                receiver.ack(batch)
                tally.add(batch)
            if time.monotonic() >= next_gc:
                try:
                    janitor.run_once()
                except OUTAGES:
                    tally.timeouts += 1
                next_gc = time.monotonic() + GC_EVERY_S
        results.put(("done", os.getpid(), {
            "acked": rows_array(tally.acked, 3), "chunks": tally.chunks, "unique": len(tally.origins),
            "duplicates": tally.duplicates, "drained": rows_array(drained, 2), "stats": receiver.stats()._asdict(),
            "dead": dict(receiver.dead_by_reason), "timeouts": tally.timeouts}))
        client.close()
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


def publisher_process(spec: CaseSpec, url: str, params: ParamDict, control: Any, results: Any) -> None:
    """Publish a tiny v1 (and in lockstep grant it plenty) before the agents start, so that setup
    moves no big blob; in phase B publish the real parameters at its start and every
    ``publish_every_s`` (each version's weights differ)."""
    try:
        client = connect(url, PATIENT)
        publisher = ParameterPublisher(client, RUN, spec.broadcast.publisher_config())
        quota = ProductionQuota(client, RUN)
        cfg = spec.profile
        weights = dict(params)  # float32: the publisher casts them as hub.publisher.dtype says
        nudged = max(weights, key=lambda name: weights[name].size)
        grant = int(spec.agents * cfg.rate * 120)  # two minutes of offered steps: claims answer OK or STALE
        rows: list[tuple[float, float, float]] = []  # (time live, version, seconds the publish took)

        failed: list[str] = []

        def publish(what: ParamDict) -> None:
            start = time.monotonic()
            try:
                version = publisher.publish(what, iteration=len(rows))
            except OUTAGES as exc:  # the learner logs it and publishes again after its next update
                failed.append(repr(exc))
                return
            if version is None:
                raise RuntimeError("publish skipped (min_publish_interval)")
            if spec.sync == "lockstep":
                quota.grant(version, grant)
            rows.append((time.monotonic(), float(version), time.monotonic() - start))

        if spec.broadcast.enabled or spec.sync == "lockstep":
            publish({"placeholder": np.zeros(1, np.float32)})
        results.put(("ready", os.getpid(), None))
        window: Window = control.get(timeout=SETUP_TIMEOUT_S * 2)
        due = window.start
        while spec.broadcast.enabled and due < window.end:
            time.sleep(max(0.0, due - time.monotonic()))
            weights[nudged] = weights[nudged].copy()
            weights[nudged].flat[0] += 1  # a new version's bytes differ from the last one's
            publish(weights)
            due += cfg.publish_every_s
        nbytes = int(client.hget(RunKeys(RUN).params.meta, "nbytes") or 0)
        results.put(("done", os.getpid(), {"publishes": rows_array(rows, 3), "nbytes": nbytes, "failed": failed}))
        client.close()
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


def probe_process(url: str, control: Any, results: Any) -> None:
    """Poll the version and PING from a quiet single-threaded process, 50 times a second, until
    told to stop."""
    try:
        client = connect(url)
        meta = RunKeys(RUN).params.meta
        client.ping()
        results.put(("ready", os.getpid(), None))
        polls, pings = [], []
        timeouts = 0
        while True:
            try:
                control.get_nowait()
                break
            except queue.Empty:
                pass
            start = time.perf_counter()
            try:
                client.hget(meta, "version")
                middle = time.perf_counter()
                client.ping()
            except OUTAGES:  # counted at its timeout: the latency an agent would have seen
                middle = time.perf_counter()
                timeouts += 1
            polls.append((time.monotonic(), middle - start))
            pings.append((time.monotonic(), time.perf_counter() - middle))
            time.sleep(PROBE_EVERY_S)
        results.put(("done", os.getpid(), {"poll": rows_array(polls, 2), "ping": rows_array(pings, 2), "timeouts": timeouts}))
        client.close()
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))
