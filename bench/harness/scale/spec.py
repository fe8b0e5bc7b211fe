"""What the scale bench measures: the env profiles, one case (:class:`CaseSpec`), its phases
(:class:`Window`) and the whole plan (:class:`BenchPlan`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from surreal_redis.hub.params import ParameterClientConfig, PublisherConfig

RUN = "scale"
HUBS = ("primary", "replicas", "cluster")
SYNCS = ("free", "lockstep")
PARAM_COMMANDS = ("getrange", "hget", "hgetall")
"""Commands only the parameter path sends in this bench (polls, meta reads, blob pieces)."""
SETUP_TIMEOUT_S = 180.0
DRAIN_TIMEOUT_S = 120.0
ACTION_STEPS = 8
"""Vector steps a simulated agent makes per action (the agent's steps come in blocks of this many,
at its real pace); ``flush_steps`` and ``fetch_every_steps`` are multiples of it."""


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
    :func:`~harness.scale.params.fp16_logit_check`). ``min_version_lag``: the agents' ``hub.params_client.min_version_lag``
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
    SCHED_IDLE (see :func:`~harness.scale.workers.agent_worker`). Times in seconds."""

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


@dataclass(frozen=True)
class BenchPlan:
    """Which cases :func:`~harness.scale.run.run_scale_bench` measures: every env of ``envs`` at each N of ``agents``
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


