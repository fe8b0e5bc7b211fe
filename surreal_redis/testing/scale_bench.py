"""The scale benchmark: N simulated agents on one hub, with a real learner-side reader and publisher.

:func:`run_case` measures one :class:`CaseSpec`: a fresh hub (one primary; or a primary with read
replicas for the parameters; or a Redis Cluster of 3 primaries), then

- ``workers`` agent processes holding the N agents as threads. Each simulated agent is what an
  agent process is to the hub: its own connection (plus one per read replica, as
  ``redis.param_read_urls`` gives an agent), its own
  :class:`~surreal_redis.hub.experience.sender.ExperienceSender` (its own uuid) and
  :class:`~surreal_redis.hub.params.ParameterClient`, and in lockstep its own
  :class:`~surreal_redis.hub.quota.ProductionQuota` claims and :class:`~surreal_redis.hub.quota.QuotaNews`
  subscription. It replays a recorded trajectory (:mod:`surreal_redis.testing.bench_data`: Pong-like
  4-frame stacks, each frame marked with the agent and the pass so that frames are new bytes per
  agent and dedup stays what it is within one agent's stream; HalfCheetah-like 17-float vectors)
  through ``sender.add`` at the per-agent rate of a real agent of that env (:data:`PROFILES`), polls
  the parameter version every ``fetch_every_steps`` vector steps (free production) or claims every
  flush (lockstep), and downloads every new version (with ``BroadcastOptions.min_version_lag``,
  the client's ``min_version_lag``: only one that many publishes ahead);
- one learner-side process: :class:`~surreal_redis.hub.experience.receiver.ExperienceReceiver`
  moving the inboxes, reading, decoding and acking (what the learner's prefetch thread and feed do),
  plus the :class:`~surreal_redis.hub.experience.retention.HubJanitor` every 5 s;
- one publisher process: :class:`~surreal_redis.hub.params.ParameterPublisher` with the real
  network's parameters (PPO's Nature CNN for Pong, 6.75 MB of float32; the 256x256 MLPs for
  HalfCheetah, 0.57 MB), every ``publish_every_s`` (and a grant after each in lockstep);
- one probe process polling the version and PINGing the primary 50 times a second from a quiet
  process: the latency Redis itself adds, apart from the agents' CPU contention.

Timeline: setup (agents connect and download v1), ``warmup_s``, phase A (``quiet_s``: experience
and version polls, no publishes), phase B (``loaded_s``: publishes too), then every agent flushes
and the reader drains. Phase A gives Redis CPU per transition; phase B's CPU beyond that rate is
what the parameter downloads cost (per GB, and as a share of the primary's CPU).

Everything is measured, nothing asserted; everything shares this machine's cores, so "produced"
(what the agents managed) can fall short of "offered" (N x the per-agent rate) because the client
side runs out of CPU before Redis does: the results say which.
"""

from __future__ import annotations

import heapq
import logging
import math
import multiprocessing as mp
import os
import queue
import random
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple, cast

import numpy as np
import redis

from surreal_redis.codec import ParamDict
from surreal_redis.connection import RedisClient, RedisSettings, connect
from surreal_redis.embedded import EmbeddedRedis
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.retention import HubJanitor, RetentionConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.params import (
    ParameterClient,
    ParameterClientConfig,
    ParameterPublisher,
    PublisherConfig,
    from_wire,
    param_spec,
    to_wire,
)
from surreal_redis.hub.quota import ProductionQuota, QuotaNews
from surreal_redis.keys import RunKeys
from surreal_redis.testing.bench_data import Trajectory, VecStep, _vector, synthetic_trajectory
from surreal_redis.testing.cluster import LocalCluster, attach_replica
from surreal_redis.testing.hub_bench import server_cpu_s

log = logging.getLogger(__name__)

RUN = "scale"
HUBS = ("primary", "replicas", "cluster")
SYNCS = ("free", "lockstep")
PARAM_COMMANDS = ("getrange", "hget", "hgetall")
"""Commands only the parameter path sends in this bench (polls, meta reads, blob pieces)."""
_SETUP_TIMEOUT_S = 180.0
_DRAIN_TIMEOUT_S = 120.0
_GC_EVERY_S = 5.0  # learner.gc_every_s's default
_PROBE_EVERY_S = 0.02
_AGE_GRID_S = 0.05
_IDLE_S = 1.0
ACTION_STEPS = 8
"""Vector steps a simulated agent makes per action (the agent's steps come in blocks of this many,
at its real pace); ``flush_steps`` and ``fetch_every_steps`` are multiples of it."""
CLAIM_RETRY_S = 0.1
_PATIENT = RedisSettings(socket_timeout=120.0)  # the bench's own INFO reads wait out a busy server
_OUTAGES = (redis.ConnectionError, redis.TimeoutError)


@dataclass(frozen=True)
class EnvProfile:
    """How a real agent of one env loads the hub. ``rate``: env steps/s one agent process reaches
    acting with its policy on one core (bench/throughput.py and bench/envs.py, docs/benchmarks.md:
    Pong 470-575 with the Nature CNN in numpy, HalfCheetah 3.0-3.5k with the MLP);
    ``publish_every_s``: seconds between the learner's publishes (one PPO update on a GPU
    learner; an assumption, set it with ``--publish-every-s``); the rest as in the shipped
    config (``configs/ppo_pong.yaml``, ``configs/ppo_halfcheetah.yaml``; ``receive_batch``: the
    learner's chunks per read)."""

    name: str
    num_envs: int
    flush_steps: int
    fetch_every_steps: int
    rate: float
    publish_every_s: float
    receive_batch: int


PROFILES: dict[str, EnvProfile] = {
    "pong": EnvProfile("pong", num_envs=4, flush_steps=128, fetch_every_steps=64, rate=500.0, publish_every_s=1.0,
                         receive_batch=16),
    "halfcheetah": EnvProfile("halfcheetah", num_envs=2, flush_steps=64, fetch_every_steps=64, rate=3500.0,
                              publish_every_s=1.0, receive_batch=64),
}


@dataclass(frozen=True)
class BroadcastOptions:
    """What the parameter path does. ``enabled`` False: no polls, downloads nor publishes (the
    experience path alone). ``dtype``: the publisher's ``hub.publisher.dtype`` ("float16": float32
    leaves travel as float16, half the bytes; the clients cast them back to float32, see
    :func:`fp16_logit_check`). ``min_version_lag``: the agents' ``hub.params_client.min_version_lag``
    (a poll downloads only a version at least this many publishes ahead of the one held; 1: every
    new version; 2: every other one, which keeps a version age of 2 publishes). Raises
    ``ValueError`` naming a bad value, as the config does."""

    enabled: bool = True
    dtype: str = "float32"
    min_version_lag: int = 1

    def __post_init__(self) -> None:
        self.publisher_config()
        self.client_config()

    def publisher_config(self) -> PublisherConfig:
        """The publisher's config in this case."""
        return PublisherConfig(dtype=self.dtype)

    def client_config(self) -> ParameterClientConfig:
        """Each simulated agent's parameter-client config in this case."""
        return ParameterClientConfig(min_version_lag=self.min_version_lag)

    @property
    def label(self) -> str:
        if not self.enabled:
            return "no params"
        parts = ["fp16" if self.dtype == "float16" else "fp32"]
        if self.min_version_lag > 1:
            suffix = {2: "nd", 3: "rd"}.get(self.min_version_lag, "th")
            parts.append(f"every {self.min_version_lag}{suffix} version")
        return ", ".join(parts)


@dataclass(frozen=True)
class CaseSpec:
    """One measurement. ``hub``: one of :data:`HUBS` (``replicas``: ``replicas`` read replicas
    serve the parameters; ``cluster``: ``primaries`` primaries hold everything, the experience
    shards spread over them); ``sync``: one of :data:`SYNCS`; ``rate`` / ``publish_every_s``:
    override the env's :class:`EnvProfile`; ``idle_priority``: the agent processes run under
    SCHED_IDLE (see :func:`_agent_worker`). Times in seconds."""

    env: str
    agents: int
    hub: str = "primary"
    sync: str = "free"
    broadcast: BroadcastOptions = field(default_factory=BroadcastOptions)
    workers: int = 4
    threads: int = 16
    num_shards: int = 6
    replicas: int = 2
    primaries: int = 3
    warmup_s: float = 1.0
    quiet_s: float = 3.0
    params_s: float = 2.0
    loaded_s: float = 5.0
    rate: float | None = None
    publish_every_s: float | None = None
    idle_priority: bool = True

    def __post_init__(self) -> None:
        if self.env not in PROFILES:
            raise ValueError(f"unknown env {self.env!r} (known: {', '.join(PROFILES)})")
        if self.hub not in HUBS:
            raise ValueError(f"unknown hub {self.hub!r} (known: {', '.join(HUBS)})")
        if self.sync not in SYNCS:
            raise ValueError(f"unknown sync {self.sync!r} (known: {', '.join(SYNCS)})")
        for name in ("agents", "workers", "threads", "num_shards", "replicas", "primaries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("quiet_s", "params_s", "loaded_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 env steps/s, got {self.rate}")
        if self.publish_every_s is not None and self.publish_every_s <= 0:
            raise ValueError(f"publish_every_s must be > 0, got {self.publish_every_s}")

    @property
    def profile(self) -> EnvProfile:
        base = PROFILES[self.env]
        return replace(base, rate=self.rate or base.rate, publish_every_s=self.publish_every_s or base.publish_every_s)

    @property
    def label(self) -> str:
        parts = [self.env, str(self.agents), self.hub]
        if self.sync != "free":
            parts.append(self.sync)
        if self.broadcast != BroadcastOptions():
            parts.append(self.broadcast.label)
        return " / ".join(parts)


class Window(NamedTuple):
    """One phase in ``time.monotonic()`` instants (one clock for every process of this machine):
    agents run from ``start`` to ``end`` (``produce`` False: they only poll and download);
    latencies and rates count from ``measured``."""

    start: float
    measured: float
    end: float
    produce: bool = True


# ---------------------------------------------------------------- parameters

def real_params(env: str) -> ParamDict:
    """The parameters the PPO learner publishes for ``env`` (``actor_params()`` of a fresh
    ActorCritic as the shipped config builds it): Pong's Nature CNN with linear heads over 4
    stacked 84x84 frames and 6 actions (1.69M parameters); HalfCheetah's 256x256 relu MLPs with
    an observation normalizer (17 obs, 6 actions). Imports torch: call it in a child process
    (:func:`load_params`) so forked processes never inherit torch's threads."""
    import gymnasium as gym

    from surreal_redis.algos.ppo.policy import ActorCritic, params_to_numpy
    from surreal_redis.algos.registry import algorithm

    section = algorithm("ppo").config_class  # the shipped PPO configs' section

    if env == "pong":
        frame = gym.spaces.Box(0, 255, (84, 84), np.uint8)
        net = ActorCritic(section(hidden_sizes=()), gym.spaces.Tuple([frame] * 4), gym.spaces.Discrete(6))
    elif env == "halfcheetah":
        net = ActorCritic(section(hidden_sizes=(256, 256), activation="relu", normalize_obs=True),
                          gym.spaces.Box(-np.inf, np.inf, (17,), np.float32), gym.spaces.Box(-1, 1, (6,), np.float32))
    else:
        raise ValueError(f"unknown env {env!r} (known: {', '.join(PROFILES)})")
    return params_to_numpy(net)


def trained_pong_params(updates: int = 12, seed: int = 0) -> ParamDict:
    """Pong's network (as :func:`real_params` builds it) after ``updates`` PPO updates (1e-3
    learning rate, 2 epochs of 2 minibatches, 4 envs x 64 steps each) on a paddle task over the
    synthetic Pong screens of :mod:`~surreal_redis.testing.bench_data`: reward 1 for "up" (action 2)
    while the ball is above the left paddle's centre, for "down" (3) while below, 64-step episodes.
    The CNN has to find the ball and the paddle in the frames to earn it: 12 updates take the mean
    return from ~11 (chance) to ~50 of 64, the logits' spread from ~0.01 to ~6 nats. Trained
    weights for :func:`fp16_logit_check`; imports torch (call it in a child process, like
    :func:`real_params`); ~25 s of CPU."""
    import gymnasium as gym
    import torch

    from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
    from surreal_redis.algos.registry import algorithm
    from surreal_redis.testing.bench_data import _Pong
    from surreal_redis.testing.local_loop import LocalLoopConfig, OnPolicyLearner, run_local

    frame = gym.spaces.Box(0, 255, (84, 84), np.uint8)

    class PaddleEnv(gym.Env):
        observation_space = gym.spaces.Tuple([frame] * 4)
        action_space = gym.spaces.Discrete(6)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
            super().reset(seed=seed)
            self.game, self.t = _Pong(self.np_random), 0
            self.stack = [self.game.frame()] * 4
            return tuple(self.stack), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            wanted = 2 if self.game.ball[0] < self.game.paddles[0] + 5 else 3
            reward = float(action == wanted)
            self.game.step()
            self.t += 1
            self.stack = self.stack[1:] + [self.game.frame()]
            return tuple(self.stack), reward, False, self.t >= 64, {}

    spec = algorithm("ppo")
    section = spec.config_class(hidden_sizes=(), learning_rate=1e-3, update_epochs=2, num_minibatches=2,
                                device="cpu")
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([PaddleEnv] * 4, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    trainer = spec.make_trainer(section, envs.single_observation_space, envs.single_action_space, seed)
    policy = NumpyPPOPolicy(section, envs.single_observation_space, envs.single_action_space, 4, seed=seed)
    loop = LocalLoopConfig(total_steps=4 * 64 * updates, chunk_steps=64, seed=seed, return_window=4,
                           log_every=max(1, updates // 3))
    result = run_local(cast(OnPolicyLearner, trainer), policy, envs, loop)
    envs.close()
    log.info("trained Pong network: mean return %.0f of 64 after %d updates", result.mean_return, result.updates)
    return trainer.actor_params()


def load_params(envs: Sequence[str]) -> dict[str, ParamDict]:
    """:func:`real_params` of each env, built in one spawned child (torch stays out of this
    process). Blocks for the child's torch import (a few seconds)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return {env: pool.apply(real_params, (env,)) for env in envs}


def fp16_logit_check(params: ParamDict, frames: int = 64, seed: int = 0) -> dict[str, float]:
    """How far Pong's policy (fresh, :func:`real_params`, or trained, :func:`trained_pong_params`)
    moves when its weights travel as float16: the numpy agent policy
    (``agent.inference: numpy``) loaded with ``params`` and with what a client loads when the
    publisher's ``dtype`` is float16 (:func:`~surreal_redis.hub.params.to_wire`, then
    :func:`~surreal_redis.hub.params.from_wire` back to float32), acting
    on ``frames`` synthetic Pong observations. Returns the largest logit and value differences
    (absolute, and relative to the fp32 logits' spread), the share of frames whose greedy action
    agrees, the largest log-prob difference (what PPO's ratio sees) and the largest
    KL(fp32 || fp16) of the action distributions (nats)."""
    import gymnasium as gym

    from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
    from surreal_redis.algos.registry import algorithm

    section = algorithm("ppo").config_class  # the shipped PPO configs' section

    frame = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    space = gym.spaces.Tuple([frame] * 4)
    traj = synthetic_trajectory("atari", num_envs=frames, steps=8, seed=seed)
    obs = traj.steps[-1].obs
    out: dict[str, np.ndarray] = {}
    rounded = from_wire(to_wire(params, "float16"), param_spec(params))
    for name, weights in (("fp32", params), ("fp16", rounded)):
        policy = NumpyPPOPolicy(section(hidden_sizes=()), space, gym.spaces.Discrete(6), num_envs=frames)
        policy.load_params(weights, 1)
        z = policy.encoder(obs)
        out[name + "_logits"] = policy.actor(z).astype(np.float64)
        out[name + "_value"] = policy.critic(z)[:, 0].astype(np.float64)
    a, b = out["fp32_logits"], out["fp16_logits"]
    log_p = a - np.logaddexp.reduce(a, axis=1, keepdims=True)
    log_q = b - np.logaddexp.reduce(b, axis=1, keepdims=True)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=1)
    spread = float(np.ptp(a)) or 1.0
    return {"frames": frames, "max_abs_logit_diff": float(np.abs(a - b).max()),
            "max_rel_logit_diff": float(np.abs(a - b).max() / spread),
            "max_abs_logp_diff": float(np.abs(log_p - log_q).max()),
            "max_abs_value_diff": float(np.abs(out["fp32_value"] - out["fp16_value"]).max()),
            "greedy_agreement": float((a.argmax(1) == b.argmax(1)).mean()), "max_kl": float(kl.max()),
            "logit_spread": spread}


# ---------------------------------------------------------------- servers

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class HubServers(NamedTuple):
    """The servers of one case. ``url``: what agents, reader and publisher connect to (a
    ``redis+cluster://`` URL for a cluster); ``replica_urls``: parameter read replicas;
    ``servers``: (label, client of that one server) for INFO; ``params_server``: the label of the
    server holding the parameter keys."""

    url: str
    replica_urls: list[str]
    servers: list[tuple[str, RedisClient]]
    params_server: str


@contextmanager
def hub_servers(spec: CaseSpec, maxmemory: str = "8gb") -> Iterator[HubServers]:
    """Start the case's servers (TCP on loopback, as remote agents reach them); stop them after."""
    if spec.hub == "cluster":
        cluster = LocalCluster(primaries=spec.primaries, replicas=0, maxmemory=maxmemory).start()
        clients: list[RedisClient] = []
        try:
            ports = cluster.ports[:spec.primaries]
            clients = [connect(f"redis://127.0.0.1:{port}/0", _PATIENT) for port in ports]
            params_port = cluster.primary_port_of(RunKeys(RUN).params.meta)
            yield HubServers(cluster.url, [], [(f"node{i}", c) for i, c in enumerate(clients)],
                             f"node{ports.index(params_port)}")
        finally:
            for client in clients:
                client.close()
            cluster.stop()
        return
    count = 1 + (spec.replicas if spec.hub == "replicas" else 0)
    servers = [EmbeddedRedis(maxmemory=maxmemory, port=_free_port()).start() for _ in range(count)]
    clients = [connect(server.url, _PATIENT) for server in servers]
    try:
        clients[0].config_set("repl-diskless-sync-delay", 0)
        for replica in clients[1:]:
            attach_replica(replica, servers[0].port)
        labels = ["primary"] + [f"replica{i}" for i in range(1, count)]
        yield HubServers(servers[0].url, [s.url for s in servers[1:]], list(zip(labels, clients)), "primary")
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop()


# ---------------------------------------------------------------- the simulated agents

def base_trajectory(env: str, num_envs: int, steps: int, seed: int) -> Trajectory:
    """The recorded experience one worker's agents replay: Pong-like frame stacks
    (:func:`~surreal_redis.testing.bench_data.synthetic_trajectory`'s ``atari``) or HalfCheetah-like
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


class _Recorder:
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
    """One simulated agent (see the module docstring): :meth:`setup` connects and loads the first
    parameters; per window, :meth:`begin`, then :meth:`act` whenever it is due (a pool thread of
    its worker calls it, never two at once); :meth:`flush` at the end."""

    def __init__(self, spec: CaseSpec, hub: HubServers, agent_id: int, traj: Trajectory) -> None:
        self.spec, self.profile, self.agent_id, self.traj = spec, spec.profile, agent_id, traj
        self.url, self.replica_urls = hub.url, hub.replica_urls
        self.rec = _Recorder()
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
            deadline = time.monotonic() + _SETUP_TIMEOUT_S
            while self.params.info.version == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent {self.agent_id}: no parameters within {_SETUP_TIMEOUT_S}s")
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


def _arrays(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    return np.asarray(rows, dtype=np.float64).reshape(-1, width)


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


def _drive(agents: Sequence[SimAgent], window: Window, threads: int) -> None:
    """Run ``agents`` through ``window``: half of ``threads`` make the version polls, each the
    one due earliest, so every agent polls on a real agent's clock; the other half make the
    steps, always of the lowest-numbered agent whose next block is due, so that when this
    machine's CPU runs short some agents still produce at a real agent's pace (full chunks,
    as Redis would see them) and the others only poll. An agent never runs two actions at once
    (its lock). Returns once every agent is past the window; raises with the first agent error."""
    polls: list[tuple[float, int]] = []
    later: list[tuple[float, int]] = []  # production not due yet
    ready: list[int] = []  # production due: the lowest agent number first
    for i, agent in enumerate(agents):
        produce_due, poll_due = agent.begin(window)
        if produce_due < window.end:
            later.append((produce_due, i))
        if poll_due < window.end:
            polls.append((poll_due, i))
    heapq.heapify(polls)
    heapq.heapify(later)
    locks = [threading.Lock() for _ in agents]
    cond = threading.Condition()
    busy = {"poll": 0, "produce": 0}
    errors: list[str] = []

    def take(kind: str) -> int | None:
        """The next agent for a ``kind`` thread (None: nothing left of that kind); holds cond."""
        while not errors:
            now = time.monotonic()
            while later and later[0][0] <= now:
                heapq.heappush(ready, heapq.heappop(later)[1])
            if kind == "poll" and polls and polls[0][0] <= now:
                return heapq.heappop(polls)[1]
            if kind == "produce" and ready:
                return heapq.heappop(ready)
            pending = polls if kind == "poll" else later
            if not pending and busy[kind] == 0 and (kind == "poll" or not ready):
                return None
            cond.wait(min(0.05, max(0.0, pending[0][0] - now)) if pending else 0.05)
        return None

    def loop(kind: str) -> None:
        while True:
            with cond:
                index = take(kind)
                if index is None:
                    cond.notify_all()
                    return
                busy[kind] += 1
            try:
                with locks[index]:
                    agent = agents[index]
                    due = agent.poll_action() if kind == "poll" else agent.produce_action()
            except BaseException:
                due = None
                errors.append(traceback.format_exc())
            with cond:
                busy[kind] -= 1
                if due is not None:
                    heapq.heappush(polls if kind == "poll" else later, (due, index))
                cond.notify_all()

    each = max(1, threads // 2)
    pool = [threading.Thread(target=loop, args=(kind,), daemon=True)
            for kind in ("poll", "produce") for _ in range(min(each, len(agents)))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} agents failed:\n{errors[0]}")


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


def _agent_worker(spec: CaseSpec, hub: HubServers, agent_ids: list[int], control: Any, results: Any) -> None:
    """One agent process: set the agents up, report ready; run phase A (``spec.threads`` pool
    threads driving all of its agents, see :func:`_drive`), report
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
            windows: list[Window] = control.get(timeout=_SETUP_TIMEOUT_S * 2)
            before = time.process_time()
            for window in windows:
                _drive(agents, window, spec.threads)
            cpu.append(time.process_time() - before)
            results.put((phase, os.getpid(), sum(a.sender.stats().chunks for a in agents)))
        control.get(timeout=_SETUP_TIMEOUT_S * 2)  # then send what is left
        with ThreadPoolExecutor(spec.threads) as pool:
            list(pool.map(SimAgent.flush, agents))
        payload = {
            "insert": _arrays([r for a in agents for r in a.rec.insert], 2),
            "poll": _arrays([r for a in agents for r in a.rec.poll], 2),
            "claim": _arrays([r for a in agents for r in a.rec.claim], 2),
            "download": _arrays([r for a in agents for r in a.rec.download], 4),
            "steps": [_arrays(a.rec.steps, 2) for a in agents],
            "versions": [_arrays(a.rec.versions, 2) for a in agents],
            "senders": [{k: float(v) for k, v in a.sender.stats()._asdict().items()} for a in agents],
            "claim_wait_s": sum(a.rec.claim_wait_s for a in agents),
            "cpu_s": cpu,
            "log_counts": counted.counts,
        }
        for agent in agents:
            agent.close()
        results.put(("done", os.getpid(), payload))
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


# ---------------------------------------------------------------- learner side, publisher, probe

def _learner(spec: CaseSpec, url: str, control: Any, results: Any) -> None:
    """Move, read, decode and ack every chunk (counting each origin), the janitor every 5 s.
    Control messages: ``("drain", n)``: report ``"drained"`` once n chunks came in all;
    ``("finish", n)``: likewise, then report everything and end."""
    try:
        client = connect(url, _PATIENT)
        receiver = ExperienceReceiver(client, ReceiverConfig(), RUN, spec.num_shards, settings=_PATIENT)
        receiver.start()
        janitor = HubJanitor(client, RetentionConfig(max_age_s=120.0), RUN, spec.num_shards, ReceiverConfig(),
                             dead_letters=receiver.count_dead_letters)
        if spec.sync == "lockstep":
            ProductionQuota(client, RUN).load_script()
        results.put(("ready", os.getpid(), None))
        acked: list[tuple[float, int, int]] = []
        origins: set[tuple[str, int, int]] = set()
        duplicates = chunks = timeouts = 0
        target: tuple[str, int] | None = None
        deadline = math.inf
        next_gc = time.monotonic() + _GC_EVERY_S
        drained: list[tuple[float, float]] = [(time.monotonic(), time.process_time())]
        while True:
            if target is None:
                try:
                    target = control.get_nowait()
                    deadline = time.monotonic() + _DRAIN_TIMEOUT_S
                except queue.Empty:
                    pass
            if target is not None and chunks >= target[1]:
                drained.append((time.monotonic(), time.process_time()))
                if target[0] == "finish":
                    break
                results.put(("drained", os.getpid(), drained[-1]))
                target, deadline = None, math.inf
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {chunks} of {target and target[1]} chunks came within {_DRAIN_TIMEOUT_S}s")
            try:
                batch = receiver.receive(max_chunks=spec.profile.receive_batch, block_ms=50)
            except _OUTAGES:  # the learner's OutageGuard rides these out; the receiver recovers
                timeouts += 1
                continue
            if batch:
                receiver.ack(batch)
                acked.append((time.monotonic(), sum(item.chunk.num_steps for item in batch), len(batch)))
                for item in batch:
                    chunks += 1
                    origin = item.origin
                    key = ("", -1, chunks) if origin is None else (origin.sender, origin.seq, origin.position)
                    if key in origins:
                        duplicates += 1
                    origins.add(key)
            if time.monotonic() >= next_gc:
                try:
                    janitor.run_once()
                except _OUTAGES:
                    timeouts += 1
                next_gc = time.monotonic() + _GC_EVERY_S
        results.put(("done", os.getpid(), {
            "acked": _arrays(acked, 3), "chunks": chunks, "unique": len(origins), "duplicates": duplicates,
            "drained": _arrays(drained, 2), "stats": receiver.stats()._asdict(), "dead": dict(receiver.dead_by_reason),
            "timeouts": timeouts}))
        client.close()
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


def _publisher(spec: CaseSpec, url: str, params: ParamDict, control: Any, results: Any) -> None:
    """Publish a tiny v1 (and in lockstep grant it plenty) before the agents start, so that setup
    moves no big blob; in phase B publish the real parameters at its start and every
    ``publish_every_s`` (each version's weights differ)."""
    try:
        client = connect(url, _PATIENT)
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
            except _OUTAGES as exc:  # the learner logs it and publishes again after its next update
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
        window: Window = control.get(timeout=_SETUP_TIMEOUT_S * 2)
        due = window.start
        while spec.broadcast.enabled and due < window.end:
            time.sleep(max(0.0, due - time.monotonic()))
            weights[nudged] = weights[nudged].copy()
            weights[nudged].flat[0] += 1  # a new version's bytes differ from the last one's
            publish(weights)
            due += cfg.publish_every_s
        nbytes = int(client.hget(RunKeys(RUN).params.meta, "nbytes") or 0)
        results.put(("done", os.getpid(), {"publishes": _arrays(rows, 3), "nbytes": nbytes, "failed": failed}))
        client.close()
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


def _probe(url: str, control: Any, results: Any) -> None:
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
            except _OUTAGES:  # counted at its timeout: the latency an agent would have seen
                middle = time.perf_counter()
                timeouts += 1
            polls.append((time.monotonic(), middle - start))
            pings.append((time.monotonic(), time.perf_counter() - middle))
            time.sleep(_PROBE_EVERY_S)
        results.put(("done", os.getpid(), {"poll": _arrays(polls, 2), "ping": _arrays(pings, 2), "timeouts": timeouts}))
        client.close()
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc()))


# ---------------------------------------------------------------- server and machine readings

def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores so far (/proc/stat)."""
    with open("/proc/stat") as stat:
        values = [float(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)
    return sum(values) - idle, sum(values)


def _snapshot(servers: Sequence[tuple[str, RedisClient]]) -> dict[str, Any]:
    out: dict[str, Any] = {"t": time.monotonic(), "machine": _machine_busy()}
    for label, client in servers:
        stats = client.info("stats")
        memory = client.info("memory")
        out[label] = {
            "cpu": server_cpu_s(client),
            "clients": int(client.info("clients")["connected_clients"]),
            "mem_clients": int(memory["mem_clients_normal"]),
            "used_memory": int(memory["used_memory"]),
            "net_out": int(stats["total_net_output_bytes"]),
            "net_in": int(stats["total_net_input_bytes"]),
            "cmd_usec": {name.removeprefix("cmdstat_"): float(v["usec"])
                         for name, v in client.info("commandstats").items()},
        }
    return out


class _Mailbox:
    """The children's messages ``(kind, pid, payload)``, kept until asked for."""

    def __init__(self, results: Any) -> None:
        self.results = results
        self.kept: dict[tuple[str, int], Any] = {}

    def wait_for(self, pids: set[int], what: str, timeout: float,
                 servers: Sequence[tuple[str, RedisClient]] = (), samples: list[dict[str, Any]] | None = None
                 ) -> dict[int, Any]:
        """The ``what`` messages of ``pids``; raises with a child's traceback. With ``samples``,
        a snapshot of ``servers`` is appended every 0.5 s meanwhile."""
        deadline = time.monotonic() + timeout
        while not all((what, pid) in self.kept for pid in pids):
            try:
                kind, pid, payload = self.results.get(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = [pid for pid in pids if (what, pid) not in self.kept]
                    raise RuntimeError(f"{len(missing)} processes not {what} within {timeout:.0f}s") from None
                if samples is not None:
                    samples.append(_snapshot(servers))
                continue
            if kind == "error":
                raise RuntimeError(f"a bench process failed:\n{payload}")
            self.kept[(kind, pid)] = payload
        return {pid: self.kept.pop((what, pid)) for pid in pids}


def _sleep_until(instant: float, servers: Sequence[tuple[str, RedisClient]], samples: list[dict[str, Any]]) -> None:
    while (left := instant - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        if time.monotonic() < instant:
            samples.append(_snapshot(servers))


def _merge_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            out[key] = out.get(key, 0) + n
    return out


def _pct(samples: np.ndarray, q: float) -> float | None:
    return float(np.percentile(samples, q)) if len(samples) else None


def _in(rows: np.ndarray, t0: float, t1: float) -> np.ndarray:
    return rows[(rows[:, 0] >= t0) & (rows[:, 0] < t1)] if len(rows) else rows


def _steps_in(series: Sequence[np.ndarray], t0: float, t1: float) -> float:
    """Env steps the agents made between t0 and t1 (each agent's cumulative count)."""
    total = 0.0
    for rows in series:
        if not len(rows):
            continue
        before = rows[rows[:, 0] < t0, 1]
        upto = rows[rows[:, 0] < t1, 1]
        total += (upto[-1] if len(upto) else 0.0) - (before[-1] if len(before) else 0.0)
    return total


def version_ages(versions: Sequence[np.ndarray], publishes: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """Every agent's version age (live version - the version it holds, in publishes) on a 50 ms
    grid from t0 to t1, all agents together. ``versions``: per agent, rows (time loaded, version);
    ``publishes``: rows (time live, version, ...)."""
    grid = np.arange(t0, t1, _AGE_GRID_S)
    if not len(publishes) or not len(grid):
        return np.zeros(0)
    order = np.argsort(publishes[:, 0])
    live_t, live_v = publishes[order, 0], np.maximum.accumulate(publishes[order, 1])
    live_index = np.searchsorted(live_t, grid, side="right") - 1
    live = np.where(live_index >= 0, live_v[np.maximum(live_index, 0)], 0.0)
    ages = []
    for rows in versions:
        if not len(rows):
            continue
        index = np.searchsorted(rows[:, 0], grid, side="right") - 1
        held = np.where(index >= 0, rows[np.maximum(index, 0), 1], 0.0)
        ages.append(live - held)
    return np.concatenate(ages) if ages else np.zeros(0)


def _ms(samples: np.ndarray) -> dict[str, float | None]:
    seconds = samples[:, 1] if len(samples) else np.zeros(0)
    p50, p99 = _pct(seconds, 50), _pct(seconds, 99)
    return {"n": int(len(seconds)), "p50_ms": None if p50 is None else 1e3 * p50,
            "p99_ms": None if p99 is None else 1e3 * p99}


# ---------------------------------------------------------------- one case

class _Marks(NamedTuple):
    """The instants of one case (``time.monotonic()``) and the server snapshots taken at them."""

    before_agents: dict[str, Any]  # the reader, publisher and this process connected, no agent yet
    idle: tuple[dict[str, Any], dict[str, Any]]
    a: Window  # phase A: experience and polls
    a_drained: dict[str, Any]  # snapshot once the reader had every chunk stored in phase A
    a_start: dict[str, Any]
    a_measured: dict[str, Any]
    a_end: dict[str, Any]
    p: Window  # phase P: polls and publishes, no experience
    p_start: dict[str, Any]
    b: Window  # phase B: experience, polls and publishes
    b_start: dict[str, Any]
    b_end: dict[str, Any]
    b_drained: dict[str, Any]  # once the reader had every chunk stored in phase B (before the last flush)


def run_case(spec: CaseSpec, params: ParamDict) -> dict[str, Any]:
    """Measure one case (see the module docstring) and return its results. Blocks for setup plus
    ``warmup_s + quiet_s + loaded_s`` plus two drains; starts and stops its own servers and
    processes. Raises RuntimeError with a child's traceback when one fails."""
    log.info("case %s: setting up", spec.label)
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    with hub_servers(spec) as hub:
        ctx = mp.get_context("fork")  # this process never imports torch (load_params spawns for it)
        results = ctx.Queue()
        mail = _Mailbox(results)
        learner_control, publisher_control, probe_control = ctx.Queue(), ctx.Queue(), ctx.Queue()
        procs: list[Any] = []

        def spawn(target: Callable[..., None], *args: Any) -> int:
            proc = ctx.Process(target=target, args=(*args, results), daemon=True)
            proc.start()
            procs.append(proc)
            if proc.pid is None:
                raise RuntimeError(f"{target.__name__} did not start")
            return proc.pid

        try:
            learner = spawn(_learner, spec, hub.url, learner_control)
            mail.wait_for({learner}, "ready", _SETUP_TIMEOUT_S)
            publisher = spawn(_publisher, spec, hub.url, params, publisher_control)
            mail.wait_for({publisher}, "ready", _SETUP_TIMEOUT_S)
            before_agents = _snapshot(hub.servers)
            workers = min(spec.workers, spec.agents)
            ids = [list(range(w, spec.agents, workers)) for w in range(workers)]
            controls = [ctx.Queue() for _ in ids]
            worker_pids = {spawn(_agent_worker, spec, hub, agent_ids, control) for agent_ids, control in zip(ids, controls)}
            probe = spawn(_probe, hub.url, probe_control)
            mail.wait_for({*worker_pids, probe}, "ready", _SETUP_TIMEOUT_S)
            setup_s = time.monotonic() - started
            idle_start = _snapshot(hub.servers)
            time.sleep(_IDLE_S)  # agents connected and waiting, the reader polling: the fixed cost
            idle = (idle_start, _snapshot(hub.servers))
            go = time.monotonic() + 0.2
            window_a = Window(go, go + spec.warmup_s, go + spec.warmup_s + spec.quiet_s)
            log.info("case %s: %d agents ready in %.1fs", spec.label, spec.agents, setup_s)
            for control in controls:
                control.put([window_a])
            _sleep_until(window_a.start, hub.servers, samples)
            a_start = _snapshot(hub.servers)
            _sleep_until(window_a.measured, hub.servers, samples)
            a_measured = _snapshot(hub.servers)
            _sleep_until(window_a.end, hub.servers, samples)
            a_end = _snapshot(hub.servers)
            paused = mail.wait_for(worker_pids, "paused", _SETUP_TIMEOUT_S, hub.servers, samples)
            learner_control.put(("drain", sum(paused.values())))
            mail.wait_for({learner}, "drained", _DRAIN_TIMEOUT_S + 30, hub.servers, samples)
            a_drained = _snapshot(hub.servers)
            start = time.monotonic() + 0.3
            window_p = Window(start, start, start + spec.params_s, produce=False)
            window_b = Window(window_p.end, window_p.end, window_p.end + spec.loaded_s)
            for control in controls:
                control.put([window_p, window_b])
            publisher_control.put(Window(window_p.start, window_p.start, window_b.end))
            _sleep_until(window_p.start, hub.servers, samples)
            p_start = _snapshot(hub.servers)
            _sleep_until(window_b.start, hub.servers, samples)
            b_start = _snapshot(hub.servers)
            _sleep_until(window_b.end, hub.servers, samples)
            b_end = _snapshot(hub.servers)
            ended = mail.wait_for(worker_pids, "ended", _SETUP_TIMEOUT_S, hub.servers, samples)
            learner_control.put(("drain", sum(ended.values())))
            mail.wait_for({learner}, "drained", _DRAIN_TIMEOUT_S + 30, hub.servers, samples)
            b_drained = _snapshot(hub.servers)
            for control in controls:
                control.put("flush")
            done = mail.wait_for(worker_pids, "done", _SETUP_TIMEOUT_S, hub.servers, samples)
            stored = int(sum(s["chunks"] for payload in done.values() for s in payload["senders"]))
            learner_control.put(("finish", stored))
            learner_done = mail.wait_for({learner}, "done", _DRAIN_TIMEOUT_S + 30, hub.servers, samples)[learner]
            probe_control.put("stop")
            publisher_done = mail.wait_for({publisher}, "done", 30)[publisher]
            probe_done = mail.wait_for({probe}, "done", 30)[probe]
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    marks = _Marks(before_agents, idle, window_a, a_drained, a_start, a_measured, a_end, window_p, p_start, window_b, b_start, b_end,
                   b_drained)
    out = _summarize(spec, hub, marks, samples, list(done.values()), learner_done, publisher_done, probe_done)
    out["setup_s"] = round(setup_s, 2)
    out["seconds"] = round(time.monotonic() - started, 2)
    log.info("case %s: %s", spec.label, _headline(out))
    return out


def _headline(out: Mapping[str, Any]) -> str:
    a, b = out["phase_a"], out["phase_b"]
    cap = out["capacity"]["agents_per_hub"]
    return (f"offered {out['offered_sps']:,.0f}/s, produced {a['produced_sps']:,.0f}, acked {a['acked_sps']:,.0f} "
            f"(B: {b['produced_sps']:,.0f}, {b['acked_sps']:,.0f}); busiest Redis {a['redis_cpu_frac_max']:.2f}/"
            f"{b['redis_cpu_frac_max']:.2f} CPU; version age p99 {b.get('version_age_p99')}; "
            f"{'-' if cap is None else f'{cap:,.0f}'} agents per hub at full rate")


def _phase(spec: CaseSpec, labels: Sequence[str], window: Window, first: Mapping[str, Any], last: Mapping[str, Any],
           merged: Mapping[str, np.ndarray], steps: Sequence[np.ndarray], acked: np.ndarray, probe: Mapping[str, Any],
           samples: Sequence[Mapping[str, Any]], client_cpu_s: float) -> dict[str, Any]:
    """Rates, latencies and server loads over ``window.measured .. window.end``."""
    t0, t1 = window.measured, window.end
    dur = t1 - t0
    cpu = {label: last[label]["cpu"] - first[label]["cpu"] for label in labels}
    usec = {label: {cmd: v - first[label]["cmd_usec"].get(cmd, 0.0) for cmd, v in last[label]["cmd_usec"].items()}
            for label in labels}
    downloads = _in(merged["download"], t0, t1)
    busy = (last["machine"][0] - first["machine"][0]) / max(1.0, last["machine"][1] - first["machine"][1])
    peak = [s for s in samples if t0 <= s["t"] < t1] + [last]
    return {
        "seconds": dur,
        "produced_sps": _steps_in(steps, t0, t1) / dur,
        "acked_sps": float(_in(acked, t0, t1)[:, 1].sum()) / dur if len(acked) else 0.0,
        "insert": _ms(_in(merged["insert"], t0, t1)),
        "poll": _ms(_in(merged["poll"], t0, t1)),
        "claim": _ms(_in(merged["claim"], t0, t1)),
        "download": _ms(downloads),
        "probe_poll": _ms(_in(probe["poll"], t0, t1)),
        "probe_ping": _ms(_in(probe["ping"], t0, t1)),
        "redis_cpu_frac": {label: c / dur for label, c in cpu.items()},
        "redis_cpu_frac_max": max(c / dur for c in cpu.values()),
        "param_cmd_usec_share": {label: sum(max(0.0, u.get(c, 0.0)) for c in PARAM_COMMANDS)
                                 / max(1.0, sum(max(0.0, v) for v in u.values())) for label, u in usec.items()},
        "downloads": int(len(downloads)),
        "gb_served": float(downloads[:, 2].sum() / 1e9) if len(downloads) else 0.0,
        "gb_from_replicas": float((downloads[:, 2] * downloads[:, 3]).sum() / 1e9) if len(downloads) else 0.0,
        "machine_busy": busy,
        "client_cpu_frac": client_cpu_s / (window.end - window.start) / (os.cpu_count() or 1),
        "mem_clients_peak": {label: max(s[label]["mem_clients"] for s in peak) for label in labels},
    }


def _summarize(spec: CaseSpec, hub: HubServers, marks: _Marks, samples: list[dict[str, Any]],
               workers: list[dict[str, Any]], learner: dict[str, Any], publisher: dict[str, Any],
               probe: dict[str, Any]) -> dict[str, Any]:
    cfg = spec.profile
    labels = [label for label, _ in hub.servers]
    merged = {kind: np.concatenate([w[kind] for w in workers]) for kind in ("insert", "poll", "claim", "download")}
    steps = [rows for w in workers for rows in w["steps"]]
    versions = [rows for w in workers for rows in w["versions"]]
    senders = [s for w in workers for s in w["senders"]]
    acked, publishes, drained = learner["acked"], publisher["publishes"], learner["drained"]
    offered = spec.agents * cfg.rate
    a = _phase(spec, labels, marks.a, marks.a_measured, marks.a_end, merged, steps, acked, probe, samples,
               sum(w["cpu_s"][0] for w in workers))
    share_b = spec.loaded_s / (spec.params_s + spec.loaded_s)  # the agents' CPU of P and B, pro rata
    p = _phase(spec, labels, marks.p, marks.p_start, marks.b_start, merged, steps, acked, probe, samples,
               sum(w["cpu_s"][1] for w in workers) * (1 - share_b))
    b = _phase(spec, labels, marks.b, marks.b_start, marks.b_end, merged, steps, acked, probe, samples,
               sum(w["cpu_s"][1] for w in workers) * share_b)
    if spec.broadcast.enabled:
        ages = version_ages(versions, publishes, marks.b.measured, marks.b.end)
        if len(ages):
            b.update(version_age_p50=float(np.percentile(ages, 50)), version_age_p99=float(np.percentile(ages, 99)),
                     version_age_max=float(ages.max()), version_age_le2=float((ages <= 2).mean()),
                     # an agent still on the setup's v1 at the end is this far behind: a p99 there
                     # says only that some agents got none of the run's versions
                     version_age_cap=float(publishes[:, 1].max() - 1) if len(publishes) else 0.0)
    # Exact accounting: each phase's Redis CPU is counted from its start until the reader had all
    # of its chunks; less the idle rate (the reader's polling, the cron, idle connections, measured
    # with every agent connected and waiting) that is experience per transition in phase A, and in
    # phase B what is left after experience is the parameter traffic's.
    fixed = {label: (marks.idle[1][label]["cpu"] - marks.idle[0][label]["cpu"]) / (marks.idle[1]["t"] - marks.idle[0]["t"])
             for label in labels}
    t_a_drained, t_b_drained = drained[1, 0], drained[2, 0]
    steps_a = float(_in(acked, marks.a.start - 1.0, t_a_drained + 1e-6)[:, 1].sum()) if len(acked) else 0.0
    steps_b = float(_in(acked, t_a_drained + 1e-6, t_b_drained + 1e-6)[:, 1].sum()) if len(acked) else 0.0
    span_a = marks.a_drained["t"] - marks.a_start["t"]
    span_b = marks.b_drained["t"] - marks.b_start["t"]
    cpu_a = {label: marks.a_drained[label]["cpu"] - marks.a_start[label]["cpu"] for label in labels}
    cpu_b = {label: marks.b_drained[label]["cpu"] - marks.b_start[label]["cpu"] for label in labels}
    per_t = {label: max(0.0, cpu_a[label] - fixed[label] * span_a) / steps_a if steps_a else None for label in labels}
    param_cpu = {label: max(0.0, cpu_b[label] - fixed[label] * span_b - (per_t[label] or 0.0) * steps_b)
                 for label in labels}
    late = _in(merged["download"], marks.b.start, math.inf)  # those ending after the window too
    gb = float(late[:, 2].sum() / 1e9) if len(late) else 0.0
    params_server = hub.params_server
    # Phase P: parameter traffic alone, counted in the bytes each server sent (pieces in flight at
    # its end count where they were sent).
    span_p = marks.b_start["t"] - marks.p_start["t"]
    net_p = {label: (marks.b_start[label]["net_out"] - marks.p_start[label]["net_out"]) / 1e9 for label in labels}
    cpu_p = {label: marks.b_start[label]["cpu"] - marks.p_start[label]["cpu"] for label in labels}
    per_gb = {label: max(0.0, cpu_p[label] - fixed[label] * span_p) / net_p[label] if net_p[label] > 1e-3 else None
              for label in labels}
    total_net_p = sum(net_p.values())
    download_share = _download_share(spec.hub, params_server, net_p, p, b)
    out: dict[str, Any] = {
        "label": spec.label, "spec": asdict(spec), "profile": asdict(cfg), "offered_sps": offered,
        "phase_a": a, "phase_p": p, "phase_b": b,
        "totals": {kind: _ms(rows) for kind, rows in merged.items()},
        "accounting": {"fixed_cpu_frac": fixed, "phase_a_steps": steps_a, "phase_b_steps": steps_b,
                       "phase_a_cpu_s": cpu_a, "phase_b_cpu_s": cpu_b, "phase_a_span_s": span_a,
                       "phase_b_span_s": span_b, "drain_a_s": t_a_drained - marks.a.end,
                       "drain_b_s": t_b_drained - marks.b.end, "param_cpu_s": param_cpu,
                       "phase_p_cpu_s": cpu_p, "phase_p_net_gb": net_p, "phase_p_span_s": span_p},
        "redis_cpu_s_per_1k_transitions": {label: None if v is None else 1e3 * v for label, v in per_t.items()},
        "redis_cpu_s_per_1k_total": 1e3 * sum(v or 0.0 for v in per_t.values()) if steps_a else None,
        "redis_cpu_s_per_gb": per_gb,
        "param_gb_share": {label: net_p[label] / total_net_p if total_net_p else None for label in labels},
        "param_download_share": download_share,
        "redis_cpu_s_per_gb_mixed": {label: param_cpu[label] / gb if gb else None for label in labels},
        "params_server": params_server,
        "param_share_of_params_server": param_cpu[params_server] / cpu_b[params_server] if cpu_b[params_server] else None,
        "connections": {label: marks.a_end[label]["clients"] for label in labels},
        "mem_per_connection_bytes": {label: marks.a_end[label]["mem_clients"] / max(1, marks.a_end[label]["clients"])
                                     for label in labels},
        "used_memory_idle": {label: marks.idle[0][label]["used_memory"] for label in labels},
        "memory_per_agent_bytes": {
            label: (marks.idle[0][label]["used_memory"] - marks.before_agents[label]["used_memory"])
            / max(1, marks.idle[0][label]["clients"] - marks.before_agents[label]["clients"]) for label in labels},
        "used_memory_end": {label: marks.b_drained[label]["used_memory"] for label in labels},
        "param_nbytes": publisher["nbytes"],
        "chunks_stored": int(sum(s["chunks"] for s in senders)),
        "chunks_dropped": int(sum(s["chunks_dropped"] for s in senders)),
        "steps_dropped": int(sum(s["steps_dropped"] for s in senders)),
        "sender_retries": int(sum(s["missing_retries"] + s["oom_retries"] + s["error_retries"] for s in senders)),
        "chunks_acked": learner["chunks"], "chunks_unique": learner["unique"], "chunks_duplicated": learner["duplicates"],
        "receiver": learner["stats"], "dead_letters": learner["dead"],
        "learner_cpu_frac": {"a": (drained[1, 1] - drained[0, 1]) / max(1e-9, t_a_drained - drained[0, 0]),
                             "b": (drained[2, 1] - drained[1, 1]) / max(1e-9, t_b_drained - t_a_drained)},
        "claim_wait_s": sum(w["claim_wait_s"] for w in workers),
        "agent_log_counts": _merge_counts(w["log_counts"] for w in workers),
        "param_fetch_failures": sum(n for w in workers for k, n in w["log_counts"].items()
                                    if "parameter fetch failed" in k),
        "reader_timeouts": learner["timeouts"], "probe_timeouts": probe["timeouts"],
        "publish_failures": publisher["failed"],
        "load_avg": os.getloadavg(),
    }
    out["capacity"] = capacity(spec, fixed, per_t, per_gb, download_share, publisher["nbytes"], params_server)
    return out


def _download_share(hub: str, params_server: str, net_p: Mapping[str, float],
                    *phases: Mapping[str, Any]) -> dict[str, float]:
    """Each server's share of the downloads as the agents saw them in the first of ``phases``
    that completed any: with read replicas, the primary's is what agents read from it (its bytes
    are mostly the replication stream, which :func:`capacity` counts apart; none completed: 0)
    and the replicas split the rest as their bytes in phase P did (evenly if they sent none)."""
    if hub != "replicas":
        return {label: float(label == params_server) for label in net_p}
    served = next((phase for phase in phases if phase["gb_served"]), None)
    from_replicas = 1.0 if served is None else served["gb_from_replicas"] / served["gb_served"]
    replicas = [label for label in net_p if label != params_server]
    replica_net = sum(net_p[label] for label in replicas)
    return {label: 1.0 - from_replicas if label == params_server
            else from_replicas * (net_p[label] / replica_net if replica_net else 1 / len(replicas)) for label in net_p}


def capacity(spec: CaseSpec, fixed: Mapping[str, float], per_t: Mapping[str, float | None],
             per_gb: Mapping[str, float | None], download_share: Mapping[str, float | None], nbytes: int,
             params_server: str) -> dict[str, Any]:
    """What each server's one thread would carry with every agent at the full rate: its idle rate;
    its experience CPU per transition x the offered rate; its CPU per GB (phase P) x its share of
    the downloads x the GB/s that N agents downloading every version they fetch need; and, on a
    primary with read replicas, its CPU per GB x the replication stream of each publish to each
    replica (which does not grow with N). The busiest server bounds the hub: ``agents_per_hub`` is
    the N that fills its core (load 1.0), experience and parameters together and experience
    alone; ``param_share_at_full_rate``: the parameters' share of the load of the server holding
    them (the primary)."""
    cfg = spec.profile
    needed = 0.0
    if spec.broadcast.enabled:
        needed = spec.agents * nbytes / cfg.publish_every_s / spec.broadcast.min_version_lag / 1e9
    replication = 0.0
    if spec.hub == "replicas" and spec.broadcast.enabled:
        replication = nbytes * spec.replicas / cfg.publish_every_s / 1e9
    experience = {label: (v or 0.0) * spec.agents * cfg.rate for label, v in per_t.items()}
    downloads = {label: (per_gb[label] or 0.0) * (download_share.get(label) or 0.0) * needed for label in per_t}
    base = {label: fixed[label] + (per_gb[label] or 0.0) * replication * (label == params_server) for label in per_t}
    params = {label: downloads[label] + base[label] - fixed[label] for label in per_t}
    load = {label: base[label] + experience[label] + downloads[label] for label in per_t}

    def fits(label: str, with_params: bool) -> float:
        per_agent = (experience[label] + downloads[label] * with_params) / spec.agents
        return (1.0 - base[label] * with_params - fixed[label] * (not with_params)) / per_agent if per_agent > 0 else math.inf

    bottleneck = min(per_t, key=lambda label: fits(label, True))
    agents = fits(bottleneck, True)
    exp_only = min(fits(label, False) for label in per_t)
    return {"needed_gb_per_s": needed, "replication_gb_per_s": replication, "load_at_full_rate": load,
            "param_load_at_full_rate": params, "bottleneck": bottleneck,
            "agents_per_hub": None if math.isinf(agents) else agents,
            "agents_per_hub_experience_only": None if math.isinf(exp_only) else exp_only,
            "param_share_at_full_rate": params[params_server] / load[params_server] if load[params_server] else None}


# ---------------------------------------------------------------- the whole benchmark

@dataclass(frozen=True)
class BenchPlan:
    """Which cases :func:`run_scale_bench` measures: every env of ``envs`` at each N of ``agents``
    on one primary, at ``replica_agents`` with read replicas and at ``cluster_agents`` on a
    cluster (``cluster_envs`` only); Pong at ``lockstep_agents`` producing on grants; and at
    ``broadcast_agents`` Pong agents (section 2) the parameter-broadcast options of
    :data:`BROADCAST_OPTIONS`. Times in seconds (see :class:`CaseSpec`)."""

    envs: tuple[str, ...] = ("pong", "halfcheetah")
    agents: tuple[int, ...] = (8, 64, 256, 1024)
    replica_agents: tuple[int, ...] = (256, 1024)
    replica_envs: tuple[str, ...] = ("pong",)
    cluster_agents: tuple[int, ...] = (256, 1024)
    cluster_envs: tuple[str, ...] = ("pong",)
    broadcast_agents: int | None = 1024
    lockstep_agents: tuple[int, ...] = (256,)
    workers: int = 4
    warmup_s: float = 0.5
    quiet_s: float = 2.0
    params_s: float = 1.5
    loaded_s: float = 3.0
    publish_every_s: float | None = None

    @classmethod
    def quick(cls) -> BenchPlan:
        return cls(agents=(8,), replica_agents=(), cluster_agents=(), broadcast_agents=None, lockstep_agents=(8,),
                   workers=2, warmup_s=0.3, quiet_s=1.2, params_s=1.0, loaded_s=2.0)

    def cases(self) -> list[CaseSpec]:
        common: dict[str, Any] = {"workers": self.workers, "warmup_s": self.warmup_s, "quiet_s": self.quiet_s,
                                  "params_s": self.params_s, "loaded_s": self.loaded_s,
                                  "publish_every_s": self.publish_every_s}
        cases = [CaseSpec(env, n, **common) for env in self.envs for n in self.agents]
        cases += [CaseSpec(env, n, hub="replicas", **common)
                  for env in self.envs if env in self.replica_envs for n in self.replica_agents]
        cases += [CaseSpec(env, n, hub="cluster", **common)
                  for env in self.envs if env in self.cluster_envs for n in self.cluster_agents]
        if "pong" in self.envs:
            cases += [CaseSpec("pong", n, sync="lockstep", **common) for n in self.lockstep_agents]
            if self.broadcast_agents:
                cases += [CaseSpec("pong", self.broadcast_agents, hub=hub, broadcast=options, **common)
                          for hub, options in BROADCAST_OPTIONS]
        return cases


BROADCAST_OPTIONS: tuple[tuple[str, BroadcastOptions], ...] = (
    ("primary", BroadcastOptions(min_version_lag=2)),
    ("primary", BroadcastOptions(dtype="float16")),
    ("replicas", BroadcastOptions(dtype="float16")),
    ("replicas", BroadcastOptions(dtype="float16", min_version_lag=2)),
)
"""Section 2's options besides plain fp32 downloads (measured in section 1): agents downloading
every other version, fp16 payloads, read replicas, and the two together."""


def _role(case: Mapping[str, Any], label: str) -> str:
    if label == case["params_server"]:
        return "params"
    return "replica" if label.startswith("replica") else "other"


def pooled_per_gb(cases: Sequence[Mapping[str, Any]], least_gb: float = 0.05) -> dict[tuple[str, str], float]:
    """Redis CPU seconds per GB of phase P pooled over every case of one hub kind, per server role
    (``params``: the server holding the parameter keys; ``replica``; ``other``: cluster nodes
    without them), over the cases whose servers sent at least ``least_gb`` (a small blob's few
    MB leave the figure to noise)."""
    cpu: dict[tuple[str, str], float] = {}
    gb: dict[tuple[str, str], float] = {}
    for case in cases:
        acc = case["accounting"]
        for label, net in acc["phase_p_net_gb"].items():
            if net < least_gb:
                continue
            key = (case["spec"]["hub"], _role(case, label))
            cpu[key] = cpu.get(key, 0.0) + max(0.0, acc["phase_p_cpu_s"][label]
                                               - acc["fixed_cpu_frac"][label] * acc["phase_p_span_s"])
            gb[key] = gb.get(key, 0.0) + net
    return {key: cpu[key] / gb[key] for key in cpu}


def pooled_per_t(cases: Sequence[Mapping[str, Any]], least_steps: float = 2000) -> dict[tuple[str, str, str], float]:
    """Redis CPU seconds per transition per (env, hub kind, server role), pooled over every case
    of that env and hub kind whose phase A stored at least ``least_steps`` transitions: the
    phases' CPU beyond the idle rate over all their transitions."""
    cpu: dict[tuple[str, str, str], float] = {}
    steps: dict[tuple[str, str, str], float] = {}
    for case in cases:
        acc = case["accounting"]
        if acc["phase_a_steps"] < least_steps:
            continue
        for label, used in acc["phase_a_cpu_s"].items():
            key = (case["spec"]["env"], case["spec"]["hub"], _role(case, label))
            cpu[key] = cpu.get(key, 0.0) + max(0.0, used - acc["fixed_cpu_frac"][label] * acc["phase_a_span_s"])
            steps[key] = steps.get(key, 0.0) + acc["phase_a_steps"]
    return {key: cpu[key] / steps[key] for key in cpu}


def pooled_capacity(case: Mapping[str, Any], pooled: Mapping[tuple[str, str], float],
                    per_t_pooled: Mapping[tuple[str, str, str], float]) -> dict[str, Any]:
    """:func:`capacity` of ``case`` with the pooled CPU per GB of its hub kind and the pooled
    per-transition CPU of its env and hub kind (its own values where nothing was pooled for a
    server's role): the costs of all N together, applied to this case's N, shares and idle rate."""
    raw = case["spec"]
    spec = CaseSpec(**{**raw, "broadcast": BroadcastOptions(**raw["broadcast"])})
    per_t = {label: per_t_pooled.get((raw["env"], raw["hub"], _role(case, label)),
                                     None if v is None else v / 1e3)
             for label, v in case["redis_cpu_s_per_1k_transitions"].items()}
    per_gb = {label: pooled.get((raw["hub"], _role(case, label)), case["redis_cpu_s_per_gb"][label]) for label in per_t}
    share = _download_share(raw["hub"], case["params_server"], case["accounting"]["phase_p_net_gb"], case["phase_p"],
                            case["phase_b"])
    return capacity(spec, case["accounting"]["fixed_cpu_frac"], per_t, per_gb, share, case["param_nbytes"],
                    case["params_server"])


def machine() -> dict[str, Any]:
    """CPU count, model and load of this machine."""
    model = ""
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "load_avg": os.getloadavg()}


def run_scale_bench(plan: BenchPlan, quick: bool = False) -> dict[str, Any]:
    """Every case of ``plan`` one after another, the fp16 logit check (fresh weights; also
    trained ones, :func:`trained_pong_params`, unless ``quick``), capacities and the
    parameter-broadcast targets (section 2: with ``broadcast_agents`` Pong agents, version age
    p99 <= 2 publishes and < 25% of the parameter server's CPU on parameters; which options meet
    them). Blocks for the whole run."""
    started = time.monotonic()
    params = load_params(plan.envs)
    out: dict[str, Any] = {"quick": quick, "machine_start": machine(), "plan": asdict(plan), "cases": []}
    for spec in plan.cases():
        out["cases"].append(run_case(spec, params[spec.env]))
    pooled = pooled_per_gb(out["cases"])
    per_t = pooled_per_t(out["cases"])
    out["pooled_cpu_s_per_gb"] = {f"{hub} {role}": v for (hub, role), v in pooled.items()}
    out["pooled_cpu_s_per_1k_transitions"] = {f"{env} {hub} {role}": 1e3 * v for (env, hub, role), v in per_t.items()}
    for case in out["cases"]:
        case["capacity_pooled"] = pooled_capacity(case, pooled, per_t)
    if "pong" in params:
        out["fp16_check"] = fp16_logit_check(params["pong"])
        if not quick:
            with mp.get_context("spawn").Pool(1) as pool:  # torch stays out of this process
                out["fp16_check_trained"] = fp16_logit_check(pool.apply(trained_pong_params))
    out["broadcast"] = broadcast_summary(out["cases"], plan.broadcast_agents)
    out["machine_end"] = machine()
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def broadcast_summary(cases: Sequence[Mapping[str, Any]], agents: int | None) -> list[dict[str, Any]]:
    """Section 2: every Pong case at ``agents`` (at the largest N measured when None) with
    parameters on: version age p99 in phase B (target <= 2 publishes) and the parameter server's
    CPU share on parameters (target < 25%), both as measured here (phase B, this machine's agents
    short of CPU) and at the full rate (the pooled capacity model)."""
    pong = [c for c in cases if c["spec"]["env"] == "pong" and c["spec"]["broadcast"]["enabled"]]
    if not pong:
        return []
    n = agents if agents is not None else max(c["spec"]["agents"] for c in pong)
    rows = []
    for case in pong:
        if case["spec"]["agents"] != n:
            continue
        b = case["phase_b"]
        age, share = b.get("version_age_p99"), case["param_share_of_params_server"]
        model = case.get("capacity_pooled", case["capacity"])
        full_share = model["param_share_at_full_rate"]
        params_load = model["load_at_full_rate"][case["params_server"]]
        rows.append({"label": case["label"], "version_age_p99": age, "version_age_le2": b.get("version_age_le2"),
                     "version_age_cap": b.get("version_age_cap"),
                     "param_cpu_share": share, "param_share_at_full_rate": full_share,
                     "params_server_load_at_full_rate": params_load,
                     "param_only_load_at_full_rate": max(model["param_load_at_full_rate"].values()),
                     "busiest_load_at_full_rate": max(model["load_at_full_rate"].values()),
                     "age_met": age is not None and age <= 2, "share_met": share is not None and share < 0.25,
                     "share_met_at_full_rate": full_share is not None and full_share < 0.25,
                     "produced_over_offered": b["produced_sps"] / case["offered_sps"],
                     "download_p99_ms": b["download"]["p99_ms"], "gb_served_per_s": b["gb_served"] / b["seconds"],
                     "needed_gb_per_s": model["needed_gb_per_s"]})
    return rows


# ---------------------------------------------------------------- the figure

def scale_figure(result: Mapping[str, Any]) -> Any:
    """Top row, over N (log scale), a line per env and hub (fp32, free production): produced over
    offered env steps/s (phase A: what this machine's agents could make); agents one hub would carry at the full rate (the pooled model);
    p99 insert (solid) and download (dotted) latency; version age p99 (phase B). Bottom row, the
    parameter-broadcast options at the section-2 N: version age p99, the parameters' share of the
    parameter server's CPU at the full rate, and the busiest server's load at the full rate."""
    from surreal_redis.plots import _figure

    figure = _figure(4, width=4.2, height=7.2)
    axes = [figure.add_subplot(2, 4, i + 1) for i in range(4)]
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for case in result["cases"]:
        spec = case["spec"]
        if spec["broadcast"] != asdict(BroadcastOptions()) or spec["sync"] != "free":
            continue
        lines.setdefault(f"{spec['env']} {spec['hub']}", []).append(case)
    for number, (name, cases) in enumerate(sorted(lines.items())):
        cases = sorted(cases, key=lambda c: c["spec"]["agents"])
        n = [c["spec"]["agents"] for c in cases]
        style: dict[str, Any] = {"color": f"C{number % 10}", "marker": "o", "label": name}
        axes[0].plot(n, [max(c["phase_a"]["produced_sps"], 1.0) / c["offered_sps"] for c in cases], **style)
        model = [c.get("capacity_pooled", c["capacity"])["agents_per_hub"] for c in cases]
        axes[1].plot(n, [math.nan if m is None else m for m in model], **style)
        axes[2].plot(n, [c["totals"]["insert"]["p99_ms"] or math.nan for c in cases], **style)
        axes[2].plot(n, [c["phase_b"]["download"]["p99_ms"] or math.nan for c in cases], linestyle=":",
                     **{**style, "label": None})
        axes[3].plot(n, [c["phase_b"].get("version_age_p99", math.nan) for c in cases], **style)
    titles = ("produced / offered env steps/s (A)", "agents one hub carries at full rate",
              "p99 ms: insert (solid), download (dotted)", "version age p99, publishes (B)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("simulated agents")
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
    for ax in axes[:3]:
        ax.set_yscale("log")
    axes[3].axhline(2, color="gray", linestyle=":", linewidth=1, label="target 2")
    axes[0].legend(fontsize="small")
    rows = result.get("broadcast") or []
    if rows:
        labels = [row["label"].split(" / ", 2)[-1] for row in rows]
        n = rows[0]["label"].split(" / ")[1]
        x = np.arange(len(rows))
        ax = figure.add_subplot(2, 4, 5)
        ax.bar(x - 0.2, [row["needed_gb_per_s"] for row in rows], 0.4, color="C7", label="needed at full rate")
        ax.bar(x + 0.2, [row["gb_served_per_s"] for row in rows], 0.4, color="C0", label="served here (B)")
        ax.set_yscale("log")
        ax.legend(fontsize="x-small")
        panels = (("parameters' share of their server, full rate", "param_share_at_full_rate", 0.25),
                  ("most parameter load on one server (cores), full rate", "param_only_load_at_full_rate", 1.0),
                  ("busiest server's load (cores), full rate", "busiest_load_at_full_rate", 1.0))
        axes_b = [ax] + [figure.add_subplot(2, 4, 6 + i) for i in range(3)]
        axes_b[0].set_title(f"parameter GB/s, {n} Pong agents", fontsize="small")
        for ax, (title, key, target) in zip(axes_b[1:], panels):
            values = [row[key] for row in rows]
            ax.bar(x, [math.nan if v is None else v for v in values], color=[f"C{i % 10}" for i in range(len(rows))])
            ax.axhline(target, color="gray", linestyle=":", linewidth=1)
            ax.set_title(f"{title}, {n} Pong agents", fontsize="small")
            if key != "param_share_at_full_rate":
                ax.set_yscale("log")
        for ax in axes_b:
            ax.set_xticks(x, labels, rotation=35, ha="right", fontsize="x-small")
            ax.grid(axis="y", alpha=0.3)
    mach = result.get("machine_start", {})
    figure.suptitle(f"bench/scale.py ({mach.get('cpus')} cores shared by the simulated agents, reader, publisher and Redis)")
    return figure


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) < 10 else f"{value:.0f}"


def _pair(summary: Mapping[str, Any]) -> str:
    return f"{_fmt(summary['p50_ms'])} / {_fmt(summary['p99_ms'])}" if summary["n"] else "—"


def markdown_tables(result: Mapping[str, Any]) -> str:
    """The results as the docs' two Markdown tables: per case, and the parameter-broadcast options."""
    lines = ["| env | hub | N | offered steps/s | produced / acked (A) | insert ms p50 / p99 | poll ms p50 / p99 "
             "| download ms p50 / p99 (B) | busiest Redis CPU A / B | Redis CPU-s per 1k steps | per GB (P) "
             "| KB per connection | agents per hub at full rate (experience only) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        spec, a, b = case["spec"], case["phase_a"], case["phase_b"]
        hub = spec["hub"] + ("" if spec["sync"] == "free" else f", {spec['sync']}")
        if spec["broadcast"] != asdict(BroadcastOptions()):
            hub += ", " + BroadcastOptions(**spec["broadcast"]).label
        model = case.get("capacity_pooled", case["capacity"])
        shares = {k: v or 0.0 for k, v in case["param_gb_share"].items()}
        per_gb = case["redis_cpu_s_per_gb"].get(max(shares, key=lambda k: shares[k]))
        kb = max(case["mem_per_connection_bytes"].values()) / 1024
        lines.append(
            f"| {spec['env']} | {hub} | {spec['agents']} | {_fmt(case['offered_sps'])} "
            f"| {_fmt(a['produced_sps'])} / {_fmt(a['acked_sps'])} | {_pair(case['totals']['insert'])} "
            f"| {_pair(a['poll'])} | {_pair(b['download'])} "
            f"| {a['redis_cpu_frac_max']:.2f} / {b['redis_cpu_frac_max']:.2f} "
            f"| {_fmt(case['redis_cpu_s_per_1k_total'], 3)} | {_fmt(per_gb)} | {kb:.1f} "
            f"| {_fmt(model['agents_per_hub'])} ({_fmt(model['agents_per_hub_experience_only'])}) |")
    rows = result.get("broadcast") or []
    if rows:
        lines += ["", "| parameters | version age p99 (B) | their share of its server's CPU (B) | at full rate "
                      "| most parameter load on one server at full rate | busiest server's load at full rate "
                      "| GB/s needed at full rate |",
                  "|---|---|---|---|---|---|---|"]
        for row in rows:
            capped = row["version_age_p99"] is not None and row["version_age_p99"] >= (row["version_age_cap"] or math.inf)
            lines.append(f"| {row['label']} | {'>= ' if capped else ''}{_fmt(row['version_age_p99'])} "
                         f"| {_fmt(row['param_cpu_share'])} "
                         f"| {_fmt(row['param_share_at_full_rate'])} | {_fmt(row['param_only_load_at_full_rate'])} "
                         f"| {_fmt(row['busiest_load_at_full_rate'])} "
                         f"| {_fmt(row['needed_gb_per_s'])} |")
    return "\n".join(lines)
