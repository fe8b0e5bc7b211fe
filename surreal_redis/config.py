"""The experiment config: one frozen dataclass tree, loaded from YAML and validated
(:mod:`surreal_redis.configtools`).

A ``*Config`` is the settings of one component or process, most defined beside it; a ``*Section``
only groups other configs under one YAML key (``hub:``, ``replay:``). ``algo: sac`` reads the
``sac:`` section into the class the SAC package declares (:mod:`surreal_redis.algos.registry`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from surreal_redis.algos.registry import UnknownAlgorithm, algorithm, algorithm_names
from surreal_redis.algos.spec import AlgorithmSpec
from surreal_redis.checkpoint import CheckpointConfig
from surreal_redis.configtools import (
    ConfigError,
    apply_overrides,
    build_dataclass,
    dump_yaml,
    from_dict,
    load_yaml,
    to_dict,
)
from surreal_redis.connection import RedisSettings
from surreal_redis.envs import EnvConfig
from surreal_redis.hub.experience.receiver import ReceiverConfig
from surreal_redis.hub.experience.retention import RetentionConfig
from surreal_redis.hub.experience.sender import SenderConfig
from surreal_redis.hub.params import ParameterClientConfig, PublisherConfig
from surreal_redis.keys import validate_run_name
from surreal_redis.plugins import load_plugins
from surreal_redis.replay.feeds import OffPolicyConfig
from surreal_redis.replay.fifo import FIFOReplayConfig
from surreal_redis.resources import resource_dir


@dataclass(frozen=True)
class RunConfig:
    """The run (YAML key ``experiment``): ``name`` is also the run name in Redis keys; results go to ``<root>/<name>/``."""

    name: str = "default"
    root: str = "./runs"
    seed: int = 0
    """Seeds the learner; agents and evaluators draw independent streams from it (numpy
    ``SeedSequence`` children by role and id: :mod:`surreal_redis.seeds`)."""

    def __post_init__(self) -> None:
        validate_run_name(self.name)


@dataclass(frozen=True)
class RedisConfig(RedisSettings):
    """Where Redis is (``url``; None: the launcher starts an embedded server) and how to talk to it."""

    maxmemory: str = "2gb"
    """maxmemory of the embedded server (noeviction: a full Redis makes agents back off)."""
    num_shards: int = 1
    """Experience streams; agent k writes to shard k mod num_shards."""
    param_read_urls: tuple[str, ...] = ()
    """Read replicas of ``url`` (servers started with ``replicaof``; redis://, rediss:// or unix://)
    that agents and evaluators poll and download parameters from, falling back to ``url`` when a
    replica lags or fails (``hub.params_client``); the learner always writes to ``url``."""
    startup_wait_s: float = 120.0
    """Seconds a learner, agent or eval started while Redis does not answer (restarting, its pod
    not ready) waits for it with capped backoff before it exits with an error naming the URL; 0:
    the error at once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.startup_wait_s >= 0:
            raise ValueError(f"startup_wait_s must be >= 0, got {self.startup_wait_s}")
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
        for url in self.param_read_urls:
            if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(f"param_read_urls: {url!r} is not a redis://, rediss:// or unix:// URL")

    def settings(self) -> RedisSettings:
        names = {f.name for f in dataclasses.fields(RedisSettings)}
        return RedisSettings(**{n: getattr(self, n) for n in names})


@dataclass(frozen=True)
class HubSection:
    sender: SenderConfig = field(default_factory=SenderConfig)
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
    params_client: ParameterClientConfig = field(default_factory=ParameterClientConfig)
    episodes_maxlen: int = 100_000
    """Approximate length cap of the episode-statistics stream."""


@dataclass(frozen=True)
class ReplaySection:
    """The on-policy FIFO (off-policy algorithms read the ``off_policy`` section)."""

    fifo: FIFOReplayConfig = field(default_factory=FIFOReplayConfig)


@dataclass(frozen=True)
class AgentConfig:
    """``fetch_every_steps``: vector steps between parameter version polls (each poll is one tiny
    round trip; the parameters are downloaded only when the version changed);
    ``fetch_every_episodes``: also poll after this many finished episodes (None: steps only). Both
    apply to free production only: agents producing on grants (``learner.on_policy_sync``) load new
    parameters when a claim says theirs are stale."""

    num_agents: int = 2
    inference: Literal["auto", "numpy", "torch"] = "auto"
    """What agents and evals run their policy network on. ``numpy``: no torch in the process (its
    import costs seconds of CPU and much memory, and its per-operator overhead dominates the small
    batches agents act on); PPO without an LSTM only. ``auto``: numpy for PPO networks without
    images or an LSTM, torch otherwise (it is faster on convolutions)."""
    fetch_every_steps: int = 64
    fetch_every_episodes: int | None = None
    nice: int = 0
    """Agents and evals lower their CPU priority by this much (``os.nice``, 0-19) when they start,
    so a learner sharing their cores keeps the CPU its updates need while they produce freely."""
    heartbeat_every_s: float = 2.0
    heartbeat_ttl_s: float = 30.0
    restart_on_crash: bool = True
    """``launch`` restarts a crashed agent (or eval) up to ``max_restarts`` times, with backoff."""
    max_restarts: int = 5

    def __post_init__(self) -> None:
        for name, least in (("num_agents", 0), ("fetch_every_steps", 1), ("max_restarts", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        if self.fetch_every_episodes is not None and self.fetch_every_episodes < 1:
            raise ValueError(f"fetch_every_episodes must be >= 1 or null, got {self.fetch_every_episodes}")
        if self.heartbeat_every_s <= 0 or self.heartbeat_ttl_s <= self.heartbeat_every_s:
            raise ValueError("need 0 < heartbeat_every_s < heartbeat_ttl_s")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"nice must be in 0..19, got {self.nice}")


@dataclass(frozen=True)
class LearnerConfig:
    """On-policy algorithms: ``steps_per_update`` env steps (all agents together) per update
    (off-policy ones: the ``off_policy`` section). Parameters are published every ``publish_every_updates`` updates (and at most once per
    ``hub.publisher.min_publish_interval`` seconds)."""

    steps_per_update: int = 1024
    publish_every_updates: int = 1
    prefetch_chunks: int = 64
    """Chunks decoded ahead of the training loop by the prefetch thread."""
    receive_batch: int = 64
    """Chunks per read from Redis."""
    gc_every_s: float = 5.0
    """Seconds between retention/gc passes (and reloads of the agents' insert script)."""
    metrics_every_s: float = 5.0
    """Seconds between MLflow metric flushes and learner status reports (0..3600; 0: after every
    update). A launch's liveness does not depend on it: the run's lease in Redis says a launch owns it."""
    torch_threads: int = 1
    """CPU threads for torch (small networks are fastest on one)."""
    max_restarts: int = 3
    """``launch`` restarts a crashed learner from its latest checkpoint up to this many times, with backoff."""
    on_policy_sync: Literal["lockstep", "overlap", "free"] = "lockstep"
    """On-policy algorithms only. ``lockstep``: the learner grants the env steps its next update needs,
    and agents claim each flush before producing it (:mod:`surreal_redis.hub.quota`): each batch is
    made with the parameters it is trained against (policy lag 0, nothing wasted); agents wait while
    the learner trains. ``overlap``: the same grants, one batch ahead: agents make the next batch
    while the learner trains on this one (policy lag 1, nothing wasted, up to twice the updates per
    second when making a batch takes as long as training on it). ``free``: agents step without pause
    and the learner drops what is too stale (``replay.fifo.max_policy_lag``): more steps per second,
    most of them wasted on a busy CPU."""
    lockstep_topup_s: float = 5.0
    """``lockstep``/``overlap``: when the learner still needs steps, the grant is used up and no chunk
    arrived for this many seconds (an agent claimed and died, or its chunks were lost), it grants the
    missing steps again; an agent still making a flush it claimed holds that back for six of these
    periods at most (:mod:`surreal_redis.learner.grants`)."""

    def __post_init__(self) -> None:
        if self.on_policy_sync not in ("lockstep", "overlap", "free"):
            raise ValueError(f"on_policy_sync must be 'lockstep', 'overlap' or 'free', got {self.on_policy_sync!r}")
        if not 0 <= self.metrics_every_s <= 3600:
            raise ValueError(f"metrics_every_s must be in 0..3600 seconds, got {self.metrics_every_s!r}")
        if not self.lockstep_topup_s > 0:
            raise ValueError(f"lockstep_topup_s must be > 0 seconds, got {self.lockstep_topup_s!r}")
        for name, least in (("steps_per_update", 1), ("publish_every_updates", 1), ("prefetch_chunks", 1),
                            ("receive_batch", 1), ("torch_threads", 1), ("max_restarts", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")


@dataclass(frozen=True)
class EvalConfig:
    enabled: bool = True
    """``launch`` runs one eval process."""
    mode: Literal["deterministic", "stochastic"] = "deterministic"
    episodes: int = 5
    """Episodes per eval of a parameter version; their mean is the score (best-k checkpoints)."""
    every_s: float = 10.0
    """Seconds between evals (an eval runs only for a new parameter version)."""
    every_updates: int | None = None
    """Also eval once the learner's published update count passed the last eval's by this many,
    if that comes before ``every_s`` (None: by seconds only)."""
    final_episodes: int = 10
    """``launch`` (with eval enabled) ends a run that stopped by its stop condition or
    ``surreal-redis stop`` (not Ctrl-C) by playing the final checkpoint for this many episodes; their
    mean is its score among the best-k checkpoints and in the summary. 0: no final eval."""
    final_max_s: float = 60.0
    """The final eval plays at most this many seconds; its score is the mean of the episodes finished by then."""

    def __post_init__(self) -> None:
        for name, least in (("episodes", 1), ("final_episodes", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        for name in ("every_s", "final_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.every_updates is not None and (isinstance(self.every_updates, bool) or self.every_updates < 1):
            raise ValueError(f"every_updates must be an integer >= 1 or null, got {self.every_updates!r}")


@dataclass(frozen=True)
class StopConfig:
    """The run stops at the first condition met: env steps, wall seconds, or a return reaching
    ``target_return``: with ``target_metric: train`` the mean of the last ``return_window``
    training episodes, with ``eval`` the mean of the latest complete eval (``eval.episodes``).
    The learner looks at a return target every 0.2 s and at the limits once a second."""

    max_env_steps: int | None = None
    max_seconds: float | None = None
    target_return: float | None = None
    target_metric: Literal["train", "eval"] = "train"
    return_window: int = 100

    def __post_init__(self) -> None:
        if self.return_window < 1:
            raise ValueError(f"return_window must be >= 1, got {self.return_window}")
        if self.max_env_steps is not None and self.max_env_steps < 1:
            raise ValueError(f"max_env_steps must be >= 1 or null, got {self.max_env_steps}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be > 0 or null, got {self.max_seconds}")


@dataclass(frozen=True)
class TrackingConfig:
    enabled: bool = True
    """The learner logs params, metrics and artifacts to MLflow."""
    tracking_uri: str | None = None
    """None: ``$MLFLOW_TRACKING_URI``, else SQLite in the experiment folder."""
    curve_window: int = 20
    """The train curve (``curve/train_return``, ``curves.png``) is the mean return of the last this
    many training episodes."""
    curve_every_env_steps: int = 1000
    """The train curve gets a point at the first training episode and then each time the finished
    training episodes' env steps pass another multiple of this."""

    def __post_init__(self) -> None:
        for name in ("curve_window", "curve_every_env_steps"):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")


# Keys that moved, and where to: an old config gets an error naming the new place.
MOVED_KEYS = {
    "replay.off_policy": "off_policy.replay",
    "replay.rate_limiter": "off_policy.rate_limiter",
    "learner.learning_starts": "off_policy.learning_starts",
    "learner.updates_per_step": "off_policy.updates_per_step",
    "ddpg.batch_size": "off_policy.batch_size",
    "ddpg.n_step": "off_policy.n_step",
    "ddpg.use_per": "off_policy.replay.selector (uniform | prioritized)",
}


@dataclass(frozen=True)
class ExperimentConfig:
    """The whole experiment; the section of algorithm ``algo`` is read from the YAML key of its name."""

    experiment: RunConfig = field(default_factory=RunConfig)
    plugins: tuple[str, ...] = ()
    """Modules imported before the config is read (by every process of the run); each registers
    algorithms with ``surreal_redis.algos.registry.register`` (see docs: Adding an algorithm)."""
    redis: RedisConfig = field(default_factory=RedisConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: str = "ppo"
    """The algorithm: ppo, ddpg, sac, appo, crossq, or one a plugin registers."""
    algo_config: Any = None
    """The algorithm's section (YAML key: the algorithm's name); None takes its defaults."""
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    hub: HubSection = field(default_factory=HubSection)
    replay: ReplaySection = field(default_factory=ReplaySection)
    agent: AgentConfig = field(default_factory=AgentConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        spec = self.algorithm
        if self.algo_config is None:
            object.__setattr__(self, "algo_config", spec.config_class())
        elif type(self.algo_config) is not spec.config_class:
            raise ValueError(f"algo {self.algo!r} takes a {spec.config_class.__name__} section, "
                             f"got {type(self.algo_config).__name__}")
        unsupported = spec.numpy_unsupported(self.algo_config)
        if self.agent.inference == "numpy" and unsupported:
            raise ValueError(f"agent.inference=numpy cannot run {unsupported}: use auto or torch")
        spec.check(self)  # the algorithm's rules across sections

        lag = self.replay.fifo.max_policy_lag
        skip = self.hub.params_client.min_version_lag
        if spec.on_policy and not self.lockstep and lag is not None and lag < skip:
            # an agent keeps producing with a version until it is `skip` behind: its chunks reach that lag
            raise ValueError(f"hub.params_client.min_version_lag {skip} needs replay.fifo.max_policy_lag >= {skip} "
                             f"in free production (chunks that old would all be dropped), got {lag}")

    @property
    def stale_round_advice(self) -> str | None:
        """A one-line warning when one flush of every agent (free on-policy production) spans more
        than half of ``replay.fifo.max_policy_lag`` updates, else None: agents that wait on the
        backlog are let go together and their flushes reach the learner as one block, whose last
        chunks are trained on that many updates after the agents' parameters (docs/benchmarks.md)."""
        lag = self.replay.fifo.max_policy_lag
        if self.lockstep or not self.algorithm.on_policy or lag is None:
            return None
        round_steps = self.agent.num_agents * self.env.num_envs * self.hub.sender.flush_steps
        updates = round_steps / self.learner.steps_per_update
        if updates <= lag / 2:
            return None
        return (f"one flush of every agent is {round_steps} env steps ({self.agent.num_agents} agents x {self.env.num_envs} "
                f"envs x {self.hub.sender.flush_steps} steps), {updates:g} updates of learner.steps_per_update "
                f"{self.learner.steps_per_update}: flushes sent together can lag past replay.fifo.max_policy_lag {lag} "
                f"and be dropped as too stale; raise learner.steps_per_update (more rows per minibatch on a GPU) or lower "
                f"hub.sender.flush_steps")

    @property
    def algorithm(self) -> AlgorithmSpec:
        """The declaration of the algorithm ``algo`` names."""
        try:
            return algorithm(self.algo)
        except UnknownAlgorithm as exc:
            raise ValueError(f"algo: {exc}") from None

    @property
    def run(self) -> str:
        return self.experiment.name

    @property
    def lockstep(self) -> bool:
        """Whether agents produce only what the learner grants: an on-policy algorithm with
        ``learner.on_policy_sync`` ``lockstep`` or ``overlap``. Off-policy runs never claim."""
        return self.learner.on_policy_sync != "free" and self.algorithm.on_policy

    @property
    def experiment_dir(self) -> Path:
        return Path(self.experiment.root) / self.experiment.name

    def with_overrides(self, overrides: list[str]) -> ExperimentConfig:
        return from_dict(ExperimentConfig, apply_overrides(to_dict(self), overrides))

    def to_yaml(self) -> str:
        return dump_yaml(to_dict(self), sort_keys=False)

    # configtools hooks: the algorithm's section lives under its own name, not under algo_config
    @classmethod
    def config_from_dict(cls, data: dict[str, Any], where: str = "") -> ExperimentConfig:
        data = dict(data)
        plugins = from_dict(_Plugins, {"plugins": data.get("plugins", ())}).plugins
        try:
            load_plugins(plugins)
        except ValueError as exc:
            raise ConfigError(f"plugins: {exc}") from None
        _refuse_moved_keys(data)
        name = data.pop("algo", "ppo")
        if "algo_config" in data:
            raise ConfigError(f"unknown config key 'algo_config' (the algorithm's section goes under its name, "
                              f"e.g. {name}:)")
        try:
            spec = algorithm(name) if isinstance(name, str) else None
        except UnknownAlgorithm as exc:
            raise ConfigError(f"algo: {exc}") from None
        if spec is None:
            raise ConfigError(f"algo: expected a string, got {name!r}")
        for other in algorithm_names():
            if other != spec.name and data.get(other) is not None:
                raise ConfigError(f"config section {other!r} is for algo {other}, but algo is {spec.name}: "
                                  f"remove it or set algo: {other}")
        data = {key: value for key, value in data.items() if key not in algorithm_names() or key == spec.name}
        section = from_dict(spec.config_class, data.pop(spec.name, None), spec.name)
        return build_dataclass(cls, {**data, "algo": spec.name, "algo_config": section}, where)

    def config_to_dict(self) -> dict[str, Any]:
        return {self.algo if f.name == "algo_config" else f.name: to_dict(getattr(self, f.name))
                for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class _Plugins:
    plugins: tuple[str, ...] = ()


def _refuse_moved_keys(data: dict[str, Any]) -> None:
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            raise ConfigError(f"config key {old!r} has moved to {new}")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Load a YAML config (None: all defaults) and apply ``a.b=c`` overrides.

    A bare name such as ``ppo_cartpole`` also finds the shipped ``configs/ppo_cartpole.yaml``.
    Raises :class:`ConfigError` naming the file, key or value at fault.
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = load_yaml(str(resolve_config_path(path)))
    return from_dict(ExperimentConfig, apply_overrides(data, list(overrides)))


def resolve_config_path(path: str | Path) -> Path:
    """``path`` if it is a file, else the shipped config of that name (``smoke`` is ``smoke.yaml``,
    also where the working folder holds a ``smoke/`` directory); ConfigError if neither."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    shipped = resource_dir("configs") / (candidate.name if candidate.suffix else f"{candidate.name}.yaml")
    if shipped.is_file():
        return shipped
    if candidate.exists():
        raise ConfigError(f"config file {str(path)!r} is a directory, not a YAML file (nor a shipped config's name)")
    raise ConfigError(f"config file {str(path)!r} does not exist (nor a shipped config of that name)")


__all__ = ["ConfigError", "ExperimentConfig", "load_config"]
