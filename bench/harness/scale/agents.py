"""One simulated agent of the scale bench: what an agent process is to the hub (its own
connections, sender, parameter client and, in lockstep, claims), replaying a recorded trajectory
at a real agent's pace."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import numpy as np

from surreal_redis.connection import connect
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import ParameterClient
from surreal_redis.hub.quota import ProductionQuota, QuotaNews

from ..bench_data import Trajectory, VecStep, _vector, synthetic_trajectory
from .servers import HubServers
from .spec import ACTION_STEPS, RUN, SETUP_TIMEOUT_S, CaseSpec, Window

CLAIM_RETRY_S = 0.1


def base_trajectory(env: str, num_envs: int, steps: int, seed: int) -> Trajectory:
    """The recorded experience one worker's agents replay: Pong-like frame stacks
    (:func:`~harness.bench_data.synthetic_trajectory`'s ``atari``) or HalfCheetah-like
    17-float observations with 6-float actions, truncated every 1000 steps."""
    if env == "pong":
        return synthetic_trajectory("atari", num_envs, steps, seed)
    rng = np.random.default_rng(seed)
    return _vector(num_envs, steps, rng, 17, 6, 0.0, 1000)


def _extras(env: str, num_envs: int) -> dict[str, np.ndarray]:
    """What a PPO agent's chunk carries besides the step: log-prob and value (and the raw
    Gaussian sample for Box actions)."""
    rng = np.random.default_rng(num_envs)
    extras = {"logp": rng.standard_normal(num_envs).astype(np.float32),
              "value": rng.standard_normal(num_envs).astype(np.float32)}
    if env == "halfcheetah":
        extras["raw_action"] = rng.standard_normal((num_envs, 6)).astype(np.float32)
    return extras


class Recorder:
    """One agent's measurements: rows (time the event ended, seconds[, bytes, 1.0 if from a replica])."""

    def __init__(self) -> None:
        self.insert: list[tuple[float, float]] = []
        self.poll: list[tuple[float, float]] = []
        self.claim: list[tuple[float, float]] = []
        self.download: list[tuple[float, float, float, float]] = []
        self.steps: list[tuple[float, float]] = []  # (time, env steps made up to then)
        self.versions: list[tuple[float, float]] = []  # (time loaded, version)
        self.claim_wait_s = 0.0


class SimAgent:
    """One simulated agent (see :mod:`harness.scale`): :meth:`setup` connects and loads the first
    parameters; per window, :meth:`begin`, then :meth:`act` whenever it is due (a pool thread of
    its worker calls it, never two at once); :meth:`flush` at the end."""

    def __init__(self, spec: CaseSpec, hub: HubServers, agent_id: int, traj: Trajectory) -> None:
        self.spec, self.profile, self.agent_id, self.traj = spec, spec.profile, agent_id, traj
        self.url, self.replica_urls = hub.url, hub.replica_urls
        self.rec = Recorder()
        self.error: str | None = None
        self._mark = np.zeros(8, np.uint8)
        self._mark[:4] = np.frombuffer(np.uint32(agent_id).tobytes(), np.uint8)
        self._extras = _extras(spec.env, self.profile.num_envs)
        self._vector_step = 0  # vector steps made so far (the replay position)
        self._adds = 0  # adds since the last flush: every flush_steps-th one sends
        self._made = 0.0
        self._window = Window(0.0, 0.0, 0.0)
        self._due = self._poll_due = math.inf
        self._block_s = self._poll_s = 0.0
        self._claimed = False

    def setup(self) -> None:
        """Connect (one client per server, as an agent process does) and load the first version."""
        cfg = self.profile
        self.client = connect(self.url)
        self.replicas = [connect(url) for url in self.replica_urls]
        self.sender = ExperienceSender(self.client, SenderConfig(flush_steps=cfg.flush_steps), RUN, self.agent_id,
                                       self.spec.num_shards)
        self.params = ParameterClient(self.client, RUN, self.spec.broadcast.client_config(),
                                      replicas=self.replicas)
        self.quota = ProductionQuota(self.client, RUN)
        self.news = QuotaNews(self.client, RUN) if self.spec.sync == "lockstep" else None
        if self.news is not None:
            self.news.drain()  # subscribes now: grants from the start are heard
        if self.spec.broadcast.enabled or self.spec.sync == "lockstep":
            deadline = time.monotonic() + SETUP_TIMEOUT_S
            while self.params.info.version == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent {self.agent_id}: no parameters within {SETUP_TIMEOUT_S}s")
                if self.params.fetch()[0] is None:
                    time.sleep(0.05)
            self.rec.versions.append((time.monotonic(), float(self.params.info.version)))

    # ------------------------------------------------------------ data

    def _step(self, index: int) -> VecStep:
        """Vector step ``index`` of the endless replay; Pong frames carry this agent's id and the
        pass number in their first 8 bytes (new bytes per agent and pass, same dedup within one)."""
        steps = self.traj.steps
        step = steps[index % len(steps)]
        if self.spec.env != "pong":
            return step
        self._mark[4:] = np.frombuffer(np.uint32(index // len(steps)).tobytes(), np.uint8)
        return step._replace(obs=self._marked(step.obs),
                             final_obs=None if step.final_obs is None else self._marked(step.final_obs))

    def _marked(self, frames: Any) -> tuple[np.ndarray, ...]:
        out = tuple(np.array(f) for f in frames)
        for f in out:
            f[:, 0, :8] = self._mark
        return out

    def _add(self, count: int) -> None:
        """``count`` vector steps into the sender; an add that sends (the sender completes and
        sends the chunks at the step after every ``flush_steps``) is timed as an insert."""
        version = self.params.info.version
        flush = self.profile.flush_steps
        for _ in range(count):
            step = self._step(self._vector_step)
            sends = self._adds > 0 and self._adds % flush == 0
            start = time.perf_counter()
            self.sender.add(step.obs, step.actions, step.rewards, step.terminated, step.truncated,
                            final_obs=step.final_obs, extras=self._extras, policy_version=version)
            if sends:
                self.rec.insert.append((time.monotonic(), time.perf_counter() - start))
            self._vector_step += 1
            self._adds += 1

    def flush(self) -> None:
        """Send the partial chunks, completed by the next step's observation (timed as an insert)."""
        start = time.perf_counter()
        if self.sender.flush(self._step(self._vector_step).obs):
            self.rec.insert.append((time.monotonic(), time.perf_counter() - start))
        self._adds = 0

    # ------------------------------------------------------------ parameters

    def _download(self, at_least: int = 0) -> None:
        before = self.params.replica_downloads
        start = time.perf_counter()
        params, info = self.params.fetch(at_least=at_least)
        took = time.perf_counter() - start
        if params is not None:
            self.rec.download.append((time.monotonic(), took, float(info.nbytes),
                                      float(self.params.replica_downloads > before)))
            self.rec.versions.append((time.monotonic(), float(info.version)))
        else:
            self.rec.poll.append((time.monotonic(), took))

    def _poll(self) -> None:
        """A version poll as ``agent.fetch_every_steps`` makes it (downloading a new version
        once it is ``min_version_lag`` publishes ahead, as the client's config says)."""
        if self.spec.broadcast.enabled:
            self._download()

    def _claim(self) -> bool:
        """Lockstep: claim the next flush as the agent's ``_claim_flush`` does (STALE: claim the
        live version, then download it). True when the flush may be produced; False on WAIT
        (the agent claims again a little later; grants here are plenty, so it is rare)."""
        assert self.news is not None
        steps = self.profile.flush_steps * self.profile.num_envs
        self.news.drain()
        held = self.params.info.version
        version = max(held, self.news.granted_version)
        start = time.perf_counter()
        claim = self.quota.claim(version, steps)
        self.rec.claim.append((time.monotonic(), time.perf_counter() - start))
        if claim.status == "STALE" and claim.live_version > held:
            version = claim.live_version
            start = time.perf_counter()
            claim = self.quota.claim(version, steps)
            self.rec.claim.append((time.monotonic(), time.perf_counter() - start))
        if claim.status != "OK":
            return False
        if version > self.params.info.version:
            self._download(at_least=version)
        return True

    # ------------------------------------------------------------ loop

    def begin(self, window: Window) -> tuple[float, float]:
        """Start a window; returns when the first block of steps and the first version poll are
        due (within one block and one poll period of its start, jittered per agent; inf for
        none: no production in the window, or no polls in lockstep or without parameters)."""
        cfg = self.profile
        jitter = random.Random(self.agent_id * 7919 + int(window.start))
        self._window = window
        self._block_s = ACTION_STEPS * cfg.num_envs / cfg.rate
        self._poll_s = cfg.fetch_every_steps * cfg.num_envs / cfg.rate
        self._due = window.start + jitter.uniform(0, self._block_s) if window.produce else math.inf
        free = self.spec.sync == "free" and self.spec.broadcast.enabled
        self._poll_due = window.start + jitter.uniform(0, self._poll_s) if free else math.inf
        return self._due, self._poll_due

    def _within(self, due: float) -> float | None:
        return due if due < self._window.end else None

    def poll_action(self) -> float | None:
        """The version poll due now (free production: every ``fetch_every_steps`` vector steps at
        the real agent's pace, on the clock, so the parameter traffic stays a real agent's even
        when this machine's CPU runs short), downloading a new version. Returns when the next
        one is due, None past the window. Blocks for its round trips."""
        if time.monotonic() >= self._window.end:
            return None
        self._poll()
        self._poll_due = max(self._poll_due + self._poll_s, time.monotonic())
        return self._within(self._poll_due)

    def produce_action(self) -> float | None:
        """:data:`ACTION_STEPS` vector steps (in lockstep, claiming each flush first and sending it
        at its end). An agent behind its pace by more than a block does not catch up: it never
        runs faster than a real one, and produced < offered says what this machine's CPU could
        not make. Returns when the next block is due, None past the window."""
        now = time.monotonic()
        if now >= self._window.end:
            return None
        cfg = self.profile
        lockstep = self.spec.sync == "lockstep"
        if lockstep and self._adds == 0 and not self._claimed:
            self._claimed = self._claim()
            if not self._claimed:
                self._due = time.monotonic() + CLAIM_RETRY_S
                return self._within(self._due)
        self._add(ACTION_STEPS)
        if lockstep and self._adds == cfg.flush_steps:
            self.flush()
            self._claimed = False
        self._made += ACTION_STEPS * cfg.num_envs
        self.rec.steps.append((time.monotonic(), self._made))
        self._due = max(self._due + self._block_s, time.monotonic() - self._block_s)
        return self._within(self._due)

    def close(self) -> None:
        if self.news is not None:
            self.news.close()
        self.sender.close()
        for client in (self.client, *self.replicas):
            client.close()
